"""A baseline revision of mooncake-py for ``--baseline-rev``: its build and its report section.

The revision (any git revision of this repository) is exported with ``git archive`` into a
scratch directory, which leaves the repository's worktrees, index and refs untouched, and
installed there with this environment's pip (``pip install --no-deps --no-build-isolation
--target <dir>/site``): the installed layout is needed because ``pyproject.toml`` maps
``master/`` and ``client/`` to ``mooncake_py.master`` and ``mooncake_py.client``, so the source
tree itself is not importable as the package. The dependencies are this environment's.

The baseline's master and workers run this interpreter with ``PYTHONPATH=<dir>/site:<repo>``
(the baseline's ``mooncake_py`` first, the working tree's ``tests.bench`` after it) and
``PYTHONSAFEPATH=1`` (Python >= 3.11), so that the working directory, the repository root, does
not put the working tree's ``mooncake_py`` in front. The measuring code (``tests.bench.worker``)
is the working tree's on both sides: only the implementation under test differs.

The caller owns the scratch directory (the benchmark removes it at the end, also on error).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import IO, Any

from tests.bench.common import ROOT
from tests.bench.report import PY, RowAccumulator, fmt_rate, verdict

BASELINE = "baseline"
MIN_PYTHON = (3, 11)  # PYTHONSAFEPATH


class BaselineUnavailable(RuntimeError):
    """The revision cannot be resolved or built; the message says why."""


@dataclasses.dataclass(frozen=True)
class Revision:
    """A resolved git revision: what was asked for, its commit hash and subject line."""

    rev: str
    commit: str
    subject: str

    @property
    def short(self) -> str:
        return self.commit[:9]


def _git(*args: str) -> str:
    result = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        problem = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise BaselineUnavailable(f"git {' '.join(args)}: {problem}")
    return result.stdout.strip()


def resolve(rev: str) -> Revision:
    """Resolve ``rev`` (``HEAD~3``, a hash, a branch) to a commit of this repository.

    Raises:
        BaselineUnavailable: git is missing, or ``rev`` names no commit.
    """
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except FileNotFoundError:
        raise BaselineUnavailable("git is not installed") from None
    except BaselineUnavailable:
        raise BaselineUnavailable(f"{rev!r} is not a commit of {ROOT}") from None
    return Revision(rev, commit, _git("log", "-1", "--format=%s", commit))


@dataclasses.dataclass(frozen=True)
class BaselineBuild:
    """An installed baseline: where its package is and how its processes find it."""

    revision: Revision
    site: Path
    build_s: float

    def env(self) -> dict[str, str | None]:
        """Environment changes for the baseline's master and workers."""
        return {"PYTHONPATH": f"{self.site}{os.pathsep}{ROOT}", "PYTHONSAFEPATH": "1"}

    def record(self) -> dict[str, Any]:
        """The JSON record's ``baseline`` entry."""
        return {
            "rev": self.revision.rev,
            "commit": self.revision.commit,
            "subject": self.revision.subject,
            "site": str(self.site),
            "build_s": round(self.build_s, 2),
        }


def build(revision: Revision, into: Path, log: IO[str] = sys.stderr) -> BaselineBuild:
    """Export ``revision`` into ``into/src`` and install it into ``into/site``.

    Args:
        revision: from :func:`resolve`.
        into: an empty scratch directory the caller removes afterwards.
        log: where pip's output goes.

    Returns:
        The build; its :meth:`BaselineBuild.env` points processes at it.

    Raises:
        BaselineUnavailable: this Python is older than 3.11, or the export or install failed
            (the message has the tail of pip's output).
    """
    if sys.version_info < MIN_PYTHON:
        raise BaselineUnavailable("--baseline-rev needs Python >= 3.11 (PYTHONSAFEPATH)")
    started = time.perf_counter()
    archive, source, site = into / "source.tar", into / "src", into / "site"
    _git("archive", "--format=tar", "-o", str(archive), revision.commit)
    source.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")  # refuses links and paths out of the tree
    archive.unlink()
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",  # this environment's setuptools (the dev extra), offline
        "--target",
        str(site),
        str(source),
    ]
    print(f"[baseline] {revision.short}: {' '.join(command)}", file=log, flush=True)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise BaselineUnavailable(f"pip could not install {revision.short}:\n{tail}")
    if not (site / "mooncake_py" / "master" / "__main__.py").exists():
        raise BaselineUnavailable(f"{revision.short} installed no mooncake_py.master")
    return BaselineBuild(revision, site, time.perf_counter() - started)


def attach(row: dict[str, Any], theirs: RowAccumulator | None) -> None:
    """Add the baseline's figures to a report row (built by ``report.row_record``):
    ``row["baseline"]`` (None when it did not measure the row), ``baseline_ratio`` = current /
    baseline and ``baseline_verdict`` (``faster`` / ``slower`` / ``no difference``)."""
    figure = theirs.figure() if theirs is not None and theirs.reps else None
    row[BASELINE] = figure
    if figure is not None and figure["value"] > 0:
        row["baseline_ratio"] = row[PY]["value"] / figure["value"]
        row["baseline_verdict"] = verdict(row[PY]["reps"], figure["reps"])
    else:
        row["baseline_ratio"], row["baseline_verdict"] = None, ""


def _spread(figure: dict[str, Any]) -> str:
    spread = figure.get("spread")
    return "-" if spread is None else f"±{spread:.0%}"


def _load_line(results: dict[str, Any]) -> list[str]:
    load = results.get("load_average")
    if not load:
        return []
    start, end = (" / ".join(f"{x:.1f}" for x in load[when]) for when in ("start", "end"))
    cpus = results["machine"].get("cpu_count")
    return [f"Load average (1 / 5 / 15 min) at start {start}, at end {end}, on {cpus} CPUs."]


def table_lines(results: dict[str, Any]) -> list[str]:
    """The report section comparing the working tree with the baseline; [] without one."""
    info = results.get("baseline")
    if not info:
        return []
    lines = [
        "",
        f"Working tree vs baseline {info['rev']} = {info['commit'][:9]} ({info['subject']})",
        "Both sides take turns round by round; ratio = working tree / baseline (above 1.00x: the",
        "working tree is faster); verdict 'no difference' when the reps' interquartile ranges",
        "overlap. Cost = 1 - ratio when the working tree is slower.",
        *_load_line(results),
        f"{'Workload':<44} {'working tree':>16} {'spread':>6} {'baseline':>16} {'spread':>6} "
        f"{'ratio':>7} {'reps':>5}  verdict",
    ]
    for row in results["rows"]:
        theirs = row.get(BASELINE)
        ours = row[PY]
        unit = row["unit"]
        if theirs is None:
            lines.append(f"{row['label']:<44} {fmt_rate(ours['value'], unit):>16}  (no baseline)")
            continue
        reps = f"{len(ours['reps'])}/{len(theirs['reps'])}"
        lines.append(
            f"{row['label']:<44} {fmt_rate(ours['value'], unit):>16} {_spread(ours):>6} "
            f"{fmt_rate(theirs['value'], unit):>16} {_spread(theirs):>6} "
            f"{row['baseline_ratio']:>6.3f}x {reps:>5}  {row['baseline_verdict']}"
        )
    return lines
