"""``iolens report RUN``: the verdict, its evidence and the run's figures."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import Any

from iolens._errors import IolensError
from iolens.cli._batch import json_text, no_cycle_collection, read_run
from iolens.rundir import write_atomic

_EPILOG = """\
formats:
  text   the verdict, evidence and recommendations, then tables of the training's
         data wait and step time, the devices, the job's processes and GPUs
  json   the same as one stable object: run, notes, verdict (class, severity,
         data_wait_share, devices, evidence, recommendations, windows, figures),
         findings, training, devices, processes, gpus, cpu
  html   one self-contained page that opens offline in any browser: the text
         report's sections, then zoomable charts on one time axis (devices'
         MB/s, await and %util, the job's reads and cache hits, CPU, GPU, step
         time and data wait) with the verdict's windows shaded; written to
         RUN/report.html unless -o says otherwise; needs plotly
         (pip install 'iolens[html]')

A damaged run directory (a torn last line, corrupt lines, a missing
meta.json, records from a newer iolens) is read as far as it is valid, and
the report's notes say what was skipped. A long run (over 50,000 intervals)
is read from the rollups written beside its records; where a finished run
has none, or they stop early, the report folds its records into new ones and
writes them into RUN (its later reports then read them; a folder that cannot
take them is left as it was).

exit codes: 0 written, 1 the output could not be written (or plotly is missing for
html), 2 no run at RUN or bad options

examples:
  iolens report iolens-runs/20261130-101500-train
  iolens report runs/baseline --format json -o baseline.json
  iolens report runs/job-42/      # a folder of run directories, one per node: per-node and
                                  # per-rank tables, and the straggler that holds the others back
  iolens report runs/baseline --format html          # writes runs/baseline/report.html
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens report``."""
    p = argparse.ArgumentParser(
        prog="iolens report", usage="iolens report RUN [--format text|json|html] [-o FILE]",
        description="Report on a recorded run: what held the training back, the evidence, "
                    "and what to do about it.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="a run directory written by `iolens run` or "
                                              "iolens.monitor()")
    p.add_argument("--format", choices=("text", "json", "html"), default="text",
                   help="output format (default text)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write to FILE instead of standard output (html: instead of "
                        "RUN/report.html)")
    return p


def _write_atomic(path: str, data: str, *, streams: bool = True) -> None:
    """Write ``path`` whole: a new file renamed over it, so that a link planted there is
    replaced, never written through. With ``streams``, a path that leads to a FIFO or a
    terminal (``-o /dev/stdout``) is written to as it is: renaming over /dev/stdout would
    replace the machine's own link."""
    if streams:
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is not None and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(data)
            return
    write_atomic(os.path.abspath(path), data.encode("utf-8"))


def run(ns: argparse.Namespace) -> int:
    """Build and write the report; returns the exit code."""
    plotlyjs = None
    if ns.format == "html":
        from iolens.report.html import plotly_js  # noqa: PLC0415

        try:  # before the run is read: a missing extra should not cost a long load
            plotlyjs = plotly_js()
        except IolensError as exc:
            print(f"iolens report: {exc}", file=sys.stderr)
            return 1
    from iolens.report.multi import build_multi, is_run  # noqa: PLC0415

    with no_cycle_collection():  # NOTE [no cycle collection] in iolens/cli/_batch.py
        if os.path.isdir(ns.run) and not is_run(ns.run):
            return _run_multi(ns, build_multi)
        return _report(ns, plotlyjs)


def _report(ns: argparse.Namespace, plotlyjs: str | None) -> int:
    """The report of one run directory."""
    from iolens.report.build import build_report  # noqa: PLC0415 - keep `iolens --help` fast

    try:
        data = read_run(ns.run, "report")
    except IolensError as exc:
        print(f"iolens report: {exc}", file=sys.stderr)
        return 2
    report = build_report(data)
    output = ns.output
    default_output = False
    if ns.format == "json":
        text = json_text(report)
    elif ns.format == "html":
        from iolens.report.html import render_html  # noqa: PLC0415

        text = render_html(report, data.series, plotlyjs=plotlyjs)
        if not output:  # a page on standard output is of no use to a browser
            output = os.path.join(data.path, "report.html")
            default_output = True
    else:
        from iolens.report.text import render_text  # noqa: PLC0415 - rich for text only

        text = render_text(report, to_terminal=output is None)
    try:
        if output:
            _write_atomic(output, text, streams=not default_output)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    except OSError as exc:
        where = output or "standard output"
        hint = " (choose another file with -o FILE)" if default_output else ""
        print(f"iolens report: cannot write {where}: {exc.strerror or exc}{hint}",
              file=sys.stderr)
        return 1
    if output:
        print(f"iolens report: wrote {output}", file=sys.stderr)
    return 0


def _run_multi(ns: argparse.Namespace, build: Any) -> int:
    """The report over a folder of run directories (one per node)."""
    if ns.format == "html":
        print("iolens report: the HTML report shows one run; give one of the run directories "
              f"in {ns.run}, or --format text or json for all of them", file=sys.stderr)
        return 2
    try:
        report = build(ns.run)
    except IolensError as exc:
        print(f"iolens report: {exc}", file=sys.stderr)
        return 2
    if ns.format == "json":
        text = json_text(report)
    else:
        from iolens.report.text import render_text  # noqa: PLC0415 - rich for text only

        text = render_text(report, to_terminal=ns.output is None, multi=True)
    try:
        if ns.output:
            _write_atomic(ns.output, text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    except OSError as exc:
        print(f"iolens report: cannot write {ns.output or 'standard output'}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
