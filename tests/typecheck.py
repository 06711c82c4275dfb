"""Type-check ``mooncake_py`` as it is installed, reporting the repository's real paths.

``master/`` and ``client/`` sit at the top of the repository and ship as ``mooncake_py.master``
and ``mooncake_py.client`` (setuptools ``package-dir``). An editable install maps them with an
import hook, which mypy cannot follow. So this assembles the installed layout as a tree of
links in a scratch directory (``.typecheck-layout/``, ignored by git), runs mypy there, and
rewrites every reported path back to the file in the repository.

Usage: ``python -m tests.typecheck [mypy options] [-- files...]``; with no files the whole
package is checked with the ``[tool.mypy]`` settings of ``pyproject.toml``. Exit status: mypy's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / ".typecheck-layout"
# Installed name -> directory in the repository.
MAPPED = {"mooncake_py/master": ROOT / "master", "mooncake_py/client": ROOT / "client"}


def build_layout(dest: Path = LAYOUT) -> Path:
    """(Re)create the installed layout under ``dest`` as links; returns ``dest``.

    Complexity: one link per entry of ``mooncake_py/``.
    """
    package = dest / "mooncake_py"
    if package.exists() or package.is_symlink():
        shutil.rmtree(package) if not package.is_symlink() else package.unlink()
    package.mkdir(parents=True)
    for entry in (ROOT / "mooncake_py").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, target in MAPPED.items():
        (dest / name).symlink_to(target)
    return dest


def real_path(line: str) -> str:
    """A mypy output line with layout paths turned into repository paths."""
    for name, target in MAPPED.items():
        line = line.replace(f"{name}/", f"{target.relative_to(ROOT)}/")
    return line


def run_mypy(args: Sequence[str], cwd: Path) -> tuple[int, str]:
    """Run mypy in ``cwd`` with the project's configuration; returns (status, output)."""
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args]
    env = dict(os.environ, MYPY_CACHE_DIR=str(cwd / ".mypy_cache"))
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    return result.returncode, result.stdout + result.stderr


def main(argv: Sequence[str] | None = None) -> int:
    """Build the layout, run mypy, print its output with real paths; returns its status."""
    layout = build_layout()
    status, output = run_mypy(list(sys.argv[1:] if argv is None else argv), layout)
    sys.stdout.write("".join(real_path(line) for line in output.splitlines(keepends=True)))
    return status


if __name__ == "__main__":
    sys.exit(main())
