"""The CI gate on real runs: `iolens compare --fail-on` over pairs of one configuration
fails none of ten, and catches a job 15% slower (NOTE [run-to-run noise] in
iolens/analysis/compare/gate.py).

The job is a short real training whose workers wait on a remote store (a sleep per
sample) and whose step is a sleep: the noise is this machine's, not the job's. The review
saw 2 of 4 same-configuration pairs fail `--fail-on step-time:5%,data-wait-share:5`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

TRAIN = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
SECONDS, COST, STEP = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
class Remote(Dataset):  # each batch of 16 waits on a remote store, off the CPU
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        if i % 16 == 0:  # one wait a batch: a wait's own jitter is not multiplied by 16
            time.sleep(16 * COST)
        return torch.zeros(64), i % 4
loader = DataLoader(Remote(), batch_size=16, num_workers=2, persistent_workers=True)
end = time.monotonic() + SECONDS
while time.monotonic() < end:
    for x, y in loader:
        time.sleep(STEP)  # the model step
        if time.monotonic() > end:
            break
"""
GATE = "throughput:5%,step-time:5%,data-wait-share:5"
PAIRS = 10
FALSE_ALARMS_MAX = 1
"""Same-configuration pairs allowed to fail the gate: none of 10 did here."""
COST, STEP = 0.003, 0.02


def record(tmp_path: Path, name: str, slower: float = 1.0) -> Path:
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text(TRAIN)
    run = tmp_path / name
    subprocess.run([sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out",
                    str(run), "--no-live", "--", sys.executable, str(script), "6",
                    str(COST * slower), str(STEP * slower)],
                   cwd=tmp_path, capture_output=True, text=True, timeout=180, check=True)
    return run


def gate(base: Path, new: Path) -> tuple[int, dict[str, dict[str, object]]]:
    out = subprocess.run([sys.executable, "-m", "iolens", "compare", str(base), str(new),
                          "--format", "json", "--fail-on", GATE],
                         capture_output=True, text=True, timeout=120, check=False)
    return out.returncode, {g["metric"]: g for g in json.loads(out.stdout)["fail_on"]}


def test_same_configuration_pairs_pass_and_a_slower_job_fails(tmp_path: Path) -> None:
    alarms = []
    for i in range(PAIRS):
        code, bounds = gate(record(tmp_path, f"a{i}"), record(tmp_path, f"b{i}"))
        print(f"pair {i}:", {m: g["regression"] for m, g in bounds.items()})
        if code != 0:
            alarms.append((i, code, {m: g["reason"] for m, g in bounds.items()
                                     if g["status"] != "passed"}))
    assert len(alarms) <= FALSE_ALARMS_MAX, alarms
    # Every stage 15% slower, against the run just before it (a base recorded minutes
    # earlier on this shared machine has drifted by up to 6% here): the gate fails, on
    # throughput.
    code, bounds = gate(tmp_path / f"b{PAIRS - 1}", record(tmp_path, "slower", 1.15))
    print("slower:", {m: (g["status"], g["regression"]) for m, g in bounds.items()})
    assert code == 1, bounds
    assert bounds["throughput"]["status"] == "crossed", bounds["throughput"]


SPAWN = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
class Samples(Dataset):
    def __len__(self):
        return 1600
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(256), i % 4
if __name__ == "__main__":
    loader = DataLoader(Samples(), batch_size=16, num_workers=3, shuffle=True,
                        multiprocessing_context="spawn", persistent_workers=sys.argv[1] == "1")
    for epoch in range(4):
        for x, y in loader:
            time.sleep(0.02)  # the model step
"""


def test_spawn_workers_are_told_to_persist_the_gain_holds_and_the_reverse_fails_the_gate(
        tmp_path: Path) -> None:
    """Spawned workers started again each epoch (seconds each): the review saw the verdict
    lead with "do not add DataLoader workers", and the 74% gain of persistent workers called
    "within noise (95% CI -22.1% to +265.1%)" (NOTE [epoch starts apart] in
    iolens/analysis/compare/blocks.py). The verdict now leads with persistent_workers=True and a
    prediction (35.1 steps/s, 31.6-38.6, here; 33.9 measured after); the run after it holds
    it within 25%, and the gain is real."""
    script = tmp_path / "spawn_train.py"
    script.write_text(SPAWN)
    runs = {}
    for name, persistent in (("respawn", "0"), ("persistent", "1")):
        runs[name] = tmp_path / name
        subprocess.run([sys.executable, "-m", "iolens", "run", "--out", str(runs[name]),
                        "--no-live", "--", sys.executable, str(script), persistent],
                       cwd=tmp_path, capture_output=True, text=True, timeout=180, check=True)
    out = subprocess.run([sys.executable, "-m", "iolens", "compare", str(runs["respawn"]),
                          str(runs["persistent"]), "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True)
    cmp = json.loads(out.stdout)
    thr = next(m for m in cmp["metrics"] if m["id"] == "throughput")
    assert thr["real"] is True and thr["ci_low"] > 10, thr
    first = cmp["verdicts"]["base"]["recommendations"][0]
    assert first["change"] == {"persistent_workers": True} and first["prediction"], first
    proof = cmp["prediction"]
    assert proof["change"] == {"persistent_workers": True}, proof
    assert abs(proof["error"]) <= 0.25 and proof["held"], proof
    code, bounds = gate(runs["persistent"], runs["respawn"])
    assert code == 1 and bounds["throughput"]["status"] == "crossed", bounds
