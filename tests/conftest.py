"""Shared test helpers.

Tests that need root, loop devices or sysstat's iostat skip elsewhere with a
reason. `.ci/run` sets IOLENS_REQUIRE_ALL=1, which turns every such skip
into a failure, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

REQUIRE_ALL = os.environ.get("IOLENS_REQUIRE_ALL") == "1"

# Several tests type Ctrl-C or send SIGINT to the programs they start, and check how
# those end. A shell starts background jobs (`make test &`, nohup) with SIGINT
# ignored, and an ignored signal stays ignored across exec: every program started
# here would then shrug SIGINT off. Python's own handler here means a default one
# in each program started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


@contextlib.contextmanager
def mounted(source: str, target: Path, *opts: str) -> Iterator[Path]:
    """``source`` mounted on ``target`` (made if missing) for the block; unmounted after,
    lazily when something still holds it."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", *opts, source, str(target)], check=True, capture_output=True)
    try:
        yield target
    finally:
        if subprocess.run(["umount", str(target)], check=False,
                          capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(target)], check=False, capture_output=True)


@pytest.fixture
def root() -> None:
    """Requires root."""
    need(os.geteuid() == 0, "needs root")


# -- order -----------------------------------------------------------------

PREDICTION_FILES = frozenset({"test_lab_advice.py", "test_lab_storage_advice.py",
                              "test_demo_cycle.py", "test_lab_gate.py"})
"""The lab cases that hold a prediction from one run against the runs after the fix."""


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """The prediction cases run last. scripts/unit.sh runs the soak test (ten minutes of a
    recorder sampling every 0.05 s) beside the suite; a case whose first run shared the
    machine with it and whose runs after the fix did not (or the other way round) measured
    that load, not the fix: in CI a hand-over case's runs after the fix were 34% faster than
    predicted. Last, they start long after the soak has ended."""
    del session, config
    late = [i for i in items if i.path.name in PREDICTION_FILES]
    items[:] = [i for i in items if i.path.name not in PREDICTION_FILES] + late


# -- RELIABILITY.md ---------------------------------------------------------
# `make reliability` runs the fault, fuzz and security suites with
# IOLENS_RELIABILITY_JSON set; each test's docstring says what it checks and
# its record_property("measured", ...) entries carry the figures it saw.

_RESULTS: dict[str, dict[str, object]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[None],
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not os.environ.get("IOLENS_RELIABILITY_JSON"):
        return report
    callspec = getattr(item, "callspec", None)
    entry = _RESULTS.setdefault(item.nodeid, {
        "file": item.path.name,
        "doc": inspect.getdoc(getattr(item, "obj", None)) or "",
        "case": callspec.id if callspec is not None else "",
        "outcome": "passed", "seconds": 0.0, "measured": [],
    })
    entry["seconds"] = float(entry["seconds"]) + report.duration  # type: ignore[arg-type]
    if hasattr(report, "wasxfail"):  # a known limit, written down as an expected failure
        entry["outcome"] = "known limit"
        entry["reason"] = str(report.wasxfail)
    elif report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        entry["reason"] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    if report.when == "teardown":
        entry["measured"] = [str(v) for k, v in report.user_properties if k == "measured"]
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("IOLENS_RELIABILITY_JSON")
    if path and _RESULTS:
        with open(path, "w") as fh:
            json.dump(_RESULTS, fh, indent=1)
