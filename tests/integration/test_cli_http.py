"""The ``mooncake-py`` CLI over gRPC and over the HTTP memory API (``--http``) alike.

A real master runs in this process on a :class:`FakeClock` (so idle times and ages are
fixed figures) with its HTTP port open; a real client process
(:mod:`tests.integration.session_writer_worker`) writes tagged objects. Every command runs
twice through the CLI's ``main()``: with ``--master`` (gRPC) and with ``--http``; stdout,
stderr and exit code must match (stderr up to the address each names, and session times,
which the API gives in whole seconds, within a second).

Destructive commands run in twin tenants filled alike: the gRPC run releases one twin's
sessions, the HTTP run the other's. Tokens and TLS: :mod:`.test_cli_http_security`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from mooncake_py.cli.http_backend import HttpMemoryBackend, HttpTarget
from mooncake_py.client.api import Client
from mooncake_py.client.config import ClientConfig
from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster
from tests.integration.cli_twins import (
    SEGMENT_BYTES,
    Twins,
    WriterProcess,
    free_port,
    run_cli,
    segments_match,
    without_times,
)


@pytest.fixture(scope="module")
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="module")
def master(clock: FakeClock) -> Iterator[InProcessMaster]:
    with InProcessMaster(clock=clock, background=False, enable_multi_tenants=True) as running:
        yield running


@pytest.fixture(scope="module")
def writer() -> Iterator[WriterProcess]:
    process = WriterProcess()
    yield process
    process.stop()


@pytest.fixture
def twins(
    request: pytest.FixtureRequest, master: InProcessMaster, clock: FakeClock, writer: WriterProcess
) -> Twins:
    """Twin tenants of this test, filled alike (:func:`_fill`)."""
    name = request.node.name.replace("[", "-").replace("]", "")
    # The master's bound HTTP port (InProcessMaster does not publish it).
    url = f"http://127.0.0.1:{master.metrics_port}"
    pair = Twins(master.address, url, f"{name}-g", f"{name}-h")
    for tenant in (pair.grpc_tenant, pair.http_tenant):
        config = {"master_server_address": master.address, "global_segment_size": SEGMENT_BYTES}
        assert writer.call("join", tenant=tenant, config=config) == 0
    _fill(writer, clock, (pair.grpc_tenant, pair.http_tenant))
    return pair


def _fill(writer: WriterProcess, clock: FakeClock, tenants: tuple[str, ...]) -> None:
    """The same sessions in each tenant, written at the same (fake) times.

    ``old`` (3 members, one shared with ``mid``) is 6 s idle, ``mid`` (2) 3 s, ``pinned`` (1,
    pinned) 1 s; ``weights`` is a WEIGHT object in no session.
    """

    def each(op: str, **kwargs: Any) -> None:
        for tenant in tenants:
            assert writer.call(op, tenant=tenant, **kwargs) in (0, None)

    each("put_tagged", key="old-1", size=4096, sessions=["old"])
    each("put_tagged", key="old-2", size=4096, sessions=["old"])
    each("put_tagged", key="shared", size=8192, sessions=["old", "mid"])
    clock.advance(3)
    each("put_tagged", key="mid-1", size=16384, sessions=["mid"])
    clock.advance(2)
    each("put_tagged", key="pinned-1", size=2048, sessions=["pinned"])
    each("pin", session="pinned")
    each("put_typed", key="weights", size=1000, data_type="WEIGHT")
    clock.advance(1)


# -- listings ----------------------------------------------------------------------------------


def test_session_listings_match(twins: Twins) -> None:
    listed = twins.same("sessions", "ls", twin=False)
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].split()[:3] == [
        "SESSION",
        "PINNED",
        "MEMBERS",
    ]
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["mid", "old", "pinned"]
    rows = twins.same_json("sessions", "ls", twin=False)
    assert {r["session_id"]: (r["member_count"], r["idle_ms"]) for r in rows} == {
        "old": (3, 6000),
        "mid": (2, 3000),
        "pinned": (1, 1000),
    }
    assert twins.same("sessions", "ls", "--pinned", twin=False).stdout.count("\n") == 2
    assert twins.same("sessions", "ls", "--unpinned", twin=False).stdout.count("\n") == 3
    idle = twins.same_json("sessions", "ls", "--idle-over", "3s", twin=False)
    assert sorted(r["session_id"] for r in idle) == ["mid", "old"]
    top = twins.same("sessions", "ls", "--sort", "bytes", "--top", "2", twin=False)
    assert "showing 2 of 3 sessions" in top.stderr
    twins.same("sessions", "ls", "--sort", "idle", twin=False)


def test_session_listing_as_csv_matches(twins: Twins) -> None:
    grpc, http = twins.run("sessions", "ls", "--format", "csv", twin=False)
    assert (grpc.returncode, http.returncode) == (0, 0)
    expected = list(csv.DictReader(io.StringIO(grpc.stdout)))
    got = list(csv.DictReader(io.StringIO(http.stdout)))
    assert [r["session_id"] for r in expected] == ["mid", "old", "pinned"]
    assert without_times(got) == without_times(expected)
    assert grpc.stdout.splitlines()[0] == http.stdout.splitlines()[0]


def test_session_show_matches(twins: Twins) -> None:
    grpc, http = twins.run("sessions", "show", "old", twin=False)
    assert (grpc.returncode, http.returncode) == (0, 0)

    def fixed(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith(("Created", "Last"))]

    assert fixed(http.stdout) == fixed(grpc.stdout)
    assert "Members:      3" in grpc.stdout and "Shared:       8.0 KiB" in grpc.stdout
    shown = twins.same_json("sessions", "show", "mid", twin=False)
    # "mid" began with the shared write, 3 s before its own: 3 s idle, 6 s old.
    assert (shown["member_count"], shown["shared_bytes"], shown["idle_ms"]) == (2, 8192, 3000)
    assert shown["age_ms"] == 6000


def test_dry_run_of_stale_release_matches(twins: Twins) -> None:
    dry = twins.same("sessions", "release-stale", "--idle-over", "2s", "--dry-run", twin=False)
    assert [line.split()[0] for line in dry.stdout.splitlines()[1:]] == ["old", "mid"]
    assert "would release 2 unpinned session(s)" in dry.stderr
    dry_all = twins.same(
        "sessions", "release-stale", "--idle-over", "0s", "--include-pinned", "--dry-run"
    )
    assert "would release 3 session(s)" in dry_all.stderr


def test_unknown_session_fails_alike(twins: Twins) -> None:
    shown = twins.same("sessions", "show", "no-such-session", twin=False)
    assert shown.returncode == 4 and "session 'no-such-session' not found" in shown.stderr
    released = twins.same("sessions", "release", "no-such-session", "--yes")
    assert released.returncode == 4 and not released.stdout


# -- releases ----------------------------------------------------------------------------------


def test_releases_match(twins: Twins, writer: WriterProcess) -> None:
    one = twins.same("sessions", "release", "old", "--yes")
    assert one.stdout == (
        "released session 'old': 1 session(s), 2 object(s) removed, 8.0 KiB freed; kept 1 shared\n"
    )
    twins.same("sessions", "ls")
    stale = twins.same_json("sessions", "release-stale", "--idle-over", "2s", "--yes")
    assert (stale["sessions"], stale["released_objects"], stale["freed_bytes"]) == (1, 2, 24576)
    twins.same("sessions", "ls")
    cache = twins.same_json("release-kv-cache", "--yes")
    assert (cache["released_objects"], cache["kept_pinned"]) == (0, 1)
    everything = twins.same("sessions", "release-all", "--yes")
    assert everything.stdout.startswith("released all sessions: 1 session(s), 1 object(s)")
    emptied = twins.same("sessions", "ls")
    assert emptied.stderr == "no sessions\n"
    for tenant in (twins.grpc_tenant, twins.http_tenant):
        assert writer.call("exist", tenant=tenant, keys=["old-1", "pinned-1", "weights"]) == [
            0,
            0,
            1,
        ]


def test_kv_cache_release_with_pinned_matches(twins: Twins) -> None:
    cache = twins.same("release-kv-cache", "--include-pinned", "--yes")
    assert cache.stdout.startswith("released the KV cache: 0 session(s), 5 object(s) removed")
    assert twins.same("sessions", "ls", "--json").stdout == "[]\n"  # each lost its last member


def test_unconfirmed_releases_are_refused_alike(twins: Twins) -> None:
    for args in (
        ("sessions", "release-all"),
        ("sessions", "release", "old"),
        ("sessions", "release-stale", "--idle-over", "1s"),
        ("release-kv-cache",),
    ):
        refused = twins.same(*args)
        assert refused.returncode == 1 and "not confirmed" in refused.stderr
    assert twins.same_json("sessions", "ls")[1]["member_count"] == 3  # nothing went


# -- the store ---------------------------------------------------------------------------------


def test_segments_and_stats_match(twins: Twins) -> None:
    segments_match(*twins.run("segments", "ls", twin=False))
    segments_match(*twins.run("segments", "ls", "--json", twin=False))
    # A master without tokens answers the global view (the tokens test covers a tenant's).
    stats = twins.same("stats", twin=False)
    assert "sessions:" in stats.stdout and "tenant_view" not in stats.stdout
    figures = twins.same_json("stats", "--own", twin=False)
    assert figures["sessions"] >= 6 and figures["allocated_bytes"] > 0


# -- what the API does not cover ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("sessions", "keys", "old"), "no per-session key listing"),
        (("keys", "get", "old-1"), "does not read or remove keys"),
        (("keys", "rm", "old-1", "--yes"), "does not read or remove keys"),
        (("sessions", "pin", "old"), "cannot pin or unpin"),
        (("sessions", "close", "old", "--yes"), "cannot close"),
    ],
)
def test_commands_outside_the_api_are_usage_errors(args: tuple[str, ...], why: str) -> None:
    # A closed port: the refusal comes before any call.
    refused = run_cli("--http", f"http://127.0.0.1:{free_port()}", *args)
    assert refused.returncode == 2 and not refused.stdout
    assert "is not available with --http" in refused.stderr and why in refused.stderr
    assert f"`{' '.join(a for a in args[:2] if not a.startswith('-'))}`" in refused.stderr


def test_unreachable_and_malformed_urls() -> None:
    port = free_port()
    for args in (("sessions", "ls"), ("stats",), ("sessions", "release-all", "--yes")):
        grpc = run_cli("--master", f"127.0.0.1:{port}", "--timeout", "2", *args)
        http = run_cli("--http", f"http://127.0.0.1:{port}", "--timeout", "2", *args)
        assert grpc.returncode == http.returncode == 3, (grpc.stderr, http.stderr)
        assert http.stderr.startswith(
            f"mooncake-py: cannot reach the master at http://127.0.0.1:{port}"
        )
    for url in ("ftp://127.0.0.1:1", "127.0.0.1:9003", "http://", "http://h:1/?q=1"):
        bad = run_cli("--http", url, "sessions", "ls")
        assert bad.returncode == 2 and "--http" in bad.stderr, url
    with_tls = run_cli("--http", f"http://127.0.0.1:{port}", "--tls-ca", __file__, "stats")
    assert with_tls.returncode == 2 and "https://" in with_tls.stderr


def test_the_environment_selects_http(twins: Twins) -> None:
    by_env = run_cli(
        "--tenant", twins.grpc_tenant, "sessions", "ls", env={"MOONCAKE_PY_HTTP": twins.url}
    )
    by_flag = run_cli("--http", twins.url, "--tenant", twins.grpc_tenant, "sessions", "ls")
    assert by_env.returncode == 0 and by_env.stdout == by_flag.stdout and "old" in by_env.stdout


# -- looking sessions up, and releases that keep everything ------------------------------------

NEIGHBOURS = ["conv-1", "conv-1-x", "conv-10", "conv-1/", "conv-1\u00e9", "conv-2", "conv-0"]


def test_sessions_among_neighbours_are_found_alike(
    twins: Twins, writer: WriterProcess, clock: FakeClock
) -> None:
    # Ids sharing prefixes: the HTTP lookup starts its listing just below the id it wants.
    for session in NEIGHBOURS:
        for tenant in (twins.grpc_tenant, twins.http_tenant):
            key = f"k-{session}"
            tagged = {"key": key, "size": 512, "sessions": [session]}
            assert writer.call("put_tagged", tenant=tenant, **tagged) == 0
            assert writer.call("exist", tenant=tenant, keys=[key]) == [1]
    clock.advance(1)
    for session in NEIGHBOURS:
        shown = twins.same_json("sessions", "show", session, twin=False)
        assert (shown["session_id"], shown["member_count"], shown["idle_ms"]) == (session, 1, 1000)
    for missing in ("conv-11", "conv-", "conv-1-", "conv-3", "a", "\U0001f600"):
        absent = twins.same("sessions", "show", missing, twin=False)
        assert absent.returncode == 4, missing
    bad = twins.same("sessions", "show", "nul\0id", twin=False)
    assert bad.returncode == 2 and "invalid request" in bad.stderr


def test_a_release_that_keeps_every_member_matches(twins: Twins, writer: WriterProcess) -> None:
    for tenant in (twins.grpc_tenant, twins.http_tenant):
        tagged = {"key": "dup", "size": 1024, "sessions": ["dup-a", "dup-b"]}
        assert writer.call("put_tagged", tenant=tenant, **tagged) == 0
    kept = twins.same("sessions", "release", "dup-a", "--yes")
    assert kept.stdout == (
        "released session 'dup-a': 1 session(s), 0 object(s) removed, 0 B freed; kept 1 shared\n"
    )
    released = twins.same_json("sessions", "release", "dup-b", "--yes")
    assert (released["sessions"], released["released_objects"], released["kept_shared"]) == (
        1,
        1,
        0,
    )
    assert twins.same("sessions", "show", "dup-a").returncode == 4


def test_all_pages_releases_shared_members_too(twins: Twins, writer: WriterProcess) -> None:
    for tenant in (twins.grpc_tenant, twins.http_tenant):
        for key, sessions in (("both", ["wide-a", "wide-b"]), ("own", ["wide-a"])):
            tagged = {"key": key, "size": 1024, "sessions": sessions}
            assert writer.call("put_tagged", tenant=tenant, **tagged) == 0
    released = twins.same("sessions", "release", "wide-a", "--all-pages", "--yes")
    assert released.stdout == (
        "released session 'wide-a': 1 session(s), 2 object(s) removed, 2.0 KiB freed\n"
    )
    for tenant in (twins.grpc_tenant, twins.http_tenant):
        assert writer.call("exist", tenant=tenant, keys=["both", "own"]) == [0, 0]
    assert twins.same("sessions", "show", "wide-b").returncode == 4


def test_http_ages_and_idle_times_match_to_the_millisecond(
    twins: Twins, writer: WriterProcess, clock: FakeClock
) -> None:
    # The API gives creation and last activity in whole milliseconds (created_at_ms,
    # last_token_at_ms): a lifetime of 2.5 s shows as such over both transports.
    for tenant in (twins.grpc_tenant, twins.http_tenant):
        tagged = {"key": "late-1", "size": 512, "sessions": ["late"]}
        assert writer.call("put_tagged", tenant=tenant, **tagged) == 0
    clock.advance(1.5)
    for tenant in (twins.grpc_tenant, twins.http_tenant):
        tagged = {"key": "late-2", "size": 512, "sessions": ["late"]}
        assert writer.call("put_tagged", tenant=tenant, **tagged) == 0
    clock.advance(1)
    grpc, http = twins.run("sessions", "show", "late", "--json", twin=False)
    expected, got = json.loads(grpc.stdout), json.loads(http.stdout)
    assert (expected["idle_ms"], expected["age_ms"]) == (1000, 2500)
    assert got["idle_ms"] == 1000 and abs(got["age_ms"] - 2500) <= 1


def test_listing_pages_match(twins: Twins, writer: WriterProcess) -> None:
    # Pages of two: the HTTP backend's cursors walk the listing as gRPC's do.
    for session in ("p-1", "p-2", "p-3", "p-4", "p-5"):
        tagged = {"key": f"k-{session}", "size": 256, "sessions": [session]}
        assert writer.call("put_tagged", tenant=twins.grpc_tenant, **tagged) == 0
    grpc = Client(
        ClientConfig(
            master_server_addr=twins.address, global_segment_size=0, tenant_id=twins.grpc_tenant
        )
    )
    http = HttpMemoryBackend(HttpTarget.parse(twins.url), "", twins.grpc_tenant, 10.0)
    try:
        for pinned, min_idle_ms in ((None, 0), (False, 0), (True, 0), (None, 2000)):
            pages: list[list[list[str]]] = []
            for backend in (grpc, http):
                cursor, ids = "", []
                while True:
                    page = backend.list_kv_sessions(cursor, 2, pinned, min_idle_ms)
                    ids.append([info.session_id for info in page.sessions])
                    cursor = page.next_cursor
                    if not cursor:
                        break
                pages.append(ids)
            flat = [[i for page in ids for i in page] for ids in pages]
            assert flat[1] == flat[0], (pinned, min_idle_ms)
            assert all(len(page) <= 2 for page in pages[1])
        assert len(flat[0]) == 2  # idle over 2 s: "old" and "mid"
    finally:
        grpc.close()
        http.close()
