"""`iolens doctor` on this machine, and on a /proc with nothing in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iolens", "doctor", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_doctor_lists_each_capability() -> None:
    out = doctor()
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ok       device statistics")
    assert any(line.startswith("ok       process I/O") for line in lines)
    names = {c["name"]: c for c in json.loads(doctor("--format", "json").stdout)}
    assert names["PyTorch"]["ok"] is True and names["HTML report"]["ok"] is True
    assert names["GPUs (NVML)"]["detail"]  # says which GPUs, or why there are none


def test_doctor_without_device_statistics_says_why_and_exits_1(tmp_path: Path) -> None:
    out = doctor("--proc-root", str(tmp_path), "--sys-root", str(tmp_path))
    assert out.returncode == 1
    first = out.stdout.splitlines()[0]
    assert first.startswith("missing  device statistics") and str(tmp_path) in first
