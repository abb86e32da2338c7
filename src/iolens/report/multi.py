"""One report over several runs of one job: one run directory per node (multi-node training).

``iolens report DIR`` where DIR holds run directories (one per node, as each
node's ``iolens run`` wrote them) gives per-node and per-rank tables, and the
``straggler`` finding across all ranks of all nodes: in synchronous
data-parallel training the slowest input pipeline sets the pace of all. Runs
that did not run at once (one after another) are not nodes of one job: the
report says so and names the commands for them instead.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from iolens._errors import IolensError
from iolens.analysis.rundata import load_run
from iolens.analysis.verdict import straggler
from iolens.report.build import REPORT_SCHEMA, build_report
from iolens.rundir import META, RECORDS


def is_run(path: str) -> bool:
    """True if ``path`` is a run directory (it holds meta.json or records.jsonl)."""
    return any(os.path.exists(os.path.join(path, f)) for f in (META, RECORDS))


def find_runs(folder: str) -> list[str]:
    """The run directories directly inside ``folder``, sorted by name."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise IolensError(f"{folder}: cannot list it ({exc.strerror or exc})") from exc
    return [os.path.join(folder, n) for n in names
            if os.path.isdir(os.path.join(folder, n)) and is_run(os.path.join(folder, n))]


def build_multi(folder: str) -> dict[str, Any]:
    """The merged report of every run directory in ``folder``."""
    paths = find_runs(folder)
    if not paths:
        raise IolensError(f"{folder}: not a run directory, and no run directory inside it")
    nodes: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    notes: list[str] = []
    spans: list[tuple[str, tuple[float, float] | None]] = []
    for path in paths:
        try:
            run = load_run(path)
        except IolensError as exc:  # one node's unusable run: the others still report
            notes.append(f"{os.path.basename(path)}: left out: {exc}")
            continue
        rep = build_report(run)
        spans.append((os.path.basename(path), _span(rep["run"])))
        host = rep["run"].get("host") or os.path.basename(path)
        notes += [f"{os.path.basename(path)}: {n}" for n in rep["notes"]]
        node_ranks = rep["training"].get("ranks") or []
        if not node_ranks and rep["training"].get("batches"):
            # A single-process job on this node: count it as one rank.
            dw, st = rep["training"]["data_wait"], rep["training"]["step"]
            node_ranks = [{"rank": None, "batches": rep["training"]["batches"],
                           "data_wait_s": dw.get("sum_s"), "step_s": st.get("sum_s"),
                           "data_wait_share": rep["verdict"].get("data_wait_share"),
                           "step_mean_s": st.get("mean_s")}]
        for r in node_ranks:
            ranks.append({**r, "host": host, "run": os.path.basename(path)})
        nodes.append({"host": host, "path": rep["run"]["path"], "verdict": rep["verdict"],
                      "findings": rep["findings"], "training": rep["training"],
                      "devices": rep["devices"]})
    if not nodes:
        raise IolensError(f"{folder}: no usable run directory inside it ({'; '.join(notes)})")
    _at_once(folder, spans)
    for r in ranks:
        if r.get("rank") is None:
            r["rank"] = r["run"]
    slow = straggler(ranks)
    # The verdict shown first: the node of the straggler, else the node that waits most.
    worst = max(nodes, key=lambda n: n["verdict"].get("data_wait_share") or -1.0)
    if slow is not None:
        worst = next((n for n in nodes
                      if os.path.basename(n["path"]) == slow.subject.get("run")), worst)
    findings = ([slow.to_dict()] if slow is not None else []) + [
        {**f, "node": worst["host"]} for f in worst["findings"]]
    return {
        "report_schema": REPORT_SCHEMA,
        "runs": [n["path"] for n in nodes],
        "notes": notes,
        "verdict": {**worst["verdict"], "node": worst["host"]},
        "findings": findings,
        "ranks": ranks,
        "nodes": nodes,
    }


CLOCK_SKEW_S = 2.0
"""How far apart two nodes' clocks may be: runs that ended this long before another began
did not run at once."""


def _span(run: dict[str, Any]) -> tuple[float, float] | None:
    """When a run began and ended (seconds since the epoch), from its report's ``run``;
    None where its meta.json does not say."""
    start, secs = run.get("start"), run.get("duration_s")
    if not isinstance(start, str) or not isinstance(secs, int | float) or isinstance(
            secs, bool):
        return None
    try:
        began = datetime.fromisoformat(start).timestamp()
    except ValueError:
        return None
    return began, began + float(secs)


def _at_once(folder: str, spans: list[tuple[str, tuple[float, float] | None]]) -> None:
    """Raise IolensError where the runs did not all run at once: the nodes of one job do,
    while runs one after another (a run, then the run after a fix) are not ranks of one
    job, and a straggler among them would only compare the two runs' speeds."""
    known = [(name, span) for name, span in spans if span is not None]
    if len(known) < 2:
        return
    first = min(known, key=lambda x: x[1][1])  # the one that ended first
    last = max(known, key=lambda x: x[1][0])  # the one that began last
    if last[1][0] - first[1][1] < CLOCK_SKEW_S:
        return
    gap = last[1][0] - first[1][1]
    raise IolensError(
        f"{folder}: its runs did not run at once, as the nodes of one job do ({first[0]} "
        f"ended {gap:.0f} s before {last[0]} began): report each run (iolens report "
        f"{os.path.join(folder, last[0])}), or compare two (iolens compare "
        f"{os.path.join(folder, first[0])} {os.path.join(folder, last[0])})")
