"""``mooncake-py-master`` / ``python -m mooncake_py.master``: run a master until signalled."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from . import event_loop
from .config import ConfigError, parse_args
from .ha.log_store import LogStoreError
from .server import MasterServer

LOST_LEADERSHIP_EXIT = 3
"""Exit status of a master that stopped because it lost the leadership."""


async def _serve(server: MasterServer) -> int:
    server.on_standby = lambda: print(
        f"mooncake-py master standing by in cluster {server.config.cluster_id}", flush=True
    )
    port = await server.start()
    # Printed (and flushed) so scripts that pass --port 0 (or --metrics_port 0) can read the
    # chosen ports: "... listening on HOST:PORT", then " http on port N" when HTTP is served.
    line = f"mooncake-py master listening on {server.config.rpc_address}:{port}"
    if server.metrics_port:
        line += f" http on port {server.metrics_port}"
    print(line, flush=True)
    if server.fast_port:
        logging.getLogger(__name__).info("stream channel on port %d", server.fast_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    lost = loop.create_task(server.lost_leadership.wait())
    stopped = loop.create_task(stop.wait())
    await asyncio.wait((lost, stopped), return_when=asyncio.FIRST_COMPLETED)
    await server.stop()
    # A master that lost the leadership exits so that its supervisor restarts it as a standby.
    return LOST_LEADERSHIP_EXIT if server.lost_leadership.is_set() else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, start the master, serve until SIGINT/SIGTERM. Returns the exit status."""
    try:
        config = parse_args(argv)
    except ConfigError as exc:
        print(f"mooncake-py-master: invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        event_loop.loop_kind()  # a bad MOONCAKE_PY_EVENT_LOOP fails before anything is built
        return event_loop.run(_serve(MasterServer(config)))
    except ConfigError as exc:
        print(f"mooncake-py-master: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, LogStoreError, ValueError) as exc:
        print(f"mooncake-py-master: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
