"""`iolens run` on real PyTorch training scripts, unmodified."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis import rules

pytest.importorskip("torch")

TRAIN = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 48
        def __getitem__(self, i):
            time.sleep(0.03)  # a slow input pipeline: the loop waits for data
            return torch.randn(8), i % 2

    if __name__ == "__main__":
        workers = int(sys.argv[1])
        loader = DataLoader(Slow(), batch_size=8, num_workers=workers)
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
        print("trained", flush=True)
        sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
""")


def iolens_run(tmp_path: Path, *args: str, timeout: float = 120,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iolens", "run", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def records(run: Path) -> list[dict[str, Any]]:
    lines = (run / "records.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]  # every line must parse


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def test_real_training_is_timed_without_code_change(tmp_path: Path, script: Path) -> None:
    out = iolens_run(tmp_path, "--out", "run", "--interval", "0.2", "--", sys.executable,
                     str(script), "2")
    assert out.returncode == 0, out.stderr
    assert "trained" in out.stdout  # the job's own output passes through
    run = tmp_path / "run"
    recs = records(run)
    assert len(recs) >= 3
    batches = sum(r["train"]["batches"] for r in recs)
    epochs = sum(r["train"]["epochs_started"] for r in recs)
    assert (batches, epochs) == (12, 2)  # 48 samples / 8 per batch, twice
    waits = [r["train"]["data_wait"] for r in recs if r["train"]["batches"]]
    assert all(w["p50_s"] <= w["p95_s"] <= w["max_s"] for w in waits)
    assert max(r["job"]["roles"].get("worker", {}).get("pids", 0) for r in recs) == 2
    for r in recs:
        assert set(r["cpu"]) == {"user", "system", "iowait", "idle", "steal"}
        assert r["mem"]["cached_bytes"] > 0
        for role in r["job"]["roles"].values():
            assert role["cache_hit"] is None or 0.0 <= role["cache_hit"] <= 1.0
            # processes in state D by role, at most one sample each (NOTE [blocked by role])
            assert 0 <= role["blocked"] <= role["pids"], role
        assert "blocked" not in r["job"]  # (the job's: states["D"])
    meta = json.loads((run / "meta.json").read_text())
    assert meta["exit_code"] == 0 and meta["command"][-2:] == [str(script), "2"]
    assert meta["timing"][0]["installed"] is True
    assert meta["gpu"]["available"] is bool(meta["gpu"]["names"])
    assert meta["gpu"]["available"] or meta["gpu"]["reason"]  # no GPU is said, with why
    # the machine's pace, timed by the recorder (NOTE [the machine's pace]): well under the
    # 5 ms of one core it would take on a machine 10x slower than the lab's
    assert 0 < meta["pace_s"] < 10 * rules.PACE_LAB_S, meta["pace_s"]
    share = meta["summary"]["data_wait_share"]
    assert share > 0.5 and meta["summary"]["severity"] == "high"
    assert "data wait" in out.stderr and "run directory" in out.stderr


def test_exit_codes_pass_through(tmp_path: Path, script: Path) -> None:
    assert iolens_run(tmp_path, "--", sys.executable, str(script), "0", "3").returncode == 3
    killed = iolens_run(tmp_path, "--", sys.executable, "-c",
                        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == 128 + signal.SIGKILL
    missing = iolens_run(tmp_path, "--", "no-such-program-xyz")
    assert missing.returncode == 2 and "command not found" in missing.stderr


def test_sigterm_reaches_the_job(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "iolens", "run", "--out", "r", "--interval", "0.1", "--",
         sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    assert meta["signals_received"] == ["SIGTERM"] and meta["signal"] == signal.SIGTERM


def test_job_survives_the_sidecar_being_killed(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    code = f"import time; time.sleep(1.5); open({str(marker)!r}, 'w').write('ok')"
    proc = subprocess.Popen([sys.executable, "-m", "iolens", "run", "--out", "r", "--interval",
                             "0.1", "--", sys.executable, "-c", code], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    meta_path = tmp_path / "r" / "meta.json"
    for _ in range(100):  # the recorder is under way once its first meta.json is there
        if meta_path.exists():
            break
        time.sleep(0.05)
    time.sleep(0.3)
    proc.kill()
    proc.wait(timeout=10)
    for _ in range(100):
        if marker.exists():
            break
        time.sleep(0.1)
    assert marker.read_text() == "ok"
    assert records(tmp_path / "r")  # what was written before the kill parses
    # The first meta.json names the spare timing folder, which the job makes only when the
    # run directory fails it: a killed recorder leaves nothing behind.
    spare = json.loads(meta_path.read_text())["timing_spare"]
    assert spare and not Path(spare).exists()


def test_unwritable_out_falls_back_and_the_job_runs(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    out = iolens_run(tmp_path, "--out", "file/run", "--", sys.executable, "-c", "print('hi')")
    fallback = out.stderr.split("; recording to ", 1)[-1].split()[0] if out.stderr else ""
    if fallback.startswith(tempfile.gettempdir()):
        shutil.rmtree(fallback, ignore_errors=True)
    assert out.returncode == 0 and "hi" in out.stdout
    assert "cannot create file/run" in out.stderr and "recording to" in out.stderr


def test_existing_sitecustomize_still_runs(tmp_path: Path, script: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"open({str(tmp_path / 'user-site-ran')!r}, 'w').write('yes')\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    out = iolens_run(tmp_path, "--out", "run", "--", sys.executable, str(script), "0",
                     env={"PYTHONPATH": path})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "user-site-ran").read_text() == "yes"
    assert sum(r["train"]["batches"] for r in records(tmp_path / "run")) == 12


def test_bad_arguments() -> None:
    cases: list[tuple[list[str], str]] = [
        (["--interval", "0.01", "--", "true"], "between 0.05 and 60"),
        (["--"], "no command"),
        (["--device", "nvme99n9", "--", "true"], "unknown device"),
        (["--linger", "-1", "--", "true"], "--linger must be between 0 and 3600"),
    ]
    for args, text in cases:
        out = subprocess.run([sys.executable, "-m", "iolens", "run", *args], capture_output=True,
                             text=True, check=False)
        assert out.returncode == 2 and text in out.stderr


def test_linger_zero_stops_with_the_job(tmp_path: Path) -> None:
    """--linger 0: a process the job leaves running does not hold iolens run."""
    job = ("import os, sys, time\n"
           "if os.fork() == 0:\n"
           "    null = os.open(os.devnull, os.O_WRONLY)\n"  # (not holding the test's pipes)
           "    os.dup2(null, 1); os.dup2(null, 2)\n"
           "    os.setsid(); time.sleep(60); os._exit(0)\n"
           "sys.exit(4)\n")
    t0 = time.monotonic()
    out = iolens_run(tmp_path, "--out", "run", "--no-live", "--interval", "0.1", "--linger", "0",
                     "--", sys.executable, "-c", job)
    took = time.monotonic() - t0
    assert out.returncode == 4, out.stderr
    assert took < 30, took  # the grandchild sleeps 60 s
    assert "left running" not in out.stderr
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["exit_code"] == 4


def test_the_demo_training_under_iolens_run(tmp_path: Path) -> None:
    out = iolens_run(tmp_path, "--out", "demo", "--interval", "0.2", "--", sys.executable, "-m",
                     "iolens.demo", "--data", str(tmp_path / "data"), "--files", "96",
                     "--epochs", "2", "--batch-size", "16")
    assert out.returncode == 0, out.stderr
    assert "epoch 2/2: 96 samples" in out.stdout
    recs = records(tmp_path / "demo")
    assert sum(r["train"]["batches"] for r in recs) == 12
    assert "data wait" in out.stderr


def test_full_disk_under_the_run_directory(tmp_path: Path) -> None:
    from tests.conftest import need

    need(os.geteuid() == 0, "needs root to mount a tiny filesystem")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(small)], check=True)
    try:
        out = iolens_run(tmp_path, "--out", str(small / "run"), "--interval", "0.1", "--",
                         sys.executable, "-c", "import time; time.sleep(2); print('done')")
        assert out.returncode == 0
        assert "done" in out.stdout
        data = (small / "run" / "records.jsonl").read_bytes()
        assert data.endswith(b"\n")  # no torn last line: short writes are cut back
        for line in data.splitlines():
            json.loads(line)
        # NOTE [unsaved records]: the whole run is saved elsewhere, and said so.
        copy = out.stderr.split("the whole run is saved in ", 1)[1].split()[0]
        try:
            seqs = [r["seq"] for r in records(Path(copy))]
            assert seqs == list(range(len(seqs))) and len(seqs) >= 10
            assert json.loads((Path(copy) / "meta.json").read_text())["lost_records"] == 0
        finally:
            shutil.rmtree(copy, ignore_errors=True)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_devices_the_job_opens_files_on_are_watched(tmp_path: Path) -> None:
    from tests.test_devmap import mounted_loop

    with mounted_loop(tmp_path, tmp_path / "mnt") as (dev, mnt):
        # Not Python (no audit hook): found by the scan of the job's open files.
        out = iolens_run(tmp_path, "--out", "run", "--interval", "0.1", "--", "bash", "-c",
                         f"exec 3>{mnt / 'data.bin'}; sleep 1.5")
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    name = Path(dev).name
    assert meta["devices"][name].startswith("the job reads or writes")
    assert any(name in r["devices"] for r in records(tmp_path / "run"))


def test_a_data_file_seen_first_in_the_scan_names_its_device_as_the_datasets(
        tmp_path: Path) -> None:
    """The scan of open files can see a worker's data file before the timing hook reports
    the open (CI saw it once): the device is still said to serve the dataset, not merely
    to hold a file the job reads or writes."""
    from iolens.recorder.sampler import Recorder
    from tests.test_devmap import mounted_loop

    with mounted_loop(tmp_path, tmp_path / "mnt") as (dev, mnt):
        (mnt / "data").mkdir()
        (mnt / "data" / "000.bin").write_bytes(os.urandom(4096))
        with open(mnt / "data" / "000.bin", "rb"):
            rec = Recorder(None, os.getpid(), 0.1, {})
            rec._scan_fds([os.getpid()])
    why = rec.watch.get(Path(dev).name, "")
    assert why.startswith("serves the dataset: the input pipeline read files in "), rec.watch
    assert why.endswith(str(mnt / "data")), why


def test_a_python_job_writing_a_file_has_its_device_watched_from_the_open(
        tmp_path: Path) -> None:
    """A Python job's file opened for writing (a checkpoint) notes its folder at once: the
    device is watched from then on, even if the file is closed before any scan."""
    from tests.test_devmap import mounted_loop

    with mounted_loop(tmp_path, tmp_path / "mnt") as (dev, mnt):
        code = (f"import time; open({str(mnt / 'ckpt.bin')!r}, 'wb').close(); "
                "time.sleep(1.0)")
        out = iolens_run(tmp_path, "--out", "run", "--interval", "0.1", "--", sys.executable,
                         "-c", code)
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    name = Path(dev).name
    assert meta["devices"][name] == f"the job writes files in {mnt}"


def test_sidecar_takes_a_command_line_with_options() -> None:
    """monitor() hands the script's argv to the sidecar as --command VALUE pairs; a value
    that starts with '-' (train.py --epochs 3) once made the sidecar exit with a usage
    error, and monitor() recorded nothing."""
    from iolens.job.sidecar import _glued

    argv = ["--pid", "1", "--command", "train.py", "--command", "--epochs", "--out", "r"]
    assert _glued(argv) == ["--pid", "1", "--command=train.py", "--command=--epochs",
                            "--out", "r"]


def test_a_loop_with_no_batch_for_a_while_is_recorded_with_where_it_waits(
        tmp_path: Path) -> None:
    """NOTE [no batch for a while]: a loop that began an epoch and has had no batch for
    WAITING_S is recorded as waiting, with the state, wait channel and syscall of the
    training process and its workers (here a worker stuck opening a FIFO nobody writes)."""
    from iolens.recorder.sampler import WAITING_S, Recorder

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    stuck = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'rb').read()"])
    try:
        rec = Recorder(None, os.getpid(), 1.0, {}, discover=False)
        time.sleep(0.3)  # (the child is in its open by now)
        rec.train.worker_pids[stuck.pid] = 0
        rec.train.last_data_ns = time.monotonic_ns() - int((WAITING_S + 5) * 1e9)
        train = rec.sample()["train"]
        assert train["waiting_s"] >= WAITING_S + 5, train
        (worker,) = [w for w in train["waiting"] if w["pid"] == stuck.pid]
        assert worker["role"] == "worker" and worker["state"] == "S", worker
        assert worker.get("wchan") == "wait_for_partner", worker  # a FIFO's open
        assert worker.get("syscall") in ("openat", "257", "2", "open"), worker
        rec.train.last_data_ns = time.monotonic_ns()  # a batch came: no longer waiting
        assert "waiting_s" not in rec.sample()["train"]
        rec.close()
    finally:
        stuck.kill()
        stuck.wait()


def test_a_spawn_script_without_the_main_guard_says_what_happened(tmp_path: Path) -> None:
    """The review's spawned DataLoader in a script without `if __name__ == "__main__":`:
    the verdict said the job was not a Python program or used no DataLoader. It began an
    epoch, and no batch came."""
    script = tmp_path / "noguard.py"
    script.write_text(textwrap.dedent("""
        import time, torch
        from torch.utils.data import DataLoader, Dataset
        class D(Dataset):
            def __len__(self):
                return 64
            def __getitem__(self, i):
                return torch.zeros(4)
        for x in DataLoader(D(), batch_size=8, num_workers=2, multiprocessing_context="spawn"):
            time.sleep(0.01)
    """))
    out = subprocess.run([sys.executable, "-m", "iolens", "run", "--no-live", "--out",
                          str(tmp_path / "run"), "--", sys.executable, str(script)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode != 0
    rep = json.loads(subprocess.run(
        [sys.executable, "-m", "iolens", "report", str(tmp_path / "run"), "--format", "json"],
        capture_output=True, text=True, timeout=120, check=True).stdout)
    ev = rep["verdict"]["evidence"]
    assert any("began iterating a DataLoader (2 workers)" in e and "no batch came" in e
               for e in ev), ev
    assert not any("not a Python program" in e for e in ev), ev
    # the advice: the job's own error, and the guard spawned workers need
    action = rep["verdict"]["recommendations"][0]["action"]
    assert "fix the error the job exited with (code 1)" in action, action
    assert 'if __name__ == "__main__":' in action and "spawn" in action, action
    assert "instrument" not in action, action


def test_a_job_hung_at_its_dataloader_is_named_hung(tmp_path: Path) -> None:
    """A job whose workers wait forever for a store that never answers (a FIFO nobody
    writes), stopped by a time limit as a user's scheduler would: the verdict is `hung`,
    with where the workers wait, and the advice to set DataLoader(timeout=...)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent("""
        import sys, time, torch
        from torch.utils.data import DataLoader, Dataset
        class D(Dataset):
            def __len__(self):
                return 64
            def __getitem__(self, i):
                if i >= 16:
                    with open(sys.argv[1], "rb") as fh:  # a store that never answers
                        fh.read()
                return torch.zeros(4)
        if __name__ == "__main__":
            for x in DataLoader(D(), batch_size=8, num_workers=2):
                time.sleep(0.01)
    """))
    out = subprocess.run(["timeout", "-s", "TERM", "55", sys.executable, "-m", "iolens", "run",
                          "--no-live", "--out", str(tmp_path / "run"), "--", sys.executable,
                          str(script), str(fifo)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0
    assert "iolens: verdict: hung" in out.stderr, out.stderr[-2000:]
    rep = json.loads(subprocess.run(
        [sys.executable, "-m", "iolens", "report", str(tmp_path / "run"), "--format", "json"],
        capture_output=True, text=True, timeout=120, check=True).stdout)
    v = rep["verdict"]
    assert v["class"] == "hung" and v["evidence"][0].startswith("no batch came in the last")
    assert "worker" in v["evidence"][0] and "wait_for_partner" in v["evidence"][0], v
    assert "DataLoader(timeout=" in v["recommendations"][0]["action"]
