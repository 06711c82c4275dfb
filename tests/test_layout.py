"""Packaging and code-generation rules: one import name, fresh generated code, full RPC surface."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from mooncake_py._wire.rpcs import RPCS, SERVICE
from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.master.config import MasterConfig
from mooncake_py.master.metrics import RpcCounters
from mooncake_py.master.service.facade import MasterService
from mooncake_py.master.transport.pipeline import CallPipeline

ROOT = Path(__file__).resolve().parent.parent


def _tracked_files() -> list[Path]:
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [ROOT / name for name in listing.stdout.split("\0") if name]


def test_no_symlinks_and_every_package_is_mapped() -> None:
    assert [p for p in _tracked_files() if p.is_symlink()] == []
    declared = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for top, installed in (
        ("mooncake_py", "mooncake_py"),
        ("master", "mooncake_py.master"),
        ("client", "mooncake_py.client"),
    ):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((installed, *parts)))
    assert found == declared


def test_master_and_client_import_themselves_relatively() -> None:
    offenders = []
    for top in ("master", "client"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                absolute = isinstance(node, ast.ImportFrom) and node.level == 0
                module = getattr(node, "module", None) or ""
                if absolute and module.startswith((f"mooncake_py.{top}", top)):
                    offenders.append(f"{path.relative_to(ROOT)}: {module}")
    assert offenders == []


def test_generated_protobuf_code_is_fresh() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mooncake_py._proto.generate", "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_the_wire_package_imports_generated_code() -> None:
    wire = ROOT / "mooncake_py" / "_wire"
    generated = ROOT / "mooncake_py" / "_proto"
    offenders = []
    for path in [*ROOT.glob("master/**/*.py"), *ROOT.glob("client/**/*.py")] + [
        p for p in ROOT.glob("mooncake_py/**/*.py") if wire not in p.parents
    ]:
        if generated in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            if any("_proto" in m.split(".") for m in modules):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


# RPCs a client method reaches under another name (tagged forms are chosen by the config).
CLIENT_METHOD_OF = {
    "ReMountSegment": "remount_segments",
    "PinKvSession": "set_kv_session_pin",
    "UnpinKvSession": "set_kv_session_pin",
    "PutStartWithKvSessions": "put_start",
    "BatchPutStartWithKvSessions": "batch_put_start",
    "UpsertStartWithKvSessions": "upsert_start",
    "BatchUpsertStartWithKvSessions": "batch_upsert_start",
}


def test_every_rpc_has_a_table_entry_a_bound_target_and_a_client_method() -> None:
    def snake(name: str) -> str:
        return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")

    declared = [m.name for m in SERVICE.methods]
    assert list(RPCS) == declared
    pipeline = CallPipeline(MasterService(MasterConfig()), None, RpcCounters())
    for rpc in declared:
        assert callable(pipeline.calls[rpc].run), rpc
        client_method = CLIENT_METHOD_OF.get(rpc, snake(rpc))
        assert callable(getattr(MasterClient, client_method, None)), rpc


def test_session_and_release_rpcs_target_their_services() -> None:
    for rpc in RPCS.values():
        if rpc.name.startswith("Release"):
            assert rpc.target.startswith("service.releases."), rpc.name
        elif "KvSession" in rpc.name and "Start" not in rpc.name:
            assert rpc.target.startswith("service.sessions."), rpc.name


@pytest.mark.timeout(300)
def test_wheel_ships_only_mooncake_py(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = next(tmp_path.glob("*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    packages = {t for t in tops if not t.endswith((".dist-info", ".data"))}
    assert packages == {"mooncake_py"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "mooncake_py/master/service/facade.py" in names
    assert "mooncake_py/client/compat.py" in names
    assert "mooncake_py/_proto/master_pb2.py" in names
