"""A client process that calls the master in a loop and records how long each call took.

``python -m tests.integration.prober_worker ADDRESS STOP_FILE OUT_FILE TRANSPORT``: calls
``ExistKey`` (over TRANSPORT: ``stream`` or ``grpc``) until ``STOP_FILE`` exists, prints
``ready`` once warmed up, then writes ``[[start, seconds], ...]`` to ``OUT_FILE`` as JSON,
with ``start`` on ``time.monotonic()`` (the system-wide monotonic clock, comparable between
processes).
"""

from __future__ import annotations

import json
import os
import sys
import time

from mooncake_py.client.master_rpc import MasterClient

WARM_UP_CALLS = 50


def main(address: str, stop_file: str, out_file: str, transport: str) -> None:
    client = MasterClient(address, timeout_s=30.0)
    if transport == "stream" and not client.connect_stream():
        raise SystemExit("no stream channel")
    calls: list[tuple[float, float]] = []
    try:
        while not os.path.exists(stop_file):
            began = time.monotonic()
            code = client.exist_key("", "probe/absent", "prober")
            calls.append((began, time.monotonic() - began))
            if code != 0:
                raise SystemExit(f"ExistKey answered {code}")
            if len(calls) == WARM_UP_CALLS:
                print("ready", flush=True)
    finally:
        client.close()
    with open(out_file, "w") as out:
        json.dump(calls, out)


if __name__ == "__main__":
    main(*sys.argv[1:5])
