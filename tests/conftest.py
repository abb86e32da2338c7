"""Shared test helpers.

Tests that need root, loop devices or sysstat's iostat skip elsewhere with a
reason. `.ci/run` sets IOLENS_REQUIRE_ALL=1, which turns every such skip
into a failure, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REQUIRE_ALL = os.environ.get("IOLENS_REQUIRE_ALL") == "1"


def need(condition: bool, reason: str) -> None:
    """Skip unless ``condition``; fail instead of skipping under IOLENS_REQUIRE_ALL=1."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required in CI but unavailable: {reason}")
    pytest.skip(reason)


def can_unshare_mounts() -> bool:
    """True when this process may make a private mount namespace (root, unshare present)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.fixture
def iostat_ns() -> None:
    """Requires sysstat's iostat and a private mount namespace to feed it fixtures."""
    need(shutil.which("iostat") is not None, "sysstat's iostat is not installed")
    need(can_unshare_mounts(), "needs root and unshare(1) to bind-mount fixtures over /proc")


@pytest.fixture
def root() -> None:
    """Requires root."""
    need(os.geteuid() == 0, "needs root")
