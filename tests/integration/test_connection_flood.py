"""A connection flood against a master that requires tokens, and against a client's transfer
service, all real processes on 127.0.0.1.

While a real client keeps putting and getting (byte-exact, through the segment owner's transfer
service), the test opens at once:

(a) stream-channel connections that announce 255 MiB frames and try to send ~96 MiB each
    without authenticating;
(b) hundreds of idle stream-channel connections;
(c) hundreds of idle gRPC connections: raw TCP connects that never speak HTTP/2, and real
    gRPC channels that completed the handshake and make no call;
(d) hundreds of idle connections to the segment owner's transfer service.

It checks that the master's resident memory stays within ``RSS_BUDGET`` of its baseline and
the segment owner's anonymous memory within ``OWNER_RSS_BUDGET`` (its segment is shared
memory), that the master and the transfer service keep serving during and after the flood (on
a pooled connection, and on a new one dialed while the service is full of idle connections),
and that the transfer service's threads stay bounded (not one per connection). Memory and
threads are read from ``/proc/<pid>/status`` of the real processes, sampled all along.

Two more tests: every kind of idle connection is closed after ``--rpc_conn_timeout_seconds``,
and unauthenticated gRPC calls carrying huge messages stay within the memory budget.

``MOONCAKE_PY_FLOOD_SCALE`` multiplies the connection counts (1 by default).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from mooncake_py._wire.rpcs import SERVICE_NAME
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.client.transfer import MAX_CONNECTIONS
from mooncake_py.testing import MasterProcess, wait_until
from tests.conftest import client_config
from tests.integration.client_worker import value_for
from tests.integration.tcp_worker import TcpWorkerProcess

SCALE = float(os.environ.get("MOONCAKE_PY_FLOOD_SCALE", "1") or "1")
HUGE_FRAMES = 4
HUGE_FRAME_BYTES = 255 << 20  # what each of (a) announces
HUGE_SEND_BYTES = 96 << 20  # what each of (a) tries to send
IDLE_STREAM = int(700 * SCALE)
IDLE_GRPC_RAW = int(500 * SCALE)
IDLE_GRPC_CHANNELS = int(100 * SCALE)
IDLE_TRANSFER = int(600 * SCALE)
RSS_BUDGET = 64 << 20
OWNER_RSS_BUDGET = 32 << 20  # anonymous memory of the segment owner (its segment is shared)
TOKEN = "token-flood"
VALUE_BYTES = 64 << 10


def _status_field(pid: int, name: str) -> int:
    """A numeric field of ``/proc/<pid>/status`` (``VmRSS`` in bytes, ``Threads`` as is)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            value = int(line.split()[1])
            return value * 1024 if line.rstrip().endswith("kB") else value
    raise KeyError(name)


@dataclass
class Sampler:
    """Samples ``read()`` on a thread until stopped; keeps the peak."""

    read: Callable[[], int]
    peak: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self.peak = self.read()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(OSError, KeyError):
                self.peak = max(self.peak, self.read())
                self.samples += 1

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        return self.peak


@pytest.fixture(scope="module", autouse=True)
def enough_descriptors() -> None:
    """The flood needs a few thousand sockets in this process (and in the master, which
    inherits the limit)."""
    needed = HUGE_FRAMES + IDLE_STREAM + IDLE_GRPC_RAW + 2 * IDLE_GRPC_CHANNELS + IDLE_TRANSFER
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 512
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"needs {want} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


Setup = tuple[MasterProcess, int, list[TcpWorkerProcess]]


@contextlib.contextmanager
def _deployment(tmp_path: Path, master_args: Sequence[str] = ()) -> Iterator[Setup]:
    """A master requiring tokens, its stream port, and three clients forcing TCP: the segment
    owner, a writer and a reader (both contributing nothing)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({TOKEN: "tenant-flood"}))
    env = {"MOONCAKE_PY_FORCE_TCP": "1"}
    with MasterProcess(["--auth_tokens_file", str(tokens), *master_args]) as master:
        rpc = MasterClient(master.address, 5.0, False, TOKEN)
        fast_port = int(rpc.call("ServiceReady")[1])
        rpc.close()
        assert fast_port
        clients = [TcpWorkerProcess(env) for _ in range(3)]
        try:
            for client, segment in zip(clients, (128 << 20, 0, 0), strict=True):
                config = {**client_config(master.address, segment), "auth_token": TOKEN}
                assert client.call("setup", config=config, buffer_bytes=0) == 0
            yield master, fast_port, clients
        finally:
            for client in clients:
                client.stop()


@pytest.fixture
def flood_setup(tmp_path: Path) -> Iterator[Setup]:
    with _deployment(tmp_path) as setup:
        yield setup


def _expected(key: str) -> str:
    return hashlib.sha256(value_for(key, VALUE_BYTES)).hexdigest()


def _round_trip(writer: TcpWorkerProcess, key: str) -> None:
    """One put and one get through the master and the owner's transfer service, byte-exact."""
    assert writer.call("put", key=key, size=VALUE_BYTES) == 0
    assert writer.call("get_digest", key=key) == _expected(key)


def _huge_frame(port: int, sent: list[int]) -> None:
    """(a): announce a 255 MiB frame, then push up to 96 MiB until the master hangs up."""
    total = 0
    with contextlib.suppress(OSError):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        with sock:
            sock.sendall(struct.pack("<IIB", HUGE_FRAME_BYTES, 1, 8) + b"GetStats")
            chunk = b"\0" * (1 << 20)
            while total < HUGE_SEND_BYTES:
                total += sock.send(chunk)
    sent.append(total)


def _connect_many(port: int, count: int, timeout_s: float = 10.0) -> list[socket.socket]:
    """Up to ``count`` plain TCP connections (a refused or timed-out one is left out)."""
    opened = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            opened.append(socket.create_connection(("127.0.0.1", port), timeout=timeout_s))
    return opened


def _ready_channels(address: str, count: int) -> list[grpc.Channel]:
    """``count`` gRPC channels, each on a connection of its own, connected and idle."""
    channels = []
    for _ in range(count):
        channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        with contextlib.suppress(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=10)
        channels.append(channel)
    return channels


def _still_open(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the peer has not closed. Whatever the peer sent is read and
    dropped first (a gRPC server greets with its SETTINGS frame), so a close behind it shows."""
    alive = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            while sock.recv(65536):
                pass
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


def test_connection_flood_keeps_the_master_and_transfers_serving(
    flood_setup: Setup,
) -> None:
    master, fast_port, (owner, writer, reader) = flood_setup
    grpc_port = int(master.address.rsplit(":", 1)[1])
    transfer_port = int(owner.call("transfer_view")["port"])
    for i in range(20):  # warm up: first-call allocations belong to the baseline
        _round_trip(writer, f"warm-{i}")
    baseline_rss = _status_field(master.pid, "VmRSS")
    baseline_threads = _status_field(owner.pid, "Threads")
    owner_baseline_rss = _status_field(owner.pid, "RssAnon")  # its segment is shared memory
    rss = Sampler(lambda: _status_field(master.pid, "VmRSS")).start()
    owner_rss = Sampler(lambda: _status_field(owner.pid, "RssAnon")).start()
    threads = Sampler(lambda: _status_field(owner.pid, "Threads")).start()

    began = time.monotonic()
    sent: list[int] = []
    floods = [
        threading.Thread(target=_huge_frame, args=(fast_port, sent)) for _ in range(HUGE_FRAMES)
    ]
    for thread in floods:
        thread.start()
    opened: dict[str, list[socket.socket]] = {}
    openers = {
        "stream": lambda: _connect_many(fast_port, IDLE_STREAM),
        "grpc_raw": lambda: _connect_many(grpc_port, IDLE_GRPC_RAW),
        "transfer": lambda: _connect_many(transfer_port, IDLE_TRANSFER),
    }
    opener_threads = [
        threading.Thread(target=lambda n=name, f=fn: opened.__setitem__(n, f()))
        for name, fn in openers.items()
    ]
    for thread in opener_threads:
        thread.start()
    channels = _ready_channels(master.address, IDLE_GRPC_CHANNELS)
    served_during = 0
    while any(t.is_alive() for t in (*floods, *opener_threads)) or served_during < 5:
        _round_trip(writer, f"during-{served_during}")
        served_during += 1
    flood_s = time.monotonic() - began
    open_counts = {name: len(socks) for name, socks in opened.items()}
    alive_counts = {name: _still_open(socks) for name, socks in opened.items()}
    for i in range(5):  # the flood is still connected
        _round_trip(writer, f"held-{i}")
    # The reader's first transfer dials the owner while its service is full of idle
    # connections: it waits in the backlog until an idle one is closed to make room.
    served_before = owner.call("transfer_view")["served"][0]
    assert reader.call("get_digest", key="held-4") == _expected("held-4")
    assert owner.call("transfer_view")["served"][0] == served_before + 1
    peak_rss_flood = rss.peak
    peak_threads = threads.peak

    for socks in opened.values():
        for sock in socks:
            sock.close()
    for channel in channels:
        channel.close()
    for i in range(5):
        _round_trip(writer, f"after-{i}")
    peak_rss = rss.stop()
    threads.stop()
    owner_peak_rss = owner_rss.stop()
    after_threads = _status_field(owner.pid, "Threads")
    report = {
        "baseline_rss_mib": round(baseline_rss / 2**20, 1),
        "peak_rss_mib": round(peak_rss / 2**20, 1),
        "peak_rss_during_flood_mib": round(peak_rss_flood / 2**20, 1),
        "rss_samples": rss.samples,
        "huge_frame_bytes_accepted": sent,
        "opened": open_counts,
        "still_open_after_flood": alive_counts,
        "grpc_channels": len(channels),
        "owner_threads": [baseline_threads, peak_threads, after_threads],
        "owner_rss_anon_mib": [
            round(owner_baseline_rss / 2**20, 1),
            round(owner_peak_rss / 2**20, 1),
        ],
        "round_trips_during_flood": served_during,
        "flood_s": round(flood_s, 2),
    }
    print("flood:", json.dumps(report))

    assert len(sent) == HUGE_FRAMES
    # The master hung up on every huge frame long before its body could be buffered.
    assert all(n < HUGE_SEND_BYTES for n in sent), sent
    assert open_counts["stream"] == IDLE_STREAM and open_counts["grpc_raw"] == IDLE_GRPC_RAW
    assert peak_rss - baseline_rss <= RSS_BUDGET, report
    # Idle connections cost the transfer service a thread and a socket, no buffers.
    assert owner_peak_rss - owner_baseline_rss <= OWNER_RSS_BUDGET, report
    # One thread per served connection, at most MAX_CONNECTIONS of them, plus the accept thread.
    assert peak_threads - baseline_threads <= MAX_CONNECTIONS + 1, report
    wait_until(
        lambda: _status_field(owner.pid, "Threads") <= baseline_threads + 1,
        10,
        what="the transfer service's flood threads end",
    )


def _unauthenticated_huge_call(address: str, codes: list[grpc.StatusCode]) -> None:
    """One unary call carrying HUGE_SEND_BYTES, without a token."""
    channel = grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_send_message_length", 2 * HUGE_SEND_BYTES),
            ("grpc.use_local_subchannel_pool", 1),
        ],
    )
    call = channel.unary_unary(f"/{SERVICE_NAME}/GetStats")
    try:
        call(b"\0" * HUGE_SEND_BYTES, timeout=60)
        codes.append(grpc.StatusCode.OK)
    except grpc.RpcError as exc:
        codes.append(exc.code())
    finally:
        channel.close()


def test_unauthenticated_huge_grpc_calls_stay_within_the_memory_budget(
    flood_setup: Setup,
) -> None:
    """Four 96 MiB gRPC calls without a token are refused before their request is read: when
    gRPC received a whole request before the token was checked, they took the master from
    ~86 MiB to a peak of 659-889 MiB resident, and 596-686 MiB stayed resident afterwards."""
    master, _, (_, writer, _) = flood_setup
    for i in range(20):
        _round_trip(writer, f"warm-{i}")
    baseline_rss = _status_field(master.pid, "VmRSS")
    rss = Sampler(lambda: _status_field(master.pid, "VmRSS")).start()
    codes: list[grpc.StatusCode] = []
    callers = [
        threading.Thread(target=_unauthenticated_huge_call, args=(master.address, codes))
        for _ in range(HUGE_FRAMES)
    ]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(90)
    for i in range(5):
        _round_trip(writer, f"after-{i}")
    peak_rss = rss.stop()
    after_rss = _status_field(master.pid, "VmRSS")
    print(
        "huge gRPC calls:",
        json.dumps(
            {
                "baseline_rss_mib": round(baseline_rss / 2**20, 1),
                "peak_rss_mib": round(peak_rss / 2**20, 1),
                "after_rss_mib": round(after_rss / 2**20, 1),
                "codes": [code.name for code in codes],
            }
        ),
    )
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * HUGE_FRAMES
    assert peak_rss - baseline_rss <= RSS_BUDGET


def _master_sockets(pid: int) -> int:
    """Sockets the process holds open (listeners included)."""
    fds = Path(f"/proc/{pid}/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


IDLE_TIMEOUT_S = 1


def test_idle_connections_of_every_kind_are_closed_after_the_idle_timeout(
    tmp_path: Path,
) -> None:
    """With ``--rpc_conn_timeout_seconds 1``: raw TCP connects to the gRPC port, gRPC channels
    that completed the handshake, and unauthenticated stream connections all go; a real
    client whose own connections went idle meanwhile keeps working."""
    args = ["--rpc_conn_timeout_seconds", str(IDLE_TIMEOUT_S)]
    with _deployment(tmp_path, args) as (master, fast_port, (_, writer, _)):
        _round_trip(writer, "before")
        grpc_port = int(master.address.rsplit(":", 1)[1])
        baseline = _master_sockets(master.pid)
        idle = [*_connect_many(grpc_port, 50), *_connect_many(fast_port, 50)]
        channels = _ready_channels(master.address, 50)
        began = time.monotonic()
        wait_until(
            lambda: _master_sockets(master.pid) >= baseline + 150, 10, what="the master holds all"
        )
        wait_until(
            lambda: _master_sockets(master.pid) <= baseline,
            10 * IDLE_TIMEOUT_S + 5,
            what="the master closes every idle connection",
        )
        closed_s = time.monotonic() - began
        print(f"idle connections closed within {closed_s:.1f} s ({IDLE_TIMEOUT_S} s timeout)")
        assert _still_open(idle) == 0
        _round_trip(writer, "after")  # its stream and gRPC connections were idle too
        for channel in channels:
            channel.close()
        for sock in idle:
            sock.close()
