"""``mooncake.mooncake_config``: mooncake-py's :class:`~mooncake_py.mooncake_config.MooncakeConfig`
under upstream's module path."""

from mooncake_py.mooncake_config import *  # noqa: F403
from mooncake_py.mooncake_config import __all__ as _public_names

__all__ = list(_public_names)
