"""The framework callbacks: PyTorch Lightning and the Hugging Face Trainer, run for real.

The training runs are real scripts with tiny models on the CPU, in their
own interpreter as a user would run them, reading datasets that sleep a
few milliseconds per item so that the data wait dominates. The loop timer
and the import rules are tested in this process.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from iolens.rundir import records
from iolens.rundir.timing import TimingReader, TrainingAggregator
from iolens.training import _hooks
from tests.conftest import need

MS = 1_000_000
FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "transformers", "accelerate")


def run_script(tmp_path: Path, code: str, *args: str, timeout: float = 180,
               prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run([*prefix, sys.executable, str(script), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, check=False)


def run_records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def batches(run: Path) -> int:
    return sum(int(r["train"]["batches"]) for r in run_records(run))


def outcome(stdout: str, tag: str = "OUTCOME") -> Any:
    lines = [x for x in stdout.splitlines() if x.startswith(tag + " ")]
    assert lines, stdout
    return json.loads(lines[-1][len(tag) + 1:])


# -- importing ------------------------------------------------------------------------


def test_importing_iolens_and_the_package_loads_no_framework() -> None:
    code = ("import sys, iolens, iolens.integrations, iolens.integrations._common\n"
            f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture
def fresh_import(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Import the integration modules anew, and put back whatever was loaded before."""
    names = ("iolens.integrations.lightning", "iolens.integrations.huggingface")
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    yield
    for n in names:
        sys.modules.pop(n, None)
    sys.modules.update(saved)


@pytest.mark.usefixtures("fresh_import")
def test_a_missing_framework_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install 'iolens\[lightning\]'"):
        importlib.import_module("iolens.integrations.lightning")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r"pip install 'iolens\[huggingface\]'"):
        importlib.import_module("iolens.integrations.huggingface")


@pytest.mark.usefixtures("fresh_import")
def test_the_older_pytorch_lightning_name_serves_when_lightning_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    need(importlib.util.find_spec("pytorch_lightning") is not None,
         "the pytorch_lightning package is not installed")
    for name in ("lightning", "lightning.pytorch"):
        monkeypatch.setitem(sys.modules, name, None)
    mod = importlib.import_module("iolens.integrations.lightning")
    import pytorch_lightning

    assert issubclass(mod.IolensCallback, pytorch_lightning.Callback)


# -- the loop timer (pure, a fake clock) ----------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000 * MS

    def __call__(self) -> int:
        return self.t

    def advance(self, ms: int) -> None:
        self.t += ms * MS


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(_hooks, "_now", c)
    yield c
    _hooks.stop()


def drive(timer: _hooks.LoopTimer, clock: Clock, steps: int, wait_ms: int, work_ms: int) -> None:
    """An epoch of ``steps`` steps: each waits ``wait_ms`` for its batch, then works ``work_ms``."""
    timer.epoch(2)
    for _ in range(steps):
        clock.advance(wait_ms)
        timer.begin()
        clock.advance(work_ms)
        timer.end()


def test_loop_timer_counts_wait_and_step_like_the_sidecar(clock: Clock, tmp_path: Path) -> None:
    _hooks.start(str(tmp_path / "timing"))
    timer = _hooks.LoopTimer()
    assert timer.arm(object()) is True  # not a loader anything else times
    drive(timer, clock, 4, wait_ms=30, work_ms=10)
    clock.advance(500)  # validation between steps ...
    timer.end()  # ... is not data wait
    clock.advance(30)
    timer.begin()
    assert timer.batches == 5 and timer.wait_ns == 150 * MS
    assert timer.step_ns == 4 * 40 * MS - 10 * MS + 540 * MS  # the first step counts from the epoch
    _hooks.stop()
    agg = TrainingAggregator()
    assert TimingReader(str(tmp_path / "timing")).poll(agg) == 6
    out = agg.take()
    assert out["batches"] == 5 and out["epochs_started"] == 1 and out["num_workers"] == 2
    assert out["data_wait"]["sum_s"] == pytest.approx(0.150)
    assert out["step"]["sum_s"] == pytest.approx(timer.step_ns / 1e9)


def test_loop_timer_without_a_recording_only_keeps_its_totals(clock: Clock) -> None:
    timer = _hooks.LoopTimer()
    assert timer.arm(object()) is False
    drive(timer, clock, 3, wait_ms=5, work_ms=15)
    assert (timer.batches, timer.wait_ns, timer.step_ns) == (3, 15 * MS, 45 * MS)
    clock.advance(7)
    timer.begin()
    clock.advance(7)
    timer.begin()  # no end() since the last step began: no data wait is claimed
    assert (timer.batches, timer.wait_ns, timer.step_ns) == (5, 22 * MS, 74 * MS)


def test_loop_timer_leaves_loaders_the_patch_times_to_it(clock: Clock, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    class DataLoader:
        pass

    fake = ModuleType("torch.utils.data.dataloader")
    fake.DataLoader = DataLoader  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.data.dataloader", fake)
    monkeypatch.setattr(_hooks, "_patched", True)
    _hooks.start(str(tmp_path / "timing"))
    timer = _hooks.LoopTimer()
    assert timer.arm(DataLoader()) is False
    assert timer.arm([DataLoader(), {"b": DataLoader()}]) is False
    assert timer.arm(None) is False  # a loader nobody named: most likely a DataLoader
    import iolens

    assert timer.arm(iolens.instrument(range(3))) is False  # instrument() times it
    assert timer.arm({"a": DataLoader(), "b": range(3)}) is True  # one loader the patch misses
    monkeypatch.setattr(_hooks, "_patched", False)
    assert timer.arm(DataLoader()) is True
    drive(timer, clock, 2, wait_ms=1, work_ms=1)
    _hooks.stop()
    agg = TrainingAggregator()
    TimingReader(str(tmp_path / "timing")).poll(agg)
    assert agg.take()["batches"] == 2


def test_session_without_a_recording_gives_the_hooks_figures(clock: Clock) -> None:
    from iolens.integrations._common import Session

    s = Session(None, 1.0, (), (), quiet=True, hooks="test")
    s.start(main=False)  # not the main process: no monitor
    drive(s.timer, clock, 4, wait_ms=30, work_ms=10)
    # 4 steps in 150 ms (the first 30 ms from the epoch's start), 120 ms of them waiting.
    assert s.recent() == {"iolens/data_wait_share": 0.8, "iolens/steps_per_s": 26.667}
    assert s.recent() == {}
    out = s.finish()
    assert out.metrics == {"iolens/data_wait_share": 0.8, "iolens/severity_level": 2.0,
                           "iolens/steps_per_s": 26.6667, "iolens/batches": 4.0}
    assert out.text == {"iolens/verdict": "unknown", "iolens/severity": "high"}
    assert out.lines[0].startswith("data wait 80.0% of step time (high) over 4 steps")
    with pytest.raises(ValueError, match="interval"):
        Session(None, 0.0, (), (), quiet=True, hooks="test")


# -- PyTorch Lightning ------------------------------------------------------------------

LIGHTNING = textwrap.dedent("""
    import json, sys, time, torch
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, Dataset
    from iolens.integrations.lightning import IolensCallback

    class Slow(Dataset):  # 8 batches of 4, 20 ms an item: the wait outweighs a loaded step
        def __len__(self):
            return 32
        def __getitem__(self, i):
            time.sleep(0.02)
            return torch.ones(4), torch.ones(1)

    class Batches:  # not a DataLoader: 8 batches, 20 ms each
        def __len__(self):
            return 8
        def __iter__(self):
            for _ in range(8):
                time.sleep(0.02)
                yield torch.ones(4, 4), torch.ones(4, 1)

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)
        def training_step(self, batch, idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def fit(logdir, loader, **kw):
        cb = IolensCallback(interval=0.2, log_every_n_steps=2, **kw)
        trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1,
                             logger=CSVLogger(logdir, name="logs"), callbacks=[cb],
                             enable_progress_bar=False, enable_checkpointing=False,
                             enable_model_summary=False, log_every_n_steps=2)
        trainer.fit(Model(), loader)
        o = cb.outcome
        print("OUTCOME", json.dumps({"metrics": o.metrics, "text": o.text, "lines": o.lines,
                                     "steps": trainer.global_step, "run_dir": cb.run_dir}))

    mode, out = sys.argv[1], sys.argv[2]
    if mode == "dataloader":
        fit(out, DataLoader(Slow(), batch_size=4), out=out + "/run")
    elif mode == "iterable":
        fit(out, Batches(), out=out + "/run")
    elif mode == "nested":
        import iolens
        with iolens.monitor(out=out + "/outer", interval=0.2):
            fit(out, DataLoader(Slow(), batch_size=4), out=out + "/run")
    elif mode == "unwritable":
        fit(out, DataLoader(Slow(), batch_size=4), out=sys.argv[3])
        import iolens.api
        def boom(self):
            raise RuntimeError("no monitor today")
        iolens.api.Monitor.start = boom
        fit(out, DataLoader(Slow(), batch_size=4), out=out + "/never")
""")


def csv_metrics(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open() as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def lightning() -> None:
    need(importlib.util.find_spec("lightning") is not None, "PyTorch Lightning is not installed")


@pytest.mark.usefixtures("lightning")
def test_lightning_callback_records_the_run_and_logs_the_verdict(tmp_path: Path) -> None:
    out = run_script(tmp_path, LIGHTNING, "dataloader", str(tmp_path))
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    meta = json.loads((run / "meta.json").read_text())
    assert meta["mode"] == "monitor" and meta["summary"]["verdict"]["class"] != "no-steps"
    # 2 epochs x 8 batches, timed by the DataLoader patch; the callback adds none of its own.
    assert batches(run) == 16
    got = outcome(out.stdout)
    assert got["steps"] == 16 and got["run_dir"] == str(run)
    assert got["metrics"]["iolens/data_wait_share"] == round(
        meta["summary"]["verdict"]["data_wait_share"], 4)
    assert 0.5 < got["metrics"]["iolens/data_wait_share"] <= 1
    assert got["metrics"]["iolens/severity_level"] == 2 and got["metrics"]["iolens/batches"] == 16
    assert got["metrics"]["iolens/steps_per_s"] > 0
    assert got["text"]["iolens/severity"] == "high"
    # The logger has the figures every 2 steps, then the run's at the end.
    rows = csv_metrics(tmp_path / "logs" / "version_0" / "metrics.csv")
    shares = [float(r["iolens/data_wait_share"]) for r in rows if r["iolens/data_wait_share"]]
    assert len(shares) == 9 and all(0 < s <= 1 for s in shares)
    assert float(rows[-1]["iolens/data_wait_share"]) == got["metrics"]["iolens/data_wait_share"]
    hparams = (tmp_path / "logs" / "version_0" / "hparams.yaml").read_text()
    assert f"iolens/verdict: {got['text']['iolens/verdict']}" in hparams
    # The verdict lines are printed as monitor() prints them, and kept for the logging.
    assert "iolens: recording to" in out.stderr
    assert f"iolens: {got['lines'][0]}" in out.stderr and got["lines"][0].startswith("verdict: ")
    assert got["lines"][-1] == f"full report: iolens report {run}"


@pytest.mark.usefixtures("lightning")
def test_lightning_callback_times_other_loaders_from_its_hooks(tmp_path: Path) -> None:
    out = run_script(tmp_path, LIGHTNING, "iterable", str(tmp_path))
    assert out.returncode == 0, out.stderr
    recs = run_records(tmp_path / "run")
    assert sum(r["train"]["batches"] for r in recs) == 16
    assert sum(r["train"]["epochs_started"] for r in recs) == 2
    waits = [r["train"]["data_wait"]["p50_s"] for r in recs if r["train"]["batches"]]
    assert all(0.015 < w < 0.2 for w in waits), waits  # the 20 ms each batch takes to arrive
    assert outcome(out.stdout)["metrics"]["iolens/data_wait_share"] > 0.5


@pytest.mark.usefixtures("lightning")
def test_lightning_callback_under_iolens_run_counts_each_batch_once(tmp_path: Path) -> None:
    out = run_script(tmp_path, LIGHTNING, "dataloader", str(tmp_path),
                     prefix=(sys.executable, "-m", "iolens", "run", "--interval", "0.2",
                             "--out", str(tmp_path / "outer"), "--no-live", "--"))
    assert out.returncode == 0, out.stderr
    assert f"already recorded into {tmp_path / 'outer'}" in out.stderr
    assert not (tmp_path / "run").exists()  # no second recording
    assert batches(tmp_path / "outer") == 16
    got = outcome(out.stdout)
    assert got["run_dir"] == str(tmp_path / "outer")
    assert 0 < got["metrics"]["iolens/data_wait_share"] <= 1
    assert got["lines"][0].startswith(("verdict so far: ", "data wait "))
    assert "iolens: verdict: " in out.stderr  # iolens run's own, at the end


@pytest.mark.usefixtures("lightning")
def test_lightning_callback_inside_a_monitor_block_records_once(tmp_path: Path) -> None:
    out = run_script(tmp_path, LIGHTNING, "nested", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert f"already recorded into {tmp_path / 'outer'}" in out.stderr
    assert not (tmp_path / "run").exists()
    assert batches(tmp_path / "outer") == 16
    got = outcome(out.stdout)
    assert got["run_dir"] == str(tmp_path / "outer")
    assert got["lines"][0].startswith(("verdict so far: ", "data wait "))
    assert "iolens: verdict: " in out.stderr  # the monitor's own, when its block ends


@pytest.mark.usefixtures("lightning")
def test_lightning_training_goes_on_when_monitoring_cannot(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = run_script(tmp_path, LIGHTNING, "unwritable", str(tmp_path), str(blocker / "run"))
    assert out.returncode == 0, out.stderr
    first, second = [json.loads(x.split(" ", 1)[1]) for x in out.stdout.splitlines()
                     if x.startswith("OUTCOME ")]
    # An unwritable out: the monitor records elsewhere, as monitor() does.
    assert "cannot create" in out.stderr and first["steps"] == 16
    assert first["run_dir"] and batches(Path(first["run_dir"])) == 16
    shutil.rmtree(first["run_dir"])  # the fallback folder under the temporary directory
    # A monitor that fails outright: training completes on the hooks' figures alone.
    assert "monitoring did not start" in out.stderr and second["steps"] == 16
    assert second["run_dir"] is None and not (tmp_path / "never").exists()
    assert second["text"]["iolens/verdict"] == "unknown"
    assert 0.5 < second["metrics"]["iolens/data_wait_share"] <= 1
    assert second["lines"][0].endswith("no recording, so no verdict")


# -- the Hugging Face Trainer ----------------------------------------------------------

HUGGINGFACE = textwrap.dedent("""
    import json, sys, time, torch
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments
    from iolens.integrations.huggingface import IolensCallback

    class Slow(Dataset):  # 8 batches of 4, 20 ms an item: the wait outweighs a loaded step
        def __len__(self):
            return 32
        def __getitem__(self, i):
            time.sleep(0.02)
            return {"x": torch.ones(4), "labels": torch.ones(1)}

    class Model(torch.nn.Module):  # built here: nothing is downloaded
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)
        def forward(self, x, labels=None):
            out = self.lin(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    out = sys.argv[1]
    cb = IolensCallback(out=out + "/run", interval=0.2)
    args = TrainingArguments(output_dir=out + "/hf", num_train_epochs=2,
                             per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             report_to=[], use_cpu=True, dataloader_num_workers=0,
                             save_strategy="no", logging_steps=2, disable_tqdm=True)
    trainer = Trainer(model=Model(), args=args, train_dataset=Slow(), callbacks=[cb])
    trainer.train()
    o = cb.outcome
    print("OUTCOME", json.dumps({"metrics": o.metrics, "text": o.text, "lines": o.lines,
                                 "steps": trainer.state.global_step, "run_dir": cb.run_dir}))
    print("HISTORY", json.dumps(trainer.state.log_history))
""")


def test_huggingface_callback_records_the_run_and_logs_the_verdict(tmp_path: Path) -> None:
    need(importlib.util.find_spec("transformers") is not None, "transformers is not installed")
    need(importlib.util.find_spec("accelerate") is not None,
         "the Hugging Face Trainer needs accelerate (pip install 'transformers[torch]')")
    out = run_script(tmp_path, HUGGINGFACE, str(tmp_path))
    assert out.returncode == 0, out.stderr
    run = tmp_path / "run"
    # 2 epochs x 8 batches, 2 batches per optimizer step: every batch counted once.
    assert batches(run) == 16
    got = outcome(out.stdout)
    assert got["steps"] == 8 and got["run_dir"] == str(run)
    meta = json.loads((run / "meta.json").read_text())
    assert got["metrics"]["iolens/data_wait_share"] == round(
        meta["summary"]["verdict"]["data_wait_share"], 4)
    assert 0.5 < got["metrics"]["iolens/data_wait_share"] <= 1
    assert got["metrics"]["iolens/batches"] == 16 and got["text"]["iolens/severity"] == "high"
    history = outcome(out.stdout, "HISTORY")
    periodic = [h for h in history if "loss" in h]
    assert [h["step"] for h in periodic] == [2, 4, 6, 8]
    assert all(0 < h["iolens/data_wait_share"] <= 1 for h in periodic), periodic
    final = history[-1]
    assert final["iolens/verdict"] == got["text"]["iolens/verdict"] != "unknown"
    assert final["iolens/data_wait_share"] == got["metrics"]["iolens/data_wait_share"]
    assert "'iolens/data_wait_share'" in out.stdout  # the Trainer printed it with its logs
    assert f"iolens: {got['lines'][0]}" in out.stderr


# -- the per-step cost -------------------------------------------------------------------


def test_loop_timer_steps_cost_little(tmp_path: Path) -> None:
    """Tens of microseconds per step would show; the hooks' part stays near a microsecond."""
    code = textwrap.dedent("""
        import time
        from iolens.training import _hooks
        _hooks.start(__import__("sys").argv[1])
        t = _hooks.LoopTimer()
        t.arm(object())
        t.epoch()
        begin, end = t.begin, t.end
        n = 200_000
        t0 = time.perf_counter()
        for _ in range(n):
            begin()
            end()
        print((time.perf_counter() - t0) / n * 1e9)
        _hooks.stop()
    """)
    out = run_script(tmp_path, code, str(tmp_path / "timing"))
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 10_000  # ns per step, with a wide margin for a loaded machine
    (written,) = (tmp_path / "timing").glob("*.bin")
    assert written.stat().st_size == (1 + 200_000) * records.RECORD_BYTES  # the epoch, the steps
