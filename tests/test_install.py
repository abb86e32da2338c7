"""Installing iolens as a user does: `pip install -e '.[all]'` into a fresh virtualenv gives
no warning of a missing extra, and every optional part it promises then imports; a wheel
built from the checkout declares the same extras."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ["lmdb", "h5py", "webdataset", "plotly", "prometheus_client", "tensorboard",
            "mlflow", "wandb", "pynvml"]


def test_the_all_extra_installs_every_optional_part_but_torch(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    out = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "-e",
                          f"{ROOT}[all]"], capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "does not provide the extra" not in out.stderr + out.stdout, out.stderr[-3000:]
    code = ("import importlib, sys\n"
            f"for name in {OPTIONAL!r}:\n"
            "    importlib.import_module(name)\n"
            "import iolens, iolens.data, iolens.pack\n"
            "print('torch' in sys.modules, end='')\n")
    got = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120,
                         check=False)
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout == "False"
    torch = subprocess.run([py, "-c", "import torch"], capture_output=True, timeout=60,
                           check=False)
    assert torch.returncode != 0, "the all extra must leave torch to the user's own install"
    cli = subprocess.run([str(venv / "bin" / "iolens"), "pack", "--help"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert cli.returncode == 0 and "webdataset" in cli.stdout, cli.stderr


def test_mlflow_on_its_own_defaults_with_only_the_mlflow_extra(tmp_path: Path) -> None:
    """`pip install 'iolens[mlflow]'` alone, and --mlflow with no MLFLOW_* setting (since
    MLflow 3 a sqlite mlflow.db in the current directory): the run is logged, and MLflow's
    client reads it back (the review's: "Model registry functionality is unavailable",
    nothing logged, exit 0)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    out = subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "-e",
                          f"{ROOT}[mlflow]"], capture_output=True, text=True, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    run = subprocess.run([str(venv / "bin" / "iolens"), "run", "--mlflow", "--no-live",
                          "--out", "run", "--", py, "-c", "import time; time.sleep(1)"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert run.returncode == 0 and "MLflow: figures, verdict and report in a new MLflow run" \
        in run.stderr, run.stderr[-3000:]
    read = ("from mlflow.tracking import MlflowClient\n"
            "c = MlflowClient()\n"
            "runs = [r for e in c.search_experiments() for r in c.search_runs([e.experiment_id])]\n"
            "print(len(runs), runs[0].data.tags['iolens.verdict'], "
            "[a.path for a in c.list_artifacts(runs[0].info.run_id, 'iolens')])\n")
    back = subprocess.run([py, "-c", read], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert back.returncode == 0, back.stderr[-3000:]
    assert back.stdout.split(" ", 2)[0] == "1" and "iolens/report" in back.stdout, back.stdout


def test_a_wheel_declares_the_extras(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, timeout=300,
                   capture_output=True)
    wheel = next(tmp_path.glob("iolens-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.message_from_bytes(z.read(meta))
        names = z.namelist()
    extras = set(msg.get_all("Provides-Extra") or [])
    assert {"all", "pack", "html", "prometheus", "tensorboard", "gpu", "mlflow",
            "wandb"} <= extras, extras
    needs = msg.get_all("Requires-Dist") or []
    assert not any(r.startswith("torch") and "all" in r for r in needs), needs
    assert "iolens/py.typed" in names and "iolens/_bootstrap/sitecustomize.py" in names
