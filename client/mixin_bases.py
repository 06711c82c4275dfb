"""What the drop-in faces' mixins (ranged transfers, tasks, tensors, standalone mode) need of
the classes they are mixed into, for the type checker only.

Naming :class:`~mooncake_py.MooncakeDistributedStore` or
:class:`~mooncake_py.AsyncMooncakeStore` in the mixins would make an inheritance cycle once the
mixins are their bases, so each mixin derives from :data:`StoreBase` (sync) or
:data:`AsyncStoreBase` (asyncio): under a type checker, declarations of the attributes the
mixins use; at run time, plain ``object``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    import threading

    from .api import Client

    class StoreBase:
        """The drop-in store: its typed client (None before setup), lock and close."""

        client: Client | None
        _lock: threading.Lock

        def close(self) -> int: ...

    class AsyncStoreBase:
        """The asyncio store: the drop-in store it wraps and its worker-thread runner."""

        store: Any

        async def _run(self, call: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...

else:
    StoreBase = object
    AsyncStoreBase = object
