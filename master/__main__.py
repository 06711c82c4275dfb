"""``mooncake-py-master`` / ``python -m mooncake_py.master``: run a master until signalled."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from .config import ConfigError, parse_args
from .server import MasterServer


async def _serve(server: MasterServer) -> None:
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
    await stop.wait()
    await server.stop()


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
        asyncio.run(_serve(MasterServer(config)))
    except ConfigError as exc:
        print(f"mooncake-py-master: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"mooncake-py-master: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
