"""The README's main command on a machine that allows the slow disk (root, loop devices,
cgroup v1 blkio): the demo's whole cycle, run as `make demo` runs it.
The training on small files is storage-bound, the probe finds the disk's request limit,
the pack it advises is made and trained on, and `iolens compare` sets the prediction beside
the measured throughput.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need

pytest.importorskip("torch")


def test_the_demo_cycle_packs_as_advised_and_the_prediction_holds(tmp_path: Path) -> None:
    from iolens.demo.slowdisk import missing_requirements

    need(os.geteuid() == 0, "the cycle needs root to make its slow disk")
    missing = missing_requirements()
    need(not missing, "cannot make a slow disk here: needs " + "; ".join(missing))
    out = subprocess.run([sys.executable, "-m", "iolens.demo.cycle", "--out",
                          str(tmp_path / "demo")], capture_output=True,
                         text=True, timeout=400, check=False, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    steps = [line for line in out.stdout.splitlines() if line.startswith("demo: ")]
    for n in range(1, 6):
        assert any(line.startswith(f"demo: {n}/5") for line in steps), (n, steps)
    assert "limit: iops" in out.stdout, out.stdout[-3000:]
    before, after = tmp_path / "demo" / "1-files", tmp_path / "demo" / "2-packed"
    assert (before / "storage_probe.json").exists() and (tmp_path / "demo" / "report.html").exists()
    cmp = subprocess.run([sys.executable, "-m", "iolens", "compare", str(before), str(after),
                          "--format", "json"], capture_output=True, text=True, timeout=120,
                         check=True)
    proof = json.loads(cmp.stdout)["prediction"]
    print(f"\ndemo cycle: {proof}")
    assert proof["change"].get("pack") is True, proof
    # The pack's gain is real, and near its prediction. The demo's step is real CPU work
    # (the CNN), whose time varies between runs on a shared 2-core machine (38 to 49 ms a
    # step seen), so the demo is held to twice the labs' 25%: the lab cases, whose step is a
    # sleep, hold predictions to 25% (tests/test_lab_storage_advice.py).
    assert proof["measured_low"] > 2 * proof["predicted"]["now_steps_per_s"], proof
    assert abs(proof["error"]) <= 0.5, proof
    word = "held" if proof["held"] else "FAILED"
    assert f"{word} ({proof['error'] * 100:+.0f}%" in out.stdout, out.stdout[-2000:]
    # nothing of the slow disk is left behind
    assert not any(p.startswith("iolens-slowdisk-") for p in os.listdir("/tmp")
                   if os.path.isdir(os.path.join("/tmp", p, "mnt")))
