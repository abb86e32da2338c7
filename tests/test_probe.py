"""`iolens probe` names the stage that bounds a job: compute (a heavy model step on cheap
cached data), preprocessing (heavy per-sample CPU, cheap model), storage (files on a
throttled slow disk, read cold); bad arguments are usage errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from iolens.cli import probe as probe_cmd
from tests.conftest import need

pytest.importorskip("torch")

MODELS = """
import time, torch
from torch.utils.data import Dataset

class Cached(Dataset):
    # cheap samples, already in memory
    def __init__(self):
        self.x = torch.randn(4096, 256)
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        return self.x[i], i % 4

class Burn(Dataset):
    # samples in memory, each costing about 8 ms of CPU (a decode and augmentation)
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        x = torch.full((256,), float(i % 7))
        end = time.process_time() + 0.008
        while time.process_time() < end:
            x = x.flip(0)
        return x, i % 4

class Heavy(torch.nn.Module):
    # a deep stack of 256x256 layers: the step dominates
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(256, 256) / 16)
    def forward(self, x):
        for _ in range(300):
            x = torch.tanh(x @ self.w)
        return x[:, :4]

def cached():
    return Cached()

def burn():
    return Burn()

def heavy():
    return Heavy(), torch.nn.functional.cross_entropy

def light():
    return torch.nn.Linear(256, 4), torch.nn.functional.cross_entropy

def light_folder():
    # for a folder decoded to 1x64x64
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4096, 4)), \
        torch.nn.functional.cross_entropy

def not_a_pair():
    return torch.nn.Linear(256, 4)
"""


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module in the current folder with the datasets and models above; its name."""
    name = f"probe_data_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODELS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return name


def probe_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = probe_cmd.main([*args, "--format", "json", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    result: dict[str, Any] = json.loads(out.out)
    return result


def rates(r: dict[str, Any]) -> dict[str, float | None]:
    return {name: s["samples_per_s"] for name, s in r["stages"].items()}


def test_a_heavy_model_on_cached_data_is_compute_bound(
        mod: str, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe_json(capsys, "--dataset", f"{mod}:cached", "--model", f"{mod}:heavy",
                   "--num-workers", "1", "--seconds", "1")
    assert r["bound"] == "compute", rates(r)
    got = rates(r)
    assert got["compute"] is not None and got["preprocessing"] is not None
    assert got["preprocessing"] > 3 * got["compute"], got
    assert r["summary"].startswith("compute bounds the job: ")
    assert r["stages"]["storage"]["measured"] is False
    assert "--evict" in r["stages"]["storage"]["note"]


def test_heavy_per_sample_cpu_with_a_cheap_model_is_preprocessing_bound(
        mod: str, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe_json(capsys, "--dataset", f"{mod}:burn", "--model", f"{mod}:light",
                   "--num-workers", "2", "--seconds", "1", "--subset", "128")
    got = rates(r)
    assert r["bound"] == "preprocessing", got
    assert got["compute"] is not None and got["preprocessing"] is not None
    assert got["compute"] > 10 * got["preprocessing"], got
    # Two workers at about 8 ms a sample: at most about 250 samples/s.
    assert got["preprocessing"] < 320, got
    assert "iolens tune" in r["summary"] and r["possible_gain"] > 10


def test_without_a_model_the_loader_alone_is_measured_and_said(
        mod: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = probe_cmd.main(["--dataset", f"{mod}:cached", "--num-workers", "0",
                           "--seconds", "0.3"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "no model (the loader only)" in out.out
    assert "compute: not measured: no --model" in out.out
    assert "preprocessing bounds the job" in out.out
    assert "iolens probe: [1/3]" in out.err  # plain progress lines off a terminal


def test_a_folder_is_read_cold_after_its_pages_are_dropped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for c in range(2):
        (tmp_path / f"class{c}").mkdir()
        for i in range(100):
            (tmp_path / f"class{c}" / f"{i}.bin").write_bytes(os.urandom(8192))
    r = probe_json(capsys, "--folder", str(tmp_path), "--num-workers", "1", "--seconds", "0.5",
                   "--batch-size", "8", "--subset", "64")
    storage = r["stages"]["storage"]
    assert storage["measured"] and storage["samples_per_s"] > 0
    assert "the pages of 200 files dropped" in storage["note"]
    assert r["bound"] in ("storage", "preprocessing")


@pytest.mark.parametrize(("args", "message"), [
    (["--dataset", "{mod}:cached", "--model", "{mod}:not_a_pair"], "expected a pair"),
    (["--dataset", "{mod}:cached", "--model", "nope"], "expected MODULE:FACTORY"),
    (["--dataset", "{mod}:light"], "not a torch.utils.data.Dataset"),
    (["--folder", "/no/such/folder"], "no such folder"),
    (["--dataset", "{mod}:cached", "--decode", "image"], "--decode and --shape apply to"),
    (["--dataset", "{mod}:cached", "--num-workers", "-2"], "--num-workers must be 0 or more"),
])
def test_bad_arguments_exit_2_with_a_message(mod: str, args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_cmd.main([a.replace("{mod}", mod) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("usage: iolens probe"), err


# The probe runs in its own process, which joins the slow disk's throttled cgroup once
# torch and iolens are loaded (their files sit on the throttled backing disk too).
JOINED = """
import os, sys
import torch, torch.utils.data
import iolens.loaderbench.folder, iolens.loaderbench.probe
from iolens.cli import probe
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as fh:
    fh.write(str(os.getpid()))
sys.exit(probe.main(sys.argv[2:]))
"""


def test_small_files_on_a_slow_disk_are_storage_bound(tmp_path: Path) -> None:
    from iolens.demo.slowdisk import SlowDisk, missing_requirements

    need(os.geteuid() == 0, "needs root to attach loop devices, mount and make blkio cgroups")
    missing = missing_requirements()
    need(not missing, "cannot make a slow disk here: needs " + "; ".join(missing))
    (tmp_path / "models.py").write_text(textwrap.dedent(MODELS))
    # 1200 files of 16 KiB on a disk that serves 150 reads a second: a cold pass reads
    # about one file per read, the cached subset thousands a second.
    with SlowDisk(128 << 20, read_iops=150) as disk:
        data = Path(disk.mount_point) / "data"
        for c in range(4):
            (data / f"class{c}").mkdir(parents=True)
        for i in range(1200):
            (data / f"class{i % 4}" / f"{i:05d}.bin").write_bytes(os.urandom(16 << 10))
        out = subprocess.run(
            [sys.executable, "-c", JOINED, disk.cgroup, "--folder", str(data),
             "--shape", "1,64,64", "--model", "models:light_folder", "--num-workers", "2",
             "--seconds", "2", "--subset", "128", "--format", "json", "--quiet"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    got = rates(r)
    assert r["bound"] == "storage", (got, r["notes"])
    assert got["storage"] is not None and got["preprocessing"] is not None
    assert got["preprocessing"] > 3 * got["storage"], got
    assert r["summary"].startswith("storage bounds the job: cold-cache rate ")
    assert "iolens pack" in r["summary"]
