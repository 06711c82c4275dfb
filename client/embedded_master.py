"""The master a store starts inside its own process for ``setup(..., enable_standalone=True)``.

As upstream's standalone mode (``RealClient::StartStandaloneMaster`` over ``EmbeddedMaster``):
the master listens on 127.0.0.1 only, on the port of the requested master address when that
address names one, else on a free port; its admin/metrics HTTP listener takes a free port on
127.0.0.1 too. The store then joins it at ``127.0.0.1:<port>``, so other clients on the same
host may join that address; nothing is reachable from other hosts. A store set up with an
``auth_token`` starts its master requiring that token (for the store's tenant), so local
processes without it get nothing from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from mooncake_py.errors import ErrorCode, InternalError
from mooncake_py.units import ConfigError

if TYPE_CHECKING:
    from mooncake_py.master.server import MasterServer

START_TIMEOUT_S = 30.0
"""Longest :meth:`EmbeddedMaster.start` waits for the master to bind."""


def requested_port(master_server_addr: str) -> int:
    """The port named by ``master_server_addr`` (``host:port``), or 0 when it names none.

    Upstream binds the embedded master to that port and ignores the host part.
    """
    _, sep, port = master_server_addr.rpartition(":")
    return int(port) if sep and port.isdigit() else 0


def _lease_ttl_override() -> dict[str, Any]:
    # Upstream's embedded master reads DEFAULT_KV_LEASE_TTL (ms) when it is a plain integer,
    # so tests that shorten leases through it keep working.
    raw = os.environ.get("DEFAULT_KV_LEASE_TTL", "").strip()
    return {"default_kv_lease_ttl": int(raw)} if raw.isdigit() and int(raw) > 0 else {}


class EmbeddedMaster:
    """A real master (:class:`MasterServer`) on its own event loop in a daemon thread.

    Thread-safety: :meth:`start` and :meth:`stop` are called by the one store that owns it,
    under that store's setup lock.
    """

    def __init__(self) -> None:
        self.address = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: MasterServer | None = None

    def start(self, port: int = 0, tokens: Mapping[str, str] | None = None) -> str:
        """Serve on ``127.0.0.1:port`` (0: a free port); returns the address to join.

        Args:
            tokens: token -> tenant the master requires (None or empty: no tokens).

        Raises:
            InternalError: INTERNAL_ERROR, as upstream, when the master cannot start (for
                instance the port is taken); nothing is left running.
        """
        # Imported here: the master imports mooncake_py, whose import loads this client.
        from mooncake_py.master import event_loop
        from mooncake_py.master.config import MasterConfig
        from mooncake_py.master.server import MasterServer

        tokens_file = _tokens_file(tokens) if tokens else ""
        try:
            config = MasterConfig(
                rpc_address="127.0.0.1",
                port=port,
                metrics_port=0,
                auth_tokens_file=tokens_file,
                **_lease_ttl_override(),
            )
        except ConfigError as exc:
            _unlink(tokens_file)
            raise InternalError(ErrorCode.INTERNAL_ERROR, f"embedded master: {exc}") from exc
        loop = event_loop.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="mooncake-embedded-master")
        thread.daemon = True  # a store never closed must not keep the process alive
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._server = MasterServer(config)
            future: Future[int] = asyncio.run_coroutine_threadsafe(self._server.start(), loop)
            bound = future.result(timeout=START_TIMEOUT_S)
        except Exception as exc:
            self.stop()
            raise InternalError(
                ErrorCode.INTERNAL_ERROR, f"cannot start the embedded master: {exc}"
            ) from exc
        finally:
            _unlink(tokens_file)  # read at startup; nobody else should see it
        self.address = f"127.0.0.1:{bound}"
        return self.address

    def stop(self) -> None:
        """Stop serving and end the thread; its objects and segments are gone. Idempotent."""
        loop, self._loop = self._loop, None
        thread, self._thread = self._thread, None
        server, self._server = self._server, None
        if loop is None:
            return
        if server is not None and loop.is_running():
            # A half-started server may fail to stop; the loop and thread still end below.
            with contextlib.suppress(Exception):
                stopping = asyncio.run_coroutine_threadsafe(server.stop(0), loop)
                stopping.result(timeout=START_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=START_TIMEOUT_S)
        loop.close()
        self.address = ""


def _tokens_file(tokens: Mapping[str, str]) -> str:
    """A private (0600) JSON file of ``tokens`` for the master to read at startup."""
    fd, path = tempfile.mkstemp(prefix="mooncake_py-tokens-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(dict(tokens), handle)
    return path


def _unlink(path: str) -> None:
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
