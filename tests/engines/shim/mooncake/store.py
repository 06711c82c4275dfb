"""``mooncake.store``: mooncake-py's drop-in names under upstream's module path.

Every public name of :mod:`mooncake_py` is re-exported, so whatever an engine imports from
``mooncake.store`` resolves when mooncake-py has it, and fails with ImportError (as against an
older upstream build) when it does not, e.g. ``MooncakeHostMemAllocator``.
"""

from mooncake_py import *  # noqa: F403
from mooncake_py import __all__ as _public_names

__all__ = list(_public_names)
