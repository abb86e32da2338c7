"""Regenerate RELIABILITY.md: run the fault, bad-input and security suites and tabulate them.

Each row is one test: the first line of its docstring (the case and what is
checked), its result, and the figures it measured (``record_property("measured", ...)``).
Run as root for the whole matrix (loop devices, mount namespaces, other
users); elsewhere the cases that need root are listed as skipped with the reason.
Exits 1 when a case failed, after writing the table all the same.

    .venv/bin/python scripts/reliability.py [--out RELIABILITY.md] [--soak-seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (section title, what it covers, pytest arguments)
SUITES: list[tuple[str, str, list[str]]] = [
    ("Fault matrix", "A real training under `iolens run`, hit by one fault each: the job's "
     "result and exit code must match a run without iolens, and the run directory must stay "
     "readable.", ["tests/test_faults.py"]),
    ("Failing sources", "NVML and /proc/diskstats that fail in the ways real machines do.",
     ["tests/test_faults_sources.py"]),
    ("Long run", "A run of hours compressed by a fast interval.", ["tests/test_soak.py"]),
    ("Bad input, fuzzed", "Generated and damaged /proc text and run directories.",
     ["tests/test_fuzz.py"]),
    ("Security", "What a hostile string, a planted symlink or a missing privilege can do.",
     ["tests/test_security.py"]),
]


def run_suite(args: list[str], env: dict[str, str]) -> tuple[dict[str, dict[str, object]], int]:
    """Run one suite; its results keyed by test id, and pytest's exit status."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    try:
        env = {**env, "IOLENS_RELIABILITY_JSON": path}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *args], cwd=ROOT, env=env, check=False)
        try:
            with open(path) as fh:
                results: dict[str, dict[str, object]] = json.load(fh)
        except (OSError, ValueError):
            results = {}
        return results, proc.returncode
    finally:
        os.unlink(path)


def cell(text: str) -> str:
    """Text that cannot break a Markdown table row."""
    return text.replace("|", "\\|").replace("\n", " ").strip()


def commit() -> str:
    """The checked-out commit, with a mark when the tree has changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty.strip() else "")


def main() -> int:
    """Run every suite and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "RELIABILITY.md"))
    ap.add_argument("--soak-seconds", default=os.environ.get("IOLENS_SOAK_SECONDS", "600"),
                    help="length of the fast-interval run (default 600)")
    ns = ap.parse_args()
    env = {**os.environ, "IOLENS_SOAK_SECONDS": str(ns.soak_seconds)}
    if os.geteuid() == 0:
        env["IOLENS_REQUIRE_ALL"] = "1"  # as root every case must run, none may skip
    started = time.monotonic()
    sections: list[str] = []
    counts = {"passed": 0, "failed": 0, "skipped": 0, "known limit": 0}
    worst = 0
    for title, about, args in SUITES:
        print(f"reliability: {title}: pytest {' '.join(args)}", flush=True)
        results, status = run_suite(args, env)
        if status not in (0, 5):
            worst = 1
        rows = [f"## {title}", "", about, "", "| case and what is checked | result | measured |",
                "|---|---|---|"]
        if not results:
            rows.append(f"| {cell(' '.join(args))} | **no result** (pytest exit {status}) | |")
            worst = 1
        for entry in results.values():
            outcome = str(entry["outcome"])
            counts[outcome] = counts.get(outcome, 0) + 1
            doc = str(entry["doc"]).split("\n\n")[0] or "(no docstring)"
            if entry.get("case"):
                doc += f" `[{entry['case']}]`"
            result = f"{outcome} ({float(entry['seconds']):.1f} s)"  # type: ignore[arg-type]
            if outcome == "failed":
                result = f"**{result}**"
            elif outcome in ("skipped", "known limit"):
                result += f": {entry.get('reason', '')}"
            measured = "; ".join(str(m) for m in entry.get("measured", []))  # type: ignore[attr-defined]
            rows.append(f"| {cell(doc)} | {cell(result)} | {cell(measured)} |")
        sections.append("\n".join(rows))
    minutes = (time.monotonic() - started) / 60
    head = [
        "# Reliability",
        "",
        "How iolens behaves when the job, the machine or the input goes wrong. "
        "This file is generated: `make reliability` runs the suites below and rewrites it.",
        "",
        f"Last run: {time.strftime('%Y-%m-%d %H:%M %Z')}, commit {commit()}, "
        f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs, "
        f"{'root' if os.geteuid() == 0 else 'not root'}, {minutes:.1f} min. "
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
        f"{counts['known limit']} known limit(s) (expected failures, each with its reason).",
        "",
    ]
    Path(ns.out).write_text("\n".join(head) + "\n" + "\n\n".join(sections) + "\n")
    print(f"reliability: wrote {ns.out}: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped, {counts['known limit']} known limit(s)")
    return worst


if __name__ == "__main__":
    sys.exit(main())
