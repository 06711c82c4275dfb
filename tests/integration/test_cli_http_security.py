"""The CLI over gRPC and over the HTTP memory API (``--http``) behind tokens and TLS.

A real master in this process on a frozen clock, a real client process writing tagged
objects (:mod:`tests.integration.session_writer_worker`); each command runs through the
CLI's ``main()`` with ``--master`` and with ``--http`` and must answer alike.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster
from tests.integration.cli_twins import SEGMENT_BYTES, WriterProcess, run_cli, segments_match
from tests.tls_certs import Pki

# -- tokens ------------------------------------------------------------------------------------

TOKENS = {
    "token-a": "tenant-a",
    "token-b": "tenant-b",
    "token-admin": {"tenant": "ops", "role": "admin"},
}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessMaster, str]]:
    """A master that requires tokens (on a frozen clock), with one session of tenant-a."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False, auth_tokens_file=str(tokens)) as running:
        writer = WriterProcess()
        try:
            config = {
                "master_server_address": running.address,
                "global_segment_size": SEGMENT_BYTES,
                "auth_token": "token-a",
            }
            assert writer.call("join", tenant="default", config=config) == 0
            tagged = {"key": "k", "size": 512, "sessions": ["mine"]}
            assert writer.call("put_tagged", tenant="default", **tagged) == 0
            clock.advance(2)
            yield running, f"http://127.0.0.1:{running.metrics_port}"
        finally:
            writer.stop()


def _same_with_token(
    master: InProcessMaster, url: str, *args: str
) -> subprocess.CompletedProcess[str]:
    grpc = run_cli("--master", master.address, *args)
    http = run_cli("--http", url, *args)
    assert (http.returncode, http.stdout) == (grpc.returncode, grpc.stdout), (
        grpc.stderr,
        http.stderr,
    )
    assert http.stderr.replace(url, master.address) == grpc.stderr
    return grpc


def test_tokens_are_honoured_alike(secured: tuple[InProcessMaster, str]) -> None:
    master, url = secured
    own = _same_with_token(master, url, "--token", "token-a", "sessions", "ls")
    assert own.returncode == 0 and own.stdout.splitlines()[1].split()[0] == "mine"
    dry = ("sessions", "release-stale", "--idle-over", "1s", "--dry-run")
    assert "would release 1" in _same_with_token(master, url, "--token", "token-a", *dry).stderr
    other = _same_with_token(master, url, "--token", "token-b", "sessions", "ls", "--json")
    assert other.stdout == "[]\n"
    for args in (
        ("--token", "wrong", "sessions", "ls"),
        ("sessions", "ls"),
        ("--token", "wrong", "sessions", "release-all", "--yes"),
    ):
        refused = _same_with_token(master, url, *args)
        assert refused.returncode == 5 and "unauthenticated" in refused.stderr
    foreign = _same_with_token(
        master, url, "--token", "token-a", "--tenant", "tenant-b", "sessions", "ls"
    )
    assert foreign.returncode == 5 and "permission denied" in foreign.stderr
    for command in (("stats",), ("segments", "ls")):
        denied = _same_with_token(master, url, "--token", "token-a", *command)
        assert denied.returncode == 5 and "needs an admin token" in denied.stderr
    admin = _same_with_token(master, url, "--token", "token-admin", "stats", "--json")
    assert "tenant_view" not in json.loads(admin.stdout)
    own = _same_with_token(master, url, "--token", "token-a", "stats", "--own", "--json")
    assert json.loads(own.stdout)["tenant_view"] == 1
    for token, own_view in (("token-admin", ()), ("token-a", ("--own",))):
        segments = ("--token", token, "segments", "ls", *own_view)
        grpc = run_cli("--master", master.address, *segments)
        segments_match(grpc, run_cli("--http", url, *segments))
        assert grpc.stdout.count("\n") == 2  # the writer's one segment


# -- TLS ---------------------------------------------------------------------------------------


def test_https_with_the_cli_tls_options(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    clock = FakeClock()
    tls_flags = {
        "tls_cert_file": pki.cert_file,
        "tls_key_file": pki.key_file,
        "tls_ca_file": pki.ca_file,
        "tls_require_client_cert": True,
    }
    with InProcessMaster(clock=clock, background=False, **tls_flags) as master:
        writer = WriterProcess()
        try:
            config = {
                "master_server_address": master.address,
                "global_segment_size": SEGMENT_BYTES,
                "tls_ca_file": pki.ca_file,
                "tls_cert_file": pki.client_cert,
                "tls_key_file": pki.client_key,
            }
            assert writer.call("join", tenant="default", config=config) == 0
            tagged = {"key": "k", "size": 512, "sessions": ["secure"]}
            assert writer.call("put_tagged", tenant="default", **tagged) == 0
            clock.advance(1)
            url = f"https://127.0.0.1:{master.metrics_port}"
            _https_runs(master.address, url, pki)
        finally:
            writer.stop()


def _https_runs(address: str, url: str, pki: Any) -> None:
    tls = ["--tls-ca", pki.ca_file, "--tls-cert", pki.client_cert, "--tls-key", pki.client_key]
    for args in (
        ("sessions", "ls"),
        ("sessions", "release-stale", "--idle-over", "0s", "--dry-run"),
        ("stats",),
    ):
        grpc = run_cli("--master", address, *tls, *args)
        http = run_cli("--http", url, *tls, *args)
        assert grpc.returncode == 0, grpc.stderr
        assert (http.returncode, http.stdout, http.stderr) == (0, grpc.stdout, grpc.stderr), args
    released = run_cli("--http", url, *tls, "sessions", "release-all", "--yes")
    assert (
        released.stdout == "released all sessions: 1 session(s), 1 object(s) removed, 512 B freed\n"
    )
    named = run_cli("--http", url, *tls, "--tls-server-name", "master.example", "sessions", "ls")
    assert named.returncode == 0 and named.stderr == "no sessions\n"
    # A name the certificate does not carry, no CA (the system's store does not know this
    # one), no client certificate for a mutual-TLS master: unreachable, as over gRPC.
    wrong_name = [*tls, "--tls-server-name", "other.example"]
    no_cert = ["--tls-ca", pki.ca_file]
    for options in (wrong_name, [], no_cert):
        refused = run_cli("--http", url, "--timeout", "3", *options, "stats")
        assert refused.returncode == 3 and "cannot reach" in refused.stderr, options
    broken = run_cli("--http", url, "--tls-ca", __file__, "stats")
    assert broken.returncode == 2 and "--tls-ca" in broken.stderr
