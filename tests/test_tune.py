"""`iolens tune`: on a CPU-bound loader it finds more workers than none, and reports the rate
of every setting it tried; bad arguments are usage errors (exit 2) with a clear message."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from iolens.cli import tune as tune_cmd

pytest.importorskip("torch")

DATA = """
import time, torch
from torch.utils.data import Dataset

class Burn(Dataset):
    # samples in memory, each costing about 5 ms of CPU (a decode and augmentation)
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        x = torch.full((3, 32, 32), float(i % 7))
        end = time.process_time() + 0.005
        while time.process_time() < end:
            x = x.flip(1)
        return x, i % 4

def make():
    return Burn()

def not_a_dataset():
    return [1, 2, 3]

def empty():
    return torch.utils.data.TensorDataset(torch.zeros(0, 3))

def broken():
    raise RuntimeError("no data here")

class Failing(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        raise ValueError("corrupt sample")

def failing():
    return Failing()
"""


@pytest.fixture
def data_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module in the current folder defining the datasets above; its name."""
    name = f"tune_data_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(DATA))
    (tmp_path / "empty" / "class0").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return name


def tune_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = tune_cmd.main([*args, "--format", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    result: dict[str, Any] = json.loads(out.out)
    return result


def test_a_cpu_bound_loader_is_best_with_workers(data_module: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    r = tune_json(capsys, "--dataset", f"{data_module}:make", "--seconds", "1",
                  "--max-workers", "2", "--batch-size", "16", "--quiet")
    tried = [(s["num_workers"], s["samples_per_s"]) for s in r["settings"]]
    assert [n for n, _ in tried][:3] == [0, 1, 2], tried
    assert all(rate > 0 for _, rate in tried)
    rate = dict(tried[:3])
    assert r["best"]["num_workers"] == 2, tried
    # Two workers on two cores do about twice the per-sample work of one.
    assert r["best"]["samples_per_s"] >= 1.3 * rate[0], tried
    assert r["gain_over_no_workers"] >= 1.3
    assert any("pin_memory skipped" in n for n in r["notes"])  # no CUDA here
    assert r["cores"]["usable"] >= 1 and r["max_workers"] == 2


def test_text_output_has_each_rate_the_best_and_the_loader_line(
        data_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = tune_cmd.main(["--dataset", f"{data_module}:make", "--seconds", "0.3",
                          "--max-workers", "1", "--batch-size", "8"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "samples/s" in out.out and "best: num_workers=" in out.out
    assert "DataLoader(dataset, batch_size=8, num_workers=" in out.out
    # Not a terminal: the progress is plain lines on stderr, one per setting.
    lines = [ln for ln in out.err.splitlines() if ln.startswith("iolens tune: [")]
    assert lines and "samples/s" in lines[0]


def test_a_folder_of_files_tunes_without_code(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for c in range(2):
        (tmp_path / f"class{c}").mkdir()
        for i in range(40):
            (tmp_path / f"class{c}" / f"{i}.bin").write_bytes(os.urandom(4096))
    r = tune_json(capsys, "--folder", str(tmp_path), "--seconds", "0.3", "--max-workers", "1",
                  "--batch-size", "8", "--shape", "1,32,32", "-q")
    assert "80 files, raw decode to 1x32x32" in r["dataset"]
    assert all(s["samples_per_s"] > 0 for s in r["settings"])


def test_the_worker_steps_and_the_simplest_best() -> None:
    from iolens.loaderbench.measure import Cores, Rate
    from iolens.loaderbench.tune import Setting, Trial, TuneResult, worker_steps

    assert worker_steps(0) == [0]
    assert worker_steps(2) == [0, 1, 2]
    assert worker_steps(5) == [0, 1, 2, 3, 4, 5]
    assert worker_steps(10) == [0, 1, 2, 3, 4, 6, 8, 10]
    result = TuneResult("x", 8, 1.0, Cores(4, 0.0, 4), 4, False)
    for n, rate in ((0, 100.0), (2, 300.0), (4, 305.0)):
        result.trials.append(Trial(Setting(n, 2 if n else None), Rate(int(rate), 1, 1.0, 1, 0)))
    assert result.best().setting.num_workers == 2  # 4 workers are within noise of 2


@pytest.mark.parametrize(("args", "message"), [
    (["--dataset", "no_colon"], "expected MODULE:FACTORY"),
    (["--dataset", "no_such_module_iolens:make"], "cannot import no_such_module_iolens"),
    (["--dataset", "{mod}:missing"], "has no attribute 'missing'"),
    (["--dataset", "{mod}:not_a_dataset"], "returned a list, not a torch.utils.data.Dataset"),
    (["--dataset", "{mod}:empty"], "empty Dataset"),
    (["--dataset", "{mod}:broken"], "RuntimeError: no data here"),
    (["--folder", "/no/such/folder"], "--folder /no/such/folder: no such folder"),
    (["--folder", "empty"], "no sample files"),
    (["--dataset", "{mod}:make", "--seconds", "0"], "--seconds must be above 0"),
    (["--dataset", "{mod}:make", "--max-workers", "-1"], "--max-workers must be 0 or more"),
    (["--dataset", "{mod}:make", "--shape", "3,64"], "expected C,H,W"),
    (["--dataset", "{mod}:make", "--step-cpu-ms", "5"], "--step-cpu-ms goes with --step-ms"),
    (["--dataset", "{mod}:make", "--step-ms", "0"], "--step-ms must be above 0"),
    (["--dataset", "{mod}:make", "--step-ms", "5", "--step-cpu-ms", "9"],
     "--step-cpu-ms between 0 and it"),
    (["--dataset", "{mod}:make", "--run", "/no/such/run"], "--run /no/such/run: "),
    (["--dataset", "{mod}:make", "--run", "x", "--step-ms", "5"], "not allowed with"),
    ([], "one of the arguments --dataset --folder is required"),
])
def test_bad_arguments_exit_2_with_a_message(data_module: str, args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.replace("{mod}", data_module) for a in args]
    assert tune_cmd.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.startswith("usage: iolens tune")


def test_a_dataset_that_fails_while_read_exits_1(data_module: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert tune_cmd.main(["--dataset", f"{data_module}:failing", "--max-workers", "0",
                          "--seconds", "0.2", "-q"]) == 1
    assert "ValueError: corrupt sample" in capsys.readouterr().err


def test_the_stand_in_step_takes_its_cpu_then_sleeps() -> None:
    import time

    from iolens.loaderbench.tune import StepLoad

    step = StepLoad(0.05, 0.02, "test")
    cpu, wall = time.thread_time(), time.monotonic()
    step(None)
    cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
    assert 0.02 <= cpu < 0.04 and wall >= 0.05, (cpu, wall)


def test_beside_a_step_the_rate_is_the_trainings_and_alone_it_says_so(
        data_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The review followed `iolens tune`'s best (measured with nothing else on the cores)
    and the training got slower. Beside a stand-in step, no setting delivers more samples
    than the step lets the loop take; alone, the output says it measured the loader alone."""
    args = ["--dataset", f"{data_module}:make", "--seconds", "0.5", "--max-workers", "1",
            "--batch-size", "8", "-q"]
    beside = tune_json(capsys, *args, "--step-ms", "100", "--step-cpu-ms", "20")
    assert beside["step"] == {"step_s": 0.1, "cpu_s": 0.02, "source": "from --step-ms"}
    # at most a batch of 8 per 100 ms step: 80 samples/s
    assert all(s["samples_per_s"] <= 80 * 1.02 for s in beside["settings"]), beside
    assert not any("loader alone" in n for n in beside["notes"]), beside["notes"]
    alone = tune_json(capsys, *args)
    assert alone["step"] is None
    assert any("measured the loader alone" in n and "--run RUN" in n
               for n in alone["notes"]), alone["notes"]
    assert max(s["samples_per_s"] for s in alone["settings"]) > 1.3 * 80, alone


def test_run_takes_the_step_from_a_recorded_run(data_module: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import time, torch
        from torch.utils.data import DataLoader, TensorDataset
        data = TensorDataset(torch.zeros(4096, 8))
        end = time.monotonic() + 4
        while time.monotonic() < end:
            for x in DataLoader(data, batch_size=16, num_workers=1, persistent_workers=True):
                time.sleep(0.03)  # the step: 30 ms, asleep (as a wait on a GPU)
                if time.monotonic() > end:
                    break
    """))
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "iolens", "run", "--no-live", "--out", str(run),
                    "--", sys.executable, str(script)], capture_output=True, text=True,
                   timeout=120, check=True)
    r = tune_json(capsys, "--dataset", f"{data_module}:make", "--seconds", "0.3",
                  "--max-workers", "0", "--batch-size", "8", "-q", "--run", str(run))
    step = r["step"]
    assert step["source"] == f"from {run}"
    assert step["step_s"] == pytest.approx(0.03, rel=0.25), step
    assert step["cpu_s"] < 0.5 * step["step_s"], step  # the step sleeps
