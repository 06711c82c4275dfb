"""``mooncake-py-segment-host``: contribute memory to a mooncake-py store and serve it until
stopped.

Reads the client configuration the usual way (``MOONCAKE_CONFIG_PATH``, or ``MOONCAKE_MASTER``,
``MOONCAKE_GLOBAL_SEGMENT_SIZE``, ``MOONCAKE_LOCAL_HOSTNAME``, ...), mounts its segment and keeps
serving other clients' reads and writes until SIGINT or SIGTERM, then unmounts cleanly.
Deployments run it next to engines that contribute no memory of their own (see deploy/).
"""

from __future__ import annotations

import signal
import sys
import threading

from mooncake_py.errors import MooncakeError

from .api import Client


def main() -> int:
    """Join, serve until signalled, leave. Returns the exit status (1: joining failed)."""
    try:
        client = Client()
    except MooncakeError as exc:
        print(f"segment host: joining the store failed: {exc}", file=sys.stderr)
        return 1
    print(f"segment host {client.hostname} serving", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if not client.master_reachable:
            print("segment host: master unreachable, retrying", file=sys.stderr, flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
