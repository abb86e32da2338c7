"""``iolens compare BASE NEW``: two runs side by side, and a regression gate for CI."""

from __future__ import annotations

import argparse
import io
import shutil
import sys
from typing import TYPE_CHECKING, Any

from iolens._errors import IolensError
from iolens.cli._batch import json_text, no_cycle_collection, read_run

if TYPE_CHECKING:
    from iolens.analysis.rundata import RunData

_EPILOG = """\
What is compared (BASE and NEW, the change, and its 95% confidence interval):
  throughput       batches per second of step time (higher is better)
  step time        the median step time per batch (lower is better)
  data wait        the mean time a batch waited for its data (lower is better)
  data-wait share  data wait / step time, compared in percentage points
  per device in both runs: %util, r_await, read MB/s; the job's read MB/s
and the verdict of each run (class, severity), saying whether the class changed.

Each run's step time and data wait come from the best figures it has:
every batch (its timing files, as `iolens report` reads them), or its
per-interval figures when it lacks them. When only one run has every batch,
step time is compared as a mean, and the other run's p50 and p95 are
approximate: the output marks them as not the same kind. A difference is
"real" when a block bootstrap of the two runs (2000 resamples of contiguous
stretches of batches, fixed seed; each resample keeps as many epoch starts as
the run had) puts its 95% confidence interval entirely on one side of no
change; otherwise it is "within noise". Runs with fewer than 20 batches (or
intervals) are too short to tell.

--fail-on METRIC:THRESHOLD[,...]  (repeatable) a bound on regression:
  step-time:N%        NEW's step time more than N% longer
  data-wait:N%        NEW's mean data wait more than N% longer
  throughput:N%       NEW's throughput more than N% lower
  data-wait-share:N   NEW's data-wait share more than N percentage points higher
A bound is crossed only when the regression is larger than the threshold, the
difference is real (outside the noise inside each run), and even the nearer end
of its interval is worse than runs of one configuration differ: 15% for the
step time, 3% for throughput, 12% for the data wait, 2.5 points for the share
(measured on this project's lab runs). A bound whose runs are too short to
tell is not crossed (a warning says so), unless --strict is given. throughput
is the steadiest gate; data-wait is relative: a job that hardly waits can
double a tiny wait; data-wait-share is then the better gate.

A bound that cannot be judged because a run lacks its figure (no timed
DataLoader batches: record the run under `iolens run`) is named on stderr
and exits 2, unless another bound is crossed (exit 1).

A NEW run that did not finish cleanly (its job exited non-zero, its
recording was cut short, or it timed no batch) fails the gate before any
bound is judged, with its own message and exit code 3: a crash is no
regression to measure, and no pass either. --allow-failed judges it anyway.

exit codes: 0 no bound crossed (or none given), 1 a bound crossed (with
--strict: or one whose runs are too short to tell), 2 bad input or cannot
judge (no run at BASE or NEW, an empty run, a bad --fail-on, or a bound on
step figures of a run without timed batches), 3 with --fail-on: NEW did not
finish cleanly

examples:
  iolens compare runs/before runs/after
  iolens compare baseline.run new.run --fail-on throughput:5%,data-wait-share:5
  iolens compare baseline.run new.run --format json > compare.json
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens compare``."""
    p = argparse.ArgumentParser(
        prog="iolens compare",
        usage="iolens compare BASE NEW [--format text|json] [--fail-on METRIC:N%%[,...]] "
              "[--strict] [--allow-failed]",
        description="Compare two recorded runs: throughput, step time, data wait, device "
                    "load and verdict side by side, with whether each difference is real "
                    "given the runs' noise; fail on a regression.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", metavar="BASE", help="the reference run directory")
    p.add_argument("new", metavar="NEW", help="the run to judge against it")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="output format (default text)")
    p.add_argument("--fail-on", action="append", default=[], metavar="SPEC",
                   help="exit 1 when NEW regresses beyond a bound, e.g. step-time:5%%,"
                        "data-wait:10%%,throughput:5%%,data-wait-share:5 (repeatable); "
                        "crossed only when the regression is also real, not noise")
    p.add_argument("--strict", action="store_true",
                   help="a bound that cannot be judged (runs too short) fails the gate too")
    p.add_argument("--allow-failed", action="store_true",
                   help="judge the bounds even when NEW did not finish cleanly (by default "
                        "that fails the gate, exit 3)")
    return p


def run(ns: argparse.Namespace) -> int:
    """Compare, print, and return the exit code."""
    from iolens.analysis import compare  # noqa: PLC0415 - keep `iolens --help` fast

    bounds: list[compare.Bound] = []
    if ns.fail_on:
        try:
            bounds = compare.parse_fail_on(ns.fail_on)
        except ValueError as exc:
            print(f"iolens compare: --fail-on: {exc}", file=sys.stderr)
            return 2
    runs: list[RunData] = []
    errors: list[str] = []
    with no_cycle_collection():  # NOTE [no cycle collection] in iolens/cli/_batch.py
        for path in (ns.base, ns.new):  # (both read: a wrong path each is told at once)
            try:
                runs.append(read_run(path, "compare"))
            except IolensError as exc:
                errors.append(str(exc))
        if not errors:
            try:
                cmp = compare.compare_runs(*runs)
            except IolensError as exc:
                errors.append(str(exc))
    if errors:
        for e in errors:
            print(f"iolens compare: {e}", file=sys.stderr)
        return 2
    new = runs[1]
    gate = compare.evaluate_gate(cmp.metrics, bounds)
    obj = compare.to_dict(cmp, gate, strict=ns.strict)
    failed = compare.unfinished(new) if bounds else None
    if failed is not None:
        obj["new_failed"] = failed
    if ns.format == "json":
        text = json_text(obj)
    else:
        # Paths and notes come from the runs: no control character reaches the terminal.
        from iolens.report.text import printable  # noqa: PLC0415 - rich only for text

        text = _render_text(printable(obj))
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        print(f"iolens compare: cannot write standard output: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    if failed is not None and not ns.allow_failed:
        print(f"iolens compare: NEW did not finish cleanly: {failed}; the gate fails "
              "(--allow-failed judges its figures anyway)", file=sys.stderr)
        return 3
    for g in gate:
        if g.status == "too-short":
            print(f"iolens compare: warning: {g.bound.text()} cannot be judged: {g.reason}"
                  + (" (fails: --strict)" if ns.strict else " (not counted as crossed)"),
                  file=sys.stderr)
    for g in compare.unjudged(gate):
        print(f"iolens compare: {g.bound.text()} cannot be judged: {g.reason}", file=sys.stderr)
    code = compare.gate_exit(gate, strict=ns.strict)
    if code == 1:
        bad = ("crossed", "too-short") if ns.strict else ("crossed",)
        crossed = ", ".join(g.bound.text() for g in gate if g.status in bad)
        print(f"iolens compare: regression: {crossed}", file=sys.stderr)
    return code


# -- text ------------------------------------------------------------------------------

_TRAINING_IDS = ("throughput", "step-time", "data-wait", "data-wait-share")

_OUTCOME_STYLE = {"worse": "bold red", "better": "bold green", "changed": "bold",
                  "within-noise": "dim", "unknown": "yellow"}


def _fmt(v: Any, unit: str) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    if unit == "s":
        return f"{v * 1000:.2f} ms"
    if unit == "%":
        return f"{v:.1f}%"
    if unit == "ms":
        return f"{v:.2f} ms"
    if unit == "steps/s":
        return f"{v:.2f}/s"
    return f"{v:.2f} {unit}"


def _judgement(m: dict[str, Any]) -> str:
    """The statement without its leading "NEW is ", which the column heading says."""
    s = str(m.get("statement") or "")
    return s[len("NEW is "):] if s.startswith("NEW is ") else s


def _render_text(obj: dict[str, Any]) -> str:
    from rich.console import Console, Group, RenderableType  # noqa: PLC0415 - text only
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    from iolens.analysis.compare import BATCHES  # noqa: PLC0415

    def metrics_table(title: str, rows: list[dict[str, Any]]) -> Table:
        t = Table(title=title, title_justify="left")
        t.add_column("metric")
        t.add_column("BASE", justify="right")
        t.add_column("NEW", justify="right")
        t.add_column("NEW is ...")
        for m in rows:
            label = str(m.get("label"))
            stat = m.get("statistic")
            if m["id"] in ("step-time", "data-wait"):
                label += f" ({stat})"
            t.add_row(Text(label), _fmt(m.get("base"), m["unit"]), _fmt(m.get("new"), m["unit"]),
                      Text(_judgement(m), style=_OUTCOME_STYLE.get(str(m.get("outcome")), "")))
        return t

    parts: list[RenderableType] = []
    head = Text("iolens compare", style="bold")
    parts.append(head)
    for key in ("base", "new"):
        side = obj[key]
        line = Text(f"  {key.upper():<5}")
        line.append(str(side["path"]))
        extra = f"  {side['batches']} batches, {side['intervals']} intervals"
        if side.get("sampled_every", 1) > 1:
            extra += f", one in every {side['sampled_every']} used"
        if side.get("exit_code") not in (0, None):
            extra += f", exit code {side['exit_code']}"
        if side.get("set"):
            from iolens.training.overrides import line as set_line  # noqa: PLC0415

            extra += ", run with " + set_line(side["set"]) + "".join(
                f" --set-loader {n}" for n in side.get("set_loaders") or [])
        line.append(extra, style="dim")
        parts.append(line)
    parts.append(Text(""))

    train = [m for m in obj["metrics"] if m["id"] in _TRAINING_IDS and m.get("device") is None]
    load = [m for m in obj["metrics"] if m not in train]
    samples = str(obj["method"]["samples"])
    if samples not in (obj["base"].get("samples"), obj["new"].get("samples")):  # mixed
        samples = f"BASE {obj['base'].get('samples')}, NEW {obj['new'].get('samples')}"
    parts.append(metrics_table(f"training (from {samples}; "
                               f"{obj['method']['confidence'] * 100:.0f}% confidence "
                               "intervals by block bootstrap)", train))

    dist = Table(title="distributions (ms per batch)", title_justify="left")
    mixed = any(obj[k]["distributions"].get("same_kind") is False for k in ("base", "new"))
    for col in ("", "mean", "p50", "p95", "max") + (("from",) if mixed else ()):
        dist.add_column(col, justify="left" if col in ("", "from") else "right")
    for part, name in (("step", "step"), ("data_wait", "data wait")):
        for key in ("base", "new"):
            dd = obj[key]["distributions"]
            d = dd.get(part) or {}
            cells = [f"{d[k] * 1000:.2f}" if isinstance(d.get(k), (int, float)) else "-"
                     for k in ("mean_s", "p50_s", "p95_s", "max_s")]
            if mixed:  # next to the figures: which kind they are
                cells.append(BATCHES if dd.get("source") == BATCHES
                             else "per-interval figures: p50, p95 approximate")
            dist.add_row(f"{name} {key.upper()}", *cells)
    parts.append(dist)
    if mixed:
        note = obj["base"]["distributions"].get("note") or obj["new"]["distributions"].get("note")
        parts.append(Text(f"  note: {note}", style="yellow"))
    if load:
        parts.append(metrics_table("devices and the job's reads (over the intervals)", load))

    vb, vn = obj["verdicts"]["base"], obj["verdicts"]["new"]
    parts.append(Text("verdict", style="bold"))
    for key, v in (("BASE", vb), ("NEW", vn)):
        line = Text(f"  {key:<5}")
        line.append(str(v.get("class")), style="bold")
        share = v.get("data_wait_share")
        line.append(f" ({v.get('severity')}"
                    + (f", data wait {share * 100:.1f}% of step time" if share is not None
                       else "") + ")")
        parts.append(line)
        if v.get("evidence"):
            parts.append(Text(f"        {v['evidence'][0]}", style="dim"))
    if obj["verdicts"]["class_changed"]:
        parts.append(Text(f"  the class changed: {vb.get('class')} -> {vn.get('class')}",
                          style="bold yellow"))
    else:
        parts.append(Text(f"  the class is unchanged: {vb.get('class')}"))

    proof = obj.get("prediction")
    if isinstance(proof, dict) and proof.get("change"):
        from iolens.analysis.proof import text as proof_text  # noqa: PLC0415

        parts.append(Text("prediction (BEFORE's, for the change NEW made)", style="bold"))
        held = proof.get("held")
        parts.append(Text(f"  {proof_text(proof)}", style="green" if held else
                          "bold red" if held is False else ""))

    if obj["fail_on"]:
        parts.append(Text(""))
        parts.append(Text("fail-on" + (" (strict)" if obj["strict"] else ""), style="bold"))
        for g in obj["fail_on"]:
            line = Text(f"  {g['bound']:<22}")
            status = str(g["status"])
            line.append(f"{status:<10}", style="bold red" if g["crossed"] else
                        "yellow" if status != "passed" else "green")
            line.append(str(g["reason"]))
            parts.append(line)
        unjudged = [str(g["bound"]) for g in obj["fail_on"] if g["status"] == "no-data"]
        if obj["regressed"]:
            result = "REGRESSED" + (f" ({', '.join(unjudged)} cannot be judged)" if unjudged
                                    else "")
        elif unjudged:  # never "no bound crossed" when a bound could not be judged at all
            result = (f"cannot judge {', '.join(unjudged)}: a run lacks the figure (see "
                      "fail-on above)")
        else:
            result = "no bound crossed"
        parts.append(Text("result: " + result, style="bold red" if obj["regressed"] else
                          "bold yellow" if unjudged else "bold green"))
    notes = list(obj["warnings"])
    for key in ("base", "new"):
        notes += [f"{key.upper()}: {n}" for n in obj[key]["notes"]]
    if notes:
        parts.append(Text(""))
        parts.append(Text("notes", style="bold"))
        parts += [Text(f"  - {n}") for n in notes]

    buf = io.StringIO()
    tty = sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if tty else 120
    console = Console(file=buf, force_terminal=tty, width=width,
                      color_system="auto" if tty else None, highlight=False)
    console.print(Group(*parts))
    return buf.getvalue()
