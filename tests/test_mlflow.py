"""`iolens run --mlflow` on a real training and a real MLflow store (sqlite), read back
through MLflow's own client: the verdict's tags, metric histories of more than one point
and the report artifact, in a new run, or in the run the script started itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("mlflow")
# MLflow's sqlite store uses an SQLAlchemy option that SQLAlchemy 2.1 warns of.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TRAIN = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
OWN = sys.argv[1] == "own"

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.01)  # a fetch that waits
        return torch.zeros(8), i % 2

def train():
    loader = DataLoader(Slow(), batch_size=8, num_workers=1)
    for _ in range(3):
        for x, y in loader:
            time.sleep(0.01)

if OWN:
    import mlflow
    with mlflow.start_run(run_name="the script's own") as run:
        mlflow.log_param("lr", 0.1)
        train()
        print("RUN", run.info.run_id)
else:
    train()
"""


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty sqlite tracking store, its tables made once (that takes MLflow seconds)."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


def store(empty_store: Path, tmp_path: Path) -> str:
    """A fresh copy of the empty store in ``tmp_path``: its tracking URI."""
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def run_with_mlflow(tmp_path: Path, mode: str, uri: str,
                    ) -> tuple[subprocess.CompletedProcess[str], Any]:
    from mlflow.tracking import MlflowClient

    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "iolens-test"}
    out = subprocess.run([sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out",
                          str(tmp_path / "run"), "--no-live", "--mlflow", "--",
                          sys.executable, str(tmp_path / "train.py"), mode],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr
    return out, MlflowClient(tracking_uri=uri)


def check_run(client: Any, run_id: str, run_dir: Path) -> None:
    run = client.get_run(run_id)
    tags = run.data.tags
    assert tags["iolens.verdict"] in {"loader-starved", "fetch-bound", "storage-bound",
                                      "compute-bound", "handover-bound"}, tags
    assert tags["iolens.severity"] in {"none", "moderate", "high"}
    assert tags["iolens.run_dir"] == str(run_dir)
    assert tags.get("iolens.recommendation"), tags
    for key in ("iolens.steps_per_s", "iolens.data_wait_share", "iolens.fetch_ms",
                "iolens.busiest_util"):
        history = client.get_metric_history(run_id, key)
        assert len(history) > 1, (key, history)
        assert len({m.step for m in history}) == len(history)
    # The last value (what a run table shows) is the whole run's, not its last interval's.
    summary = json.loads((run_dir / "meta.json").read_text())["summary"]
    assert run.data.metrics["iolens.steps_per_s"] == pytest.approx(
        summary["verdict"]["figures"]["steps_per_s"], rel=1e-3)
    assert run.data.metrics["iolens.data_wait_share"] == pytest.approx(
        summary["data_wait_share"], rel=1e-3)
    fetch = client.get_metric_history(run_id, "iolens.fetch_ms")
    assert any(m.value >= 9 for m in fetch), fetch  # 10 ms sleeps, timed in the worker
    arts = [a.path for a in client.list_artifacts(run_id, "iolens")]
    assert arts == ["iolens/report.html"], arts
    page = Path(client.download_artifacts(run_id, "iolens/report.html", str(run_dir.parent)))
    assert page.read_text().lstrip().lower().startswith("<!doctype html")


def test_a_new_run_in_the_experiment_mlflow_names(tmp_path: Path, empty_store: Path) -> None:
    out, client = run_with_mlflow(tmp_path, "plain", store(empty_store, tmp_path))
    exp = client.get_experiment_by_name("iolens-test")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, runs
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    check_run(client, run.info.run_id, tmp_path / "run")
    assert f"a new MLflow run {run.info.run_id}" in out.stderr, out.stderr


def test_the_scripts_own_run_gets_the_figures(tmp_path: Path, empty_store: Path) -> None:
    out, client = run_with_mlflow(tmp_path, "own", store(empty_store, tmp_path))
    theirs = next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("RUN"))
    exp = client.get_experiment_by_name("iolens-test")
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [theirs], runs  # no second run
    assert client.get_run(theirs).data.params == {"lr": "0.1"}
    check_run(client, theirs, tmp_path / "run")
    assert f"the job's MLflow run {theirs}" in out.stderr, out.stderr


def test_monitor_with_mlflow_logs_into_the_scripts_run(tmp_path: Path,
                                                        empty_store: Path) -> None:
    from mlflow.tracking import MlflowClient

    # the script's own MLflow run, and the monitor around the training inside it
    script = "import iolens\n" + textwrap.dedent(TRAIN).replace(
        'with mlflow.start_run(run_name="the script\'s own") as run:',
        'with mlflow.start_run(run_name="the script\'s own") as run, '
        'iolens.monitor(sys.argv[2], 0.5, mlflow=True):')
    assert "iolens.monitor(" in script
    (tmp_path / "train.py").write_text(script)
    uri = store(empty_store, tmp_path)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "iolens-test"}
    out = subprocess.run([sys.executable, str(tmp_path / "train.py"), "own",
                          str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    client = MlflowClient(tracking_uri=uri)
    theirs = next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("RUN"))
    exp = client.get_experiment_by_name("iolens-test")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [theirs], runs
    check_run(client, theirs, tmp_path / "run")


LIGHTNING = """
import sys, time, torch
import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger
from torch.utils.data import DataLoader, Dataset
from iolens.integrations.lightning import IolensCallback

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.ones(4), torch.ones(1)

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def training_step(self, batch, idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.lin(x), y)
        self.log("loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

logger = MLFlowLogger(experiment_name="lightning", tracking_uri=sys.argv[1])
trainer = pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=logger,
                     callbacks=[IolensCallback(sys.argv[2], interval=0.5, mlflow=True)],
                     enable_progress_bar=False, enable_checkpointing=False,
                     enable_model_summary=False, log_every_n_steps=2)
trainer.fit(Model(), DataLoader(Slow(), batch_size=8, num_workers=1))
print("RUN", logger.run_id)
"""


def test_lightnings_mlflow_logger_run_gets_the_figures(tmp_path: Path,
                                                       empty_store: Path) -> None:
    pytest.importorskip("lightning")
    from mlflow.tracking import MlflowClient

    (tmp_path / "train.py").write_text(textwrap.dedent(LIGHTNING))
    uri = store(empty_store, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    out = subprocess.run([sys.executable, str(tmp_path / "train.py"), uri,
                          str(tmp_path / "run")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    theirs = next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("RUN"))
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("lightning")
    assert exp is not None
    assert [r.info.run_id for r in client.search_runs([exp.experiment_id])] == [theirs]
    assert len(client.get_metric_history(theirs, "loss")) > 1  # the logger's own figures
    check_run(client, theirs, tmp_path / "run")


def test_a_store_that_cannot_be_used_stops_before_the_job(tmp_path: Path) -> None:
    """--mlflow whose store cannot be opened is an error line and exit 2, and the job is not
    started (the review's run said "warning: --mlflow stopped", logged nothing, exit 0)."""
    marker = tmp_path / "started"
    env = {**os.environ, "MLFLOW_TRACKING_URI": "nosuchscheme://nowhere"}
    out = subprocess.run([sys.executable, "-m", "iolens", "run", "--mlflow", "--no-live",
                          "--out", str(tmp_path / "run"), "--", sys.executable, "-c",
                          f"open({str(marker)!r}, 'w').close()"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 2, out.stderr
    assert "--mlflow cannot use its tracking store" in out.stderr, out.stderr
    assert not marker.exists()
