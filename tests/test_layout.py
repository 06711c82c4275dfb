"""Packaging and code-generation rules: one import name, fresh generated code, full RPC surface."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from mooncake_py.client.master_rpc import MasterClient
from mooncake_py.master.transport.handlers import MasterServicer, service_descriptor_methods

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


def test_only_the_boundary_modules_import_generated_code() -> None:
    allowed = {ROOT / "master" / "transport" / "handlers.py", ROOT / "client" / "master_rpc.py"}
    offenders = []
    for path in [
        *ROOT.glob("master/**/*.py"),
        *ROOT.glob("client/*.py"),
        *ROOT.glob("mooncake_py/*.py"),
    ]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and "_proto" in node.module
                and path not in allowed
            ):
                offenders.append(str(path))
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


def test_every_rpc_has_a_servicer_handler_and_a_client_method() -> None:
    def snake(name: str) -> str:
        return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")

    for rpc in service_descriptor_methods():
        assert callable(getattr(MasterServicer, rpc, None)), rpc
        client_method = CLIENT_METHOD_OF.get(rpc, snake(rpc))
        assert callable(getattr(MasterClient, client_method, None)), rpc


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
