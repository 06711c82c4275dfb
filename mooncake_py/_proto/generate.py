"""Regenerate the protobuf and gRPC modules in this package from ``proto/``.

Run with ``make proto`` (or ``python -m mooncake_py._proto.generate``). The proto files are
mapped onto the virtual path ``mooncake_py/_proto/`` so that the generated modules import each
other as ``mooncake_py._proto.<name>_pb2`` without any rewriting.

``--check`` generates into a temporary directory and exits 1 when the committed files differ.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent
PROTO_DIR = REPO_ROOT / "proto"
VIRTUAL_PREFIX = "mooncake_py/_proto"


def generate(out_root: Path) -> list[Path]:
    """Run protoc for every ``proto/*.proto`` file into ``out_root/mooncake_py/_proto``.

    Returns:
        The generated files, relative to ``out_root/mooncake_py/_proto``.

    Raises:
        RuntimeError: protoc failed.
    """
    protos = sorted(PROTO_DIR.glob("*.proto"))
    (out_root / VIRTUAL_PREFIX).mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{VIRTUAL_PREFIX}={PROTO_DIR}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[f"{VIRTUAL_PREFIX}/{p.name}" for p in protos],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    out_dir = out_root / VIRTUAL_PREFIX
    return sorted(p.relative_to(out_dir) for p in out_dir.glob("*_pb2*.py*"))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale files")
    options = parser.parse_args(argv)
    if not options.check:
        generated = generate(REPO_ROOT)
        print("generated:", ", ".join(str(p) for p in generated))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        fresh_dir = Path(tmp) / VIRTUAL_PREFIX
        committed = sorted(p.relative_to(PACKAGE_DIR) for p in PACKAGE_DIR.glob("*_pb2*.py*"))
        stale = [str(p) for p in fresh if not filecmp.cmp(fresh_dir / p, PACKAGE_DIR / p, False)]
        extra = sorted(set(map(str, committed)) - set(map(str, fresh)))
        missing = sorted(set(map(str, fresh)) - set(map(str, committed)))
    if stale or extra or missing:
        print(f"stale: {stale} missing: {missing} extra: {extra}; run `make proto`")
        return 1
    print("generated protobuf code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
