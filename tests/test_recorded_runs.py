"""The reports of recorded runs are kept: a change to the analysis that changes one says so.

Each folder in tests/fixtures/runs/ is a run directory recorded by `iolens run` in a lab
case (its meta.json, records.jsonl, per-batch timing and, where there was one, storage
probe), and beside it ``<name>.report.json`` holds what `iolens report --format json`
printed for it. The run is read from a copy, and its report compared with the one kept
after the copy's path is written RUN and each float is rounded to 6 significant digits.

A change that is meant to change a report (the work on the predictions, a new finding)
rewrites the kept ones with ``IOLENS_UPDATE_RECORDED=1`` and shows the difference in its
commit; a change that is not (a refactoring of the analysis) passes as it is. The same
holds for what `iolens compare --format json` printed for pairs of them, kept in
tests/fixtures/compare/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

RUNS = Path(__file__).parent / "fixtures" / "runs"
NAMES = sorted(p.name for p in RUNS.iterdir() if p.is_dir())


def _normal(x: Any, path: str) -> Any:
    if isinstance(x, dict):
        return {k: _normal(v, path) for k, v in x.items()}
    if isinstance(x, list):
        return [_normal(v, path) for v in x]
    if isinstance(x, str):
        return x.replace(path, "RUN")
    if isinstance(x, float):
        return float(f"{x:.6g}")
    return x


def _differences(want: Any, got: Any, where: str = "") -> list[str]:
    """Where ``got`` differs from ``want``: a JSON path and both values, each."""
    if isinstance(want, dict) and isinstance(got, dict):
        return [d for k in sorted(set(want) | set(got), key=str)
                for d in _differences(want.get(k, "<absent>"), got.get(k, "<absent>"),
                                      f"{where}.{k}")]
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [d for i, (a, b) in enumerate(zip(want, got, strict=True))
                for d in _differences(a, b, f"{where}[{i}]")]
    return [] if want == got else [f"{where}: kept {want!r}, now {got!r}"]


def report(run: Path) -> Any:
    out = subprocess.run([sys.executable, "-m", "iolens", "report", str(run), "--format",
                          "json"], capture_output=True, text=True, timeout=120, check=True)
    return _normal(json.loads(out.stdout), str(run))


def test_there_are_recorded_runs() -> None:
    assert len(NAMES) >= 11, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_a_recorded_runs_report_is_the_one_kept(tmp_path: Path, name: str) -> None:
    run = tmp_path / name
    shutil.copytree(RUNS / name, run)
    got = report(run)
    kept = RUNS / f"{name}.report.json"
    if os.environ.get("IOLENS_UPDATE_RECORDED") == "1":
        kept.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(kept.read_text())
    differences = _differences(want, got)
    assert not differences, "\n".join(differences[:40])
    # the report reads the run and writes nothing into it
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == sorted(
        p.relative_to(RUNS / name) for p in (RUNS / name).rglob("*"))


# `iolens compare` of pairs of recorded runs, kept the same way: each pair as recorded
# (every batch's timing) and with the timing left out (the intervals' figures alone).
PAIRS = [("remote-waits-no-workers", "remote-waits-one-worker", True),
         ("hdf5-read-a-row-at-a-time", "request-capped-disk", False),
         ("jpeg-six-workers-two-cores", "compute-bound-cached-data", True),
         ("nothing-worth-changing", "idle-workers-behind-the-hand-over", False)]
COMPARED = RUNS.parent / "compare"


@pytest.mark.parametrize(("base", "new", "timing"), PAIRS)
def test_a_comparison_of_recorded_runs_is_the_one_kept(tmp_path: Path, base: str, new: str,
                                                       timing: bool) -> None:
    runs = []
    for side, name in (("BASE", base), ("NEW", new)):
        run = tmp_path / side
        shutil.copytree(RUNS / name, run)
        if not timing:
            shutil.rmtree(run / "timing")
        runs.append(run)
    out = subprocess.run([sys.executable, "-m", "iolens", "compare", *map(str, runs),
                          "--format", "json"], capture_output=True, text=True, timeout=120,
                         check=True)
    got = _normal(_normal(json.loads(out.stdout), str(runs[0])), str(runs[1]))
    kept = COMPARED / f"{base}--{new}{'' if timing else '--intervals'}.json"
    if os.environ.get("IOLENS_UPDATE_RECORDED") == "1":
        COMPARED.mkdir(exist_ok=True)
        kept.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    differences = _differences(json.loads(kept.read_text()), got)
    assert not differences, "\n".join(differences[:40])
