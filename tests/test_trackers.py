"""What `iolens run --mlflow` and `--wandb` share: a missing package stops the command
before the job starts, and a tracker that fails during the run is dropped with a note
while the job and the rest of the recording go on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.test_mlflow import TRAIN

# Each tracker's package, its install hint, and a setting of its own that makes it fail
# once the run has started (its store opens before the job starts: an experiment that is
# not there fails only when the run is made in it). "{tmp}" is the test's folder.
TRACKERS = {
    "mlflow": ("MLflow", "mlflow", {"MLFLOW_TRACKING_URI": "sqlite:///{tmp}/mlflow.db",
                                    "MLFLOW_EXPERIMENT_ID": "424242"}),
    "wandb": ("W&B", "wandb", {"WANDB_MODE": "no-such-mode"}),
}


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_without_its_package_the_job_is_not_started(tmp_path: Path, name: str) -> None:
    label, package, _ = TRACKERS[name]
    code = ("import importlib.util, sys\n"
            "real = importlib.util.find_spec\n"
            f"importlib.util.find_spec = lambda n, *a: None if n == {package!r} "
            "else real(n, *a)\n"
            "from iolens.cli import main\n"
            f"sys.exit(main(['run', '--{name}', '--', 'true']))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert f"--{name} needs {label}: pip install 'iolens[{name}]'" in out.stderr
    assert "the job was not started" in out.stderr


@pytest.mark.parametrize("name", sorted(TRACKERS))
def test_a_tracker_that_fails_is_dropped_with_a_note_and_the_job_runs_on(
        tmp_path: Path, name: str) -> None:
    _, package, breaks = TRACKERS[name]
    pytest.importorskip(package)
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_"))}
    env.update({k: v.format(tmp=tmp_path) for k, v in breaks.items()}, HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out",
                          str(tmp_path / "run"), "--no-live", f"--{name}", "--",
                          sys.executable, str(tmp_path / "train.py"), "plain"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr
    notes = json.loads((tmp_path / "run" / "meta.json").read_text())["notes"]
    assert any(n.startswith(f"--{name} stopped: ") and "the run goes on without it" in n
               for n in notes), notes
    assert f"warning: --{name} stopped" in out.stderr
    assert "iolens: verdict: " in out.stderr  # the rest of the run is whole
