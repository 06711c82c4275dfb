"""Bytes written by one client process are read by another: shared memory and forced TCP."""

from __future__ import annotations

from pathlib import Path

import pytest

from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster, MasterProcess, wait_until
from tests.conftest import ClientProcess, client_config
from tests.integration.tcp_worker import shared_memory_maps

SEGMENT = 64 << 20


def _files_in_dev_shm_of(*pids: int) -> list[str]:
    """Files in /dev/shm named after these processes (segments once were) or mapped by the
    living ones. Segments are memfds: there must never be any."""
    named = [p.name for pid in pids for p in Path("/dev/shm").glob(f"*-{pid}-*")]
    mapped = []
    for pid in pids:
        if Path(f"/proc/{pid}").exists():
            mapped += [m for m in shared_memory_maps(pid) if m.startswith("dev/shm/")]
    return named + mapped


@pytest.mark.parametrize("force_tcp", ["0", "1"], ids=["shm", "tcp"])
def test_put_in_one_process_get_in_another(
    master_process: MasterProcess, client_processes: list[ClientProcess], force_tcp: str
) -> None:
    env = {"MOONCAKE_PY_FORCE_TCP": force_tcp}
    owner, reader = ClientProcess(env), ClientProcess(env)
    client_processes += [owner, reader]
    assert owner.call("setup", config=client_config(master_process.address, SEGMENT)) == 0
    assert reader.call("setup", config=client_config(master_process.address, 0)) == 0

    sizes = {"small": 1, "page": 4096 + 3, "mib": 1 << 20, "big": 5 << 20}
    for name, size in sizes.items():
        assert owner.call("put", key=name, size=size) == 0
    for name, size in sizes.items():
        expected = owner.call("expected_digest", key=name, size=size)
        assert reader.call("get_digest", key=name) == expected, name

    # Zero-copy both ways: the reader (no segment) writes into the owner's segment.
    keys = [f"zc-{i}" for i in range(8)]
    assert reader.call("put_from", keys=keys, size=256 << 10) == [0] * 8
    expected = [reader.call("expected_digest", key=k, size=256 << 10) for k in keys]
    assert owner.call("get_into_digests", keys=keys, size=256 << 10) == expected
    assert reader.call("get_into_digests", keys=keys, size=256 << 10) == expected
    assert reader.call("get_into_digests", keys=["absent"], size=16) == [-704]


def test_two_replicas_survive_kill_of_one_owner(
    client_processes: list[ClientProcess], fake_clock: FakeClock
) -> None:
    # The master's time moves only when the test says so and the test runs the client reaper:
    # the dead owner is expired by the same TTL rule as with the timers, without waiting a TTL.
    with InProcessMaster(clock=fake_clock, background=False) as master:
        first, second, reader = (
            ClientProcess(),
            ClientProcess(),
            ClientProcess({"MOONCAKE_PY_FORCE_TCP": "1"}),
        )
        client_processes += [first, second, reader]
        for client, size in ((first, SEGMENT), (second, SEGMENT), (reader, 0)):
            assert client.call("setup", config=client_config(master.address, size)) == 0
        keys = [f"r2-{i}" for i in range(6)]
        assert reader.call("put_from", keys=keys, size=300_000, replica_num=2) == [0] * 6
        for key in keys:
            replicas = master.service.object_of("default", key).replicas  # type: ignore[union-attr]
            assert len({r.segment_id for r in replicas}) == 2
        expected = [reader.call("expected_digest", key=k, size=300_000) for k in keys]
        owner_of = {info.name: owner for info, owner, _, _ in master.service.segment_usage()}
        living, dead = owner_of[first.call("hostname")], owner_of[second.call("hostname")]

        second.kill()
        # Before the master notices: the reader falls back from the dead peer to the live one.
        assert reader.call("get_into_digests", keys=keys, size=300_000) == expected
        fake_clock.advance(master.config.client_ttl)
        master.service.ping(living)  # the living owner's heartbeat; the dead one stays silent
        reaped = master.service.reap_expired_clients(fake_clock())
        assert dead in reaped and living not in reaped  # (the segment-less reader may expire)
        assert master.service.stats()["segments"] == 1
        for key in keys:
            assert len(master.service.object_of("default", key).replicas) == 1  # type: ignore[union-attr]
        assert reader.call("get_into_digests", keys=keys, size=300_000) == expected
        master.service.check()


def test_client_death_drops_its_segment_and_objects(client_processes: list[ClientProcess]) -> None:
    with InProcessMaster(client_ttl=1.0) as master:
        doomed, survivor = ClientProcess(), ClientProcess()
        client_processes += [doomed, survivor]
        assert doomed.call("setup", config=client_config(master.address, 8 << 20)) == 0
        assert survivor.call("setup", config=client_config(master.address, 0)) == 0
        keys = [f"d-{i}" for i in range(7)]
        assert survivor.call("put_from", keys=keys, size=1 << 20) == [0] * 7
        assert master.service.stats()["allocated_bytes"] >= 7 << 20

        # The segment is a memfd: mapped, but named nowhere in the file system.
        (segment,) = [m for m in shared_memory_maps(doomed.pid) if m.startswith("memfd:")]
        assert segment.startswith("memfd:mooncake_py/")
        assert _files_in_dev_shm_of(doomed.pid) == []

        doomed.kill()
        assert _files_in_dev_shm_of(doomed.pid) == []  # SIGKILL left nothing to clean up
        # The master's own timers notice: client_ttl, then the next once-a-second reaper tick.
        wait_until(lambda: master.service.stats()["segments"] == 0, what="the segment is gone")
        # Withdrawn at once: no reader is sent there while its objects drain, in slices.
        assert survivor.call("get_into_digests", keys=keys[:1], size=1 << 20) == [-704]
        wait_until(lambda: master.service.stats()["objects"] == 0, what="its objects are gone")

        # A new owner gets the whole capacity: nothing of the dead client is still charged.
        replacement = ClientProcess()
        client_processes.append(replacement)
        assert replacement.call("setup", config=client_config(master.address, 8 << 20)) == 0
        assert _files_in_dev_shm_of(doomed.pid, replacement.pid) == []
        again = [f"again-{i}" for i in range(7)]
        assert survivor.call("put_from", keys=again, size=1 << 20) == [0] * 7
        master.service.check()
