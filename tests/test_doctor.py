"""`iolens doctor` on this machine, and on a /proc with nothing in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iolens", "doctor", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_doctor_lists_each_capability() -> None:
    """iolens doctor lists each capability, core ones ok on this machine."""
    out = doctor()
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ok       device statistics")
    assert any(line.startswith("ok       process I/O") for line in lines)
    names = {c["name"]: c for c in json.loads(doctor("--format", "json").stdout)}
    assert names["PyTorch"]["ok"] is True and names["HTML report"]["ok"] is True
    # the dev install brings every optional part
    assert all(names[n]["ok"] for n in ("MLflow", "W&B", "packing", "Prometheus")), names
    assert names["GPUs (NVML)"]["detail"]  # says which GPUs, or why there are none


def test_doctor_without_device_statistics_says_why_and_exits_1(tmp_path: Path) -> None:
    """iolens doctor without device statistics says why and exits 1."""
    out = doctor("--proc-root", str(tmp_path), "--sys-root", str(tmp_path))
    assert out.returncode == 1
    first = out.stdout.splitlines()[0]
    assert first.startswith("missing  device statistics") and str(tmp_path) in first


def test_doctor_names_the_privilege_each_feature_takes() -> None:
    """iolens doctor states feature -> privilege for each feature, for the current user.

    `iolens doctor` as the test's user: each feature that takes a privilege says which
    (root, CAP_SYS_PTRACE, CAP_NET_BIND_SERVICE) and whether it is held; recording one's own
    jobs takes none."""
    found = {c["name"]: c for c in json.loads(doctor("--format", "json").stdout)}
    root = os.geteuid() == 0
    assert found["recording your own jobs"] | {"detail": ""} == {
        "name": "recording your own jobs", "ok": True, "detail": "", "core": False,
        "privilege": "", "needed_for": found["recording your own jobs"]["needed_for"]}
    wanted = {"other users' processes": "root or CAP_SYS_PTRACE",
              "dropping the page cache": "root", "slow-disk lab": "root (CAP_SYS_ADMIN)",
              "ports below 1024": "root or CAP_NET_BIND_SERVICE"}
    for name, privilege in wanted.items():
        assert found[name]["privilege"] == privilege
        if root:
            assert found[name]["ok"] is True and "running as root" in found[name]["detail"]
    text = doctor().stdout
    assert "[needs root or CAP_SYS_PTRACE]" in text and "[needs root]" in text
