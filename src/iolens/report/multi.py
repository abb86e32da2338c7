"""One report over several runs of one job: one run directory per node (multi-node training).

``iolens report DIR`` where DIR holds run directories (one per node, as each
node's ``iolens run`` wrote them) gives per-node and per-rank tables, and the
``straggler`` finding across all ranks of all nodes: in synchronous
data-parallel training the slowest input pipeline sets the pace of all.
"""

from __future__ import annotations

import os
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
    for path in paths:
        try:
            run = load_run(path)
        except IolensError as exc:  # one node's unusable run: the others still report
            notes.append(f"{os.path.basename(path)}: left out: {exc}")
            continue
        rep = build_report(run)
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
