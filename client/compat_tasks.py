"""Replica copy and move tasks on the drop-in faces, with upstream's tuple returns:
``create_copy_task(key, targets) -> (task_id, code)``, ``create_move_task(key, source, target)
-> (task_id, code)`` (``task_id`` the UUID's ``(high, low)`` halves, ``(0, 0)`` on error) and
``query_task(task_id) -> (QueryTaskResponse | None, code)``. Nothing raises for bad input.

:class:`TaskTransfers` is a base of :class:`~mooncake_py.MooncakeDistributedStore`,
:class:`AsyncTaskTransfers` of :class:`~mooncake_py.AsyncMooncakeStore`.

Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from mooncake_py.errors import ErrorCode, MooncakeError
from mooncake_py.types import QueryTaskResponse

from .mixin_bases import AsyncStoreBase, StoreBase

if TYPE_CHECKING:
    from .api import Client

NO_TASK = (0, 0)
INVALID = int(ErrorCode.INVALID_PARAMS)


class TaskTransfers(StoreBase):
    """Upstream's task calls over the typed client (``self.client``)."""

    def create_copy_task(self, key: str, targets: Sequence[str]) -> tuple[tuple[int, int], int]:
        """Copy ``key`` to the segments named ``targets``; ``(task id, 0)`` or
        ``((0, 0), negative code)``. See :meth:`~mooncake_py.Client.create_copy_task`."""
        return self._task(lambda c: c.create_copy_task(key, targets))

    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]:
        """Move ``key``'s replica from segment ``source`` to ``target``; as
        :meth:`create_copy_task`."""
        return self._task(lambda c: c.create_move_task(key, source, target))

    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        """``(state, 0)`` or ``(None, negative code)`` (TASK_NOT_FOUND -1400)."""
        client = self.client
        if client is None:
            return None, INVALID
        try:
            return client.query_task(task_id), 0
        except MooncakeError as exc:
            return None, exc.code

    def _task(self, call: Callable[[Client], tuple[int, int]]) -> tuple[tuple[int, int], int]:
        client = self.client
        if client is None:
            return NO_TASK, INVALID
        try:
            return call(client), 0
        except MooncakeError as exc:
            return NO_TASK, exc.code


class AsyncTaskTransfers(AsyncStoreBase):
    """The calls of :class:`TaskTransfers` as coroutines; ``store`` must have it as a base."""

    def _task_store(self) -> TaskTransfers:
        return cast(TaskTransfers, self.store)

    async def create_copy_task(
        self, key: str, targets: Sequence[str]
    ) -> tuple[tuple[int, int], int]:
        """Coroutine of :meth:`TaskTransfers.create_copy_task`."""
        return await self._run(self._task_store().create_copy_task, key, targets)

    async def create_move_task(
        self, key: str, source: str, target: str
    ) -> tuple[tuple[int, int], int]:
        """Coroutine of :meth:`TaskTransfers.create_move_task`."""
        return await self._run(self._task_store().create_move_task, key, source, target)

    async def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]:
        """Coroutine of :meth:`TaskTransfers.query_task`."""
        return await self._run(self._task_store().query_task, task_id)
