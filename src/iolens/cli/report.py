"""``iolens report RUN``: the verdict, its evidence and the run's figures."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile

from iolens._errors import IolensError

_EPILOG = """\
formats:
  text   the verdict, evidence and recommendations, then tables of the training's
         data wait and step time, the devices, the job's processes and GPUs
  json   the same as one stable object: run, notes, verdict (class, severity,
         data_wait_share, devices, evidence, recommendations, windows, figures),
         findings, training, devices, processes, gpus, cpu

A damaged run directory (a torn last line, corrupt lines, a missing
meta.json, records from a newer iolens) is read as far as it is valid, and
the report's notes say what was skipped.

exit codes: 0 written, 1 the output could not be written, 2 no run at RUN or bad options

examples:
  iolens report iolens-runs/20261130-101500-train
  iolens report runs/baseline --format json -o baseline.json
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens report``."""
    p = argparse.ArgumentParser(
        prog="iolens report", usage="iolens report RUN [--format text|json] [-o FILE]",
        description="Report on a recorded run: what held the training back, the evidence, "
                    "and what to do about it.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="a run directory written by `iolens run` or "
                                              "iolens.monitor()")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="output format (default text)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write to FILE instead of standard output")
    return p


def _write_atomic(path: str, data: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".iolens-report-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def run(ns: argparse.Namespace) -> int:
    """Build and write the report; returns the exit code."""
    from iolens.analysis.rundata import load_run  # noqa: PLC0415 - keep `iolens --help` fast
    from iolens.report.build import build_report  # noqa: PLC0415

    try:
        data = load_run(ns.run)
    except IolensError as exc:
        print(f"iolens report: {exc}", file=sys.stderr)
        return 2
    report = build_report(data)
    if ns.format == "json":
        text = json.dumps(report, indent=2, allow_nan=False) + "\n"
    else:
        text = _render_text(report, to_terminal=ns.output is None)
    try:
        if ns.output:
            _write_atomic(ns.output, text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    except OSError as exc:
        where = ns.output or "standard output"
        print(f"iolens report: cannot write {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if ns.output:
        print(f"iolens report: wrote {ns.output}", file=sys.stderr)
    return 0


def _render_text(report: dict[str, object], *, to_terminal: bool) -> str:
    import io  # noqa: PLC0415

    from rich.console import Console  # noqa: PLC0415 - rich only for the text format

    from iolens.report.text import print_report  # noqa: PLC0415

    buf = io.StringIO()
    tty = to_terminal and sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if tty else 120
    console = Console(file=buf, force_terminal=tty, width=width,
                      color_system="auto" if tty else None, highlight=False)
    print_report(report, console)
    return buf.getvalue()
