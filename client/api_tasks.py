"""The replica-task calls of the typed :class:`~mooncake_py.Client`: asking for a replica copy
or move, and following it (upstream's ``create_copy_task``, ``create_move_task``,
``query_task``). The work itself is done by the client that owns the source replica's segment
(:mod:`mooncake_py.client.task_worker`). Errors are the typed exceptions of
:mod:`mooncake_py.errors`; every call is thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_py.errors import raise_for
from mooncake_py.types import QueryTaskResponse, task_id_halves, task_id_text

from .api_queries import ClientPart, invalid_params


class TaskCalls(ClientPart):
    """The replica-task half of :class:`~mooncake_py.Client` (a base class of it)."""

    def create_copy_task(self, key: str, targets: Sequence[str]) -> tuple[int, int]:
        """Ask for ``key`` to be copied to the segments named ``targets`` (segment names,
        as :attr:`~mooncake_py.Client.hostname` gives them). The client owning a source
        replica copies it; :meth:`query_task` tells when it is done.

        Returns:
            The task id, as upstream: the UUID's ``(high, low)`` 64-bit halves.

        Raises:
            InvalidParamsError: no targets, an unknown target segment, a bad key.
            NotFoundError: no such key. BusyError: its first write is in flight.
            AlreadyExistsError-family codes: OBJECT_HAS_REPLICATION_TASK (a task runs).
            LimitExceededError: TASK_PENDING_LIMIT_EXCEEDED.
        """
        core = self._joined()
        names = _names(targets)
        code, task_id = core.master.create_copy_task(core.tenant, key, names)
        raise_for(code, key=key)
        return task_id_halves(task_id)

    def create_move_task(self, key: str, source: str, target: str) -> tuple[int, int]:
        """Ask for ``key``'s replica on segment ``source`` to move to segment ``target``.

        Returns:
            The task id's ``(high, low)`` halves.

        Raises:
            InvalidParamsError: ``source`` is ``target``, holds no replica of the key, or
                ``target`` is unknown. Otherwise as :meth:`create_copy_task`.
        """
        core = self._joined()
        if not isinstance(source, str) or not isinstance(target, str):
            raise invalid_params("source and target must be segment names")
        code, task_id = core.master.create_move_task(core.tenant, key, source, target)
        raise_for(code, key=key)
        return task_id_halves(task_id)

    def query_task(self, task_id: tuple[int, int]) -> QueryTaskResponse:
        """The state of a task of this tenant.

        Raises:
            InvalidParamsError: ``task_id`` is not two 64-bit unsigned ints.
            NotFoundError: TASK_NOT_FOUND (unknown, long finished, or another tenant's).
        """
        core = self._joined()
        try:
            text = task_id_text(task_id)
        except (TypeError, ValueError) as exc:
            raise invalid_params(f"a task id is two 64-bit unsigned ints: {exc}") from exc
        code, info = core.master.query_task(core.tenant, text)
        raise_for(code)
        assert info is not None
        return info


def _names(targets: Sequence[str]) -> list[str]:
    if isinstance(targets, str) or not all(isinstance(t, str) for t in targets):
        raise invalid_params("targets must be a list of segment names")
    return list(targets)
