"""The ``mooncake-py`` ops CLI against a real master child process.

The store is populated through a :class:`MooncakeDistributedStore` in this process. Each test
works in its own tenant (the master runs with ``--enable_multi_tenants``), so listings only
show what the test created.

Most commands run through the CLI's ``main(argv)`` in this process, with its own stdin,
stdout, stderr and environment (:func:`run_cli`); what only a real process shows (exit
status, binary stdout on a pipe, a terminal on stdin) goes through ``python -m
mooncake_py.cli`` (:func:`run_cli_process`).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO
from unittest import mock

import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from mooncake_py import MooncakeDistributedStore, ObjectDataType, ReplicateConfig
from mooncake_py.cli import main as cli_main
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster, MasterProcess

MASTER_FLAGS = ["--metrics_port", "-1"]
_CLI_ENV_VARS = ("MOONCAKE_MASTER", "MOONCAKE_AUTH_TOKEN", "MOONCAKE_TENANT_ID")
_CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in _CLI_ENV_VARS}


def run_cli_process(
    *args: str,
    stdin: Any = subprocess.DEVNULL,
    env: dict[str, str] | None = None,
    binary: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """Run ``python -m mooncake_py.cli ARGS`` (stdin empty by default)."""
    return subprocess.run(
        [sys.executable, "-m", "mooncake_py.cli", *args],
        stdin=stdin,
        capture_output=True,
        text=not binary,
        env={**_CLEAN_ENV, **(env or {})},
        timeout=60,
    )


def run_cli(
    *args: str,
    stdin: TextIO | None = None,
    env: dict[str, str] | None = None,
    binary: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """Run ``main(ARGS)`` of the CLI in this process, as :func:`run_cli_process` would run it:
    stdin empty (not a terminal) by default, only ``env`` of the CLI's variables set, stdout
    (bytes when ``binary``) and stderr captured, the exit code as ``returncode``."""
    stdout_bytes = io.BytesIO()
    stdout = io.TextIOWrapper(stdout_bytes, encoding="utf-8", write_through=True)
    stderr = io.StringIO()
    environment = {**_CLEAN_ENV, **(env or {})}
    with (
        mock.patch.dict(os.environ, environment, clear=True),
        mock.patch.object(sys, "stdin", stdin if stdin is not None else io.StringIO()),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        code = cli_main(list(args))
    raw = stdout_bytes.getvalue()
    return subprocess.CompletedProcess(
        list(args), code, raw if binary else raw.decode("utf-8"), stderr.getvalue()
    )


class Cli:
    """Runs the CLI against one master, in one tenant: :meth:`__call__` and :meth:`json` in
    this process, :meth:`process` as a child process."""

    def __init__(self, address: str, tenant: str) -> None:
        self.address = address
        self.tenant = tenant

    def __call__(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        return run_cli("--master", self.address, "--tenant", self.tenant, *args, **kwargs)

    def process(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run as ``python -m mooncake_py.cli`` (``stdin`` may be a file descriptor)."""
        return run_cli_process("--master", self.address, "--tenant", self.tenant, *args, **kwargs)

    def json(self, *args: str) -> Any:
        """Run with ``--json``; the command must succeed."""
        result = self(*args, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture(scope="module")
def master() -> Iterator[MasterProcess]:
    with MasterProcess([*MASTER_FLAGS, "--enable_multi_tenants", "true"]) as running:
        yield running


@pytest.fixture
def tenant(request: pytest.FixtureRequest) -> str:
    return request.node.name.replace("[", "-").replace("]", "")


def _store_of(address: str, tenant: str) -> MooncakeDistributedStore:
    client = MooncakeDistributedStore()
    config = {
        "master_server_address": address,
        "global_segment_size": 16 << 20,
        "tenant_id": tenant,
    }
    assert client.setup(config) == 0
    return client


@pytest.fixture
def store(master: MasterProcess, tenant: str) -> Iterator[MooncakeDistributedStore]:
    client = _store_of(master.address, tenant)
    yield client
    client.close()


@pytest.fixture
def cli(master: MasterProcess, tenant: str) -> Cli:
    return Cli(master.address, tenant)


def tagged(*sessions: str, **extra: Any) -> ReplicateConfig:
    return ReplicateConfig(kv_sessions=[list(sessions)], **extra)


def allocated_bytes(address: str) -> int:
    client = MasterClient(address)
    try:
        return client.get_stats()["allocated_bytes"]
    finally:
        client.close()


# -- listing ----------------------------------------------------------------------------------


def test_sessions_ls_json_table_sort_top_and_filters(
    store: MooncakeDistributedStore, cli: Cli
) -> None:
    assert store.put("ka", b"a" * 1000, tagged("alpha")) == 0
    assert store.put("kb", b"b" * 3000, tagged("bravo")) == 0
    assert store.put("kc", b"c" * 2000, tagged("charlie")) == 0
    assert store.attach_kv_session("charlie", ["ka"]) == [0]
    store.pin_kv_session("charlie")

    listed = cli.json("sessions", "ls")
    assert [s["session_id"] for s in listed] == ["alpha", "bravo", "charlie"]
    by_id = {s["session_id"]: s for s in listed}
    assert by_id["charlie"]["bytes"] == 3000 and by_id["charlie"]["exclusive_bytes"] == 2000
    assert by_id["charlie"]["member_count"] == 2 and by_id["charlie"]["pinned"] is True
    assert by_id["alpha"]["exclusive_bytes"] == 0 and by_id["bravo"]["pinned"] is False
    assert all(s["idle_ms"] >= 0 and s["created_at"] > 0 for s in listed)

    table = cli("sessions", "ls")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["SESSION", "PINNED", "MEMBERS", "SIZE", "EXCLUSIVE", "IDLE", "AGE"]
    assert lines[3].split()[:5] == ["charlie", "yes", "2", "2.9", "KiB"]
    assert lines[2].split()[:4] == ["bravo", "no", "1", "2.9"]

    top = cli.json("sessions", "ls", "--sort", "bytes", "--top", "2")
    assert [s["session_id"] for s in top] == ["bravo", "charlie"]
    assert [s["session_id"] for s in cli.json("sessions", "ls", "--pinned")] == ["charlie"]
    assert [s["session_id"] for s in cli.json("sessions", "ls", "--unpinned")] == [
        "alpha",
        "bravo",
    ]
    assert cli.json("sessions", "ls", "--idle-over", "1h") == []
    empty = cli("sessions", "ls", "--idle-over", "1h")
    assert empty.returncode == 0 and "no sessions" in empty.stderr


def test_csv_and_parquet_outputs(store: MooncakeDistributedStore, cli: Cli, tmp_path: Path) -> None:
    for i in range(5):
        assert store.put(f"k{i}", b"v" * (100 * (i + 1)), tagged(f"s{i}")) == 0
    csv_file, parquet_file = tmp_path / "sessions.csv", tmp_path / "sessions.parquet"
    assert cli("sessions", "ls", "--format", "csv", "--output", str(csv_file)).returncode == 0
    assert cli("--output", str(parquet_file), "sessions", "ls").returncode == 0  # by suffix
    from_csv = pa_csv.read_csv(csv_file)
    from_parquet = pq.read_table(parquet_file)
    for table in (from_csv, from_parquet):
        assert table.num_rows == 5
        assert table.column("session_id").to_pylist() == [f"s{i}" for i in range(5)]
        assert table.column("bytes").to_pylist() == [100, 200, 300, 400, 500]
    assert str(from_parquet.schema.field("created_at").type) == "timestamp[us, tz=UTC]"
    assert from_parquet.schema.field("pinned").type == "bool"

    segments = cli("segments", "ls", "--format", "csv")  # CSV may go to stdout
    assert segments.returncode == 0 and segments.stdout.startswith('"segment_id","name"')
    refused = cli("sessions", "ls", "--format", "parquet")
    assert refused.returncode == 2 and "--output" in refused.stderr


# -- single sessions ---------------------------------------------------------------------------


def test_show_keys_pin_unpin(store: MooncakeDistributedStore, cli: Cli) -> None:
    assert store.put_batch(["x1", "x2"], [b"1" * 500, b"2" * 700], tagged("conv", "conv")) == -600
    config = ReplicateConfig(kv_sessions=[["conv"], ["conv"]])
    assert store.put_batch(["x1", "x2"], [b"1" * 500, b"2" * 700], config) == 0
    shown = cli.json("sessions", "show", "conv")
    assert shown["session_id"] == "conv" and shown["member_count"] == 2
    assert shown["bytes"] == 1200 and shown["shared_bytes"] == 0 and not shown["pinned"]
    text = cli("sessions", "show", "conv").stdout
    assert "Exclusive:" in text and "1.2 KiB" in text
    assert cli.json("sessions", "keys", "conv") == [{"key": "x1"}, {"key": "x2"}]

    assert cli("sessions", "pin", "conv").stdout.strip() == "pinned session 'conv'"
    assert store.get_kv_session("conv").pinned
    assert cli("sessions", "unpin", "conv").returncode == 0
    assert not store.get_kv_session("conv").pinned


def test_release_reports_freed_bytes(
    store: MooncakeDistributedStore, cli: Cli, master: MasterProcess
) -> None:
    two = ReplicateConfig(kv_sessions=[["s"]] * 2)
    assert store.put_batch(["a", "b"], [b"x" * 1000] * 2, two) == 0
    assert store.put("shared", b"y" * 1000, tagged("s", "other")) == 0
    before = allocated_bytes(master.address)
    result = cli.json("sessions", "release", "s", "--yes")
    assert (result["sessions"], result["released_objects"], result["kept_shared"]) == (1, 2, 1)
    assert result["freed_bytes"] == before - allocated_bytes(master.address) > 0
    assert store.batch_is_exist(["a", "b", "shared"]) == [0, 0, 1]

    again = cli("sessions", "release", "s", "--yes")
    assert again.returncode == 4 and "session 's' not found" in again.stderr
    text = cli("sessions", "release", "other", "-y")
    assert text.returncode == 0
    assert "1 object(s) removed" in text.stdout and "KiB freed" in text.stdout


def test_close_release_all_and_kv_cache(store: MooncakeDistributedStore, cli: Cli) -> None:
    assert store.put("c1", b"c" * 100, tagged("closing")) == 0
    assert cli("sessions", "close", "closing", "--yes").returncode == 0
    assert store.is_exist("c1") == 1  # closing keeps the data cached
    assert cli("sessions", "show", "closing").returncode == 4

    weights = ReplicateConfig(data_type=ObjectDataType.WEIGHT)
    assert store.put("weights", b"w" * 100, weights) == 0
    assert store.put("kv-pinned", b"p" * 100, tagged("keep")) == 0
    store.pin_kv_session("keep")
    cache = cli.json("release-kv-cache", "--yes")
    assert cache["released_objects"] == 1 and cache["kept_pinned"] == 1  # c1 goes, kv-pinned stays
    assert store.batch_is_exist(["c1", "weights", "kv-pinned"]) == [0, 1, 1]

    everything = cli.json("sessions", "release-all", "--yes")
    assert everything["sessions"] == 1 and everything["released_objects"] == 1
    assert store.batch_is_exist(["weights", "kv-pinned"]) == [1, 0]


def test_release_stale_dry_run_changes_nothing(tenant: str) -> None:
    # Idle times come from the master's clock: advancing it ages the first sessions at once.
    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False, enable_multi_tenants=True) as clocked:
        store = _store_of(clocked.address, tenant)
        cli = Cli(clocked.address, tenant)
        try:
            _release_stale_dry_run_then_for_real(store, cli, clock)
        finally:
            store.close()
        clocked.service.check()


def _release_stale_dry_run_then_for_real(
    store: MooncakeDistributedStore, cli: Cli, clock: FakeClock
) -> None:
    assert store.put("old1", b"o" * 100, tagged("old1")) == 0
    assert store.put("old2", b"o" * 200, tagged("old2")) == 0
    assert store.put("old-pinned", b"p" * 100, tagged("old-pinned")) == 0
    store.pin_kv_session("old-pinned")
    clock.advance(3.1)
    assert store.put("fresh", b"f" * 100, tagged("fresh")) == 0

    dry = cli("sessions", "release-stale", "--idle-over", "3s", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert sorted(s["session_id"] for s in json.loads(dry.stdout)) == ["old1", "old2"]
    assert "would release 2" in dry.stderr and "nothing was changed" in dry.stderr
    assert len(store.list_kv_sessions()[0]) == 4
    assert store.batch_is_exist(["old1", "old2", "old-pinned", "fresh"]) == [1, 1, 1, 1]

    clock.advance(2.0)  # "fresh" is 2 s idle: under the limit only because of the attach below
    store.attach_kv_session("fresh", ["fresh"])
    clock.advance(2.0)
    released = cli.json("sessions", "release-stale", "--idle-over", "3s", "--yes")
    assert (released["sessions"], released["released_objects"]) == (2, 2)
    assert released["freed_bytes"] > 0
    assert store.batch_is_exist(["old1", "old2", "old-pinned", "fresh"]) == [0, 0, 1, 1]


# -- keys, segments, stats ---------------------------------------------------------------------


def test_keys_get_and_rm(store: MooncakeDistributedStore, cli: Cli, tmp_path: Path) -> None:
    value = bytes(range(256)) * 40
    assert store.put("blob", value) == 0
    printed = cli.process("keys", "get", "blob", binary=True)  # raw bytes on a real pipe
    assert printed.returncode == 0 and printed.stdout == value
    assert cli("keys", "get", "blob", binary=True).stdout == value
    target = tmp_path / "blob.bin"
    saved = cli("keys", "get", "blob", "--output", str(target))
    assert saved.returncode == 0 and target.read_bytes() == value
    as_json = cli.json("keys", "get", "blob")
    assert as_json["size"] == len(value) and base64.b64decode(as_json["value_base64"]) == value
    missing = cli("keys", "get", "nothing")
    assert missing.returncode == 4 and "key 'nothing' not found" in missing.stderr

    assert cli("keys", "rm", "blob", "--yes").returncode == 0
    assert store.is_exist("blob") == 0
    gone = cli("keys", "rm", "blob", "--yes", "--force")
    assert gone.returncode == 4 and "not found" in gone.stderr


def test_segments_and_stats(store: MooncakeDistributedStore, cli: Cli) -> None:
    assert store.put("k", b"v" * 1000) == 0
    mine = [s for s in cli.json("segments", "ls") if s["name"] == store.get_hostname()]
    assert len(mine) == 1
    assert mine[0]["size"] == 16 << 20 and mine[0]["used_bytes"] >= 1000
    table = cli("segments", "ls").stdout
    assert table.startswith("SEGMENT") and store.get_hostname() in table and "16.0 MiB" in table
    stats = cli.json("stats")
    assert stats["objects"] >= 1 and stats["capacity_bytes"] >= 16 << 20
    assert "capacity_bytes:" in cli("stats").stdout


# -- confirmation and errors -------------------------------------------------------------------


def test_destructive_commands_need_confirmation(store: MooncakeDistributedStore, cli: Cli) -> None:
    assert store.put("keep-me", b"k" * 100, tagged("keep")) == 0
    for command in (
        ["sessions", "release", "keep"],
        ["sessions", "close", "keep"],
        ["sessions", "release-all"],
        ["release-kv-cache"],
        ["keys", "rm", "keep-me"],
    ):
        refused = cli(*command)  # stdin is empty, not a terminal
        assert refused.returncode == 1, (command, refused.stderr)
        assert "not confirmed" in refused.stderr and "--yes" in refused.stderr
    assert store.get_kv_session("keep").member_count == 1 and store.is_exist("keep-me") == 1


def _answer_on_terminal(cli: Cli, answer: bytes, *args: str) -> subprocess.CompletedProcess[Any]:
    leader, follower = os.openpty()
    try:
        os.write(leader, answer)
        return cli.process(*args, stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)


def test_confirmation_on_a_terminal(store: MooncakeDistributedStore, cli: Cli) -> None:
    assert store.put("t", b"t" * 100, tagged("term")) == 0
    declined = _answer_on_terminal(cli, b"n\n", "sessions", "release", "term")
    assert declined.returncode == 1 and "proceed? [y/N]" in declined.stderr
    assert store.is_exist("t") == 1
    accepted = _answer_on_terminal(cli, b"y\n", "sessions", "release", "term")
    assert accepted.returncode == 0, accepted.stderr
    assert store.is_exist("t") == 0


def test_error_exit_codes(cli: Cli) -> None:
    unknown = cli("sessions", "show", "no-such-session")
    assert unknown.returncode == 4 and unknown.stderr.count("\n") == 1
    assert "session 'no-such-session' not found" in unknown.stderr
    assert cli("sessions", "keys", "no-such-session").returncode == 4
    assert cli("sessions", "pin", "no-such-session").returncode == 4
    usage = cli("sessions", "ls", "--idle-over", "soon")
    assert usage.returncode == 2 and "not a duration" in usage.stderr

    unreachable = run_cli_process("--master", "127.0.0.1:1", "sessions", "ls")
    assert unreachable.returncode == 3  # the exit status of the process
    assert unreachable.stderr.startswith("mooncake-py: cannot reach the master at 127.0.0.1:1")
    usage_status = run_cli_process("--master", cli.address, "sessions", "ls", "--idle-over", "x")
    assert usage_status.returncode == 2 and "not a duration" in usage_status.stderr


def test_tokens(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                "token-a": "tenant-a",
                "token-b": "tenant-b",
                "token-admin": {"tenant": "ops", "role": "admin"},
            }
        )
    )
    with InProcessMaster(metrics_port=-1, auth_tokens_file=str(tokens)) as secured:
        store = MooncakeDistributedStore()
        config = {
            "master_server_address": secured.address,
            "global_segment_size": 4 << 20,
            "auth_token": "token-a",
        }
        assert store.setup(config) == 0
        try:
            assert store.put("k", b"v" * 100, tagged("mine")) == 0
            base = ["--master", secured.address]
            own = run_cli(*base, "sessions", "ls", "--json", env={"MOONCAKE_AUTH_TOKEN": "token-a"})
            assert own.returncode == 0, own.stderr
            assert [s["session_id"] for s in json.loads(own.stdout)] == ["mine"]
            other = run_cli(*base, "--token", "token-b", "--json", "sessions", "ls")
            assert other.returncode == 0 and json.loads(other.stdout) == []

            bad = run_cli(*base, "--token", "wrong", "sessions", "ls")
            assert bad.returncode == 5 and "unauthenticated" in bad.stderr
            assert run_cli(*base, "stats").returncode == 5  # no token at all
            foreign = run_cli(*base, "--token", "token-a", "--tenant", "tenant-b", "sessions", "ls")
            assert foreign.returncode == 5 and "permission denied" in foreign.stderr
            got = run_cli(*base, "--token", "token-a", "keys", "get", "k", binary=True)
            assert got.returncode == 0 and got.stdout == b"v" * 100

            # Global views need an admin token; a tenant's token sees its own with --own.
            for command in (["segments", "ls"], ["stats"]):
                denied = run_cli(*base, "--token", "token-a", *command)
                assert denied.returncode == 5, command
                assert "needs an admin token" in denied.stderr and "--own" in denied.stderr
            mine = run_cli(*base, "--token", "token-a", "--json", "segments", "ls", "--own")
            assert mine.returncode == 0, mine.stderr
            assert [s["name"] for s in json.loads(mine.stdout)] == [store.get_hostname()]
            theirs = run_cli(*base, "--token", "token-b", "--json", "segments", "ls", "--own")
            assert theirs.returncode == 0 and json.loads(theirs.stdout) == []
            figures = run_cli(*base, "--token", "token-a", "--json", "stats", "--own")
            assert figures.returncode == 0 and json.loads(figures.stdout)["objects"] == 1
            admin = run_cli(*base, "--token", "token-admin", "--json", "segments", "ls")
            assert admin.returncode == 0, admin.stderr
            assert [s["name"] for s in json.loads(admin.stdout)] == [store.get_hostname()]
            assert "tenant_view" not in json.loads(
                run_cli(*base, "--token", "token-admin", "--json", "stats").stdout
            )
        finally:
            store.close()
