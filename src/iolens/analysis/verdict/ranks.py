"""The ranks of a multi-rank job: each rank's figures and the straggler among them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from iolens.analysis import rules
from iolens.analysis.columns import RankColumns, added
from iolens.analysis.verdict.result import Finding, Recommendation


def rank_figures(ranks: dict[str, RankColumns], host: str | None = None
                 ) -> list[dict[str, Any]]:
    """Per rank over the run (its ``ranks``' columns): batches, data wait and step seconds,
    share (multi-rank jobs)."""
    out = []
    for rank, c in sorted(ranks.items(), key=lambda kv: _rank_key(kv[0])):
        n, wait, step = added(c.batches), added(c.wait_s), added(c.step_s)
        out.append({"rank": rank, "host": host, "batches": int(n), "data_wait_s": round(wait, 6),
                    "step_s": round(step, 6),
                    "data_wait_share": round(wait / step, 4) if step > 0 else None,
                    "step_mean_s": round(step / n, 6) if n else None})
    return out

def _rank_key(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)

def straggler(ranks: Sequence[dict[str, Any]]) -> Finding | None:
    """The rank (on its host) whose data wait holds the others back, if one does."""
    usable = [r for r in ranks if r.get("data_wait_share") is not None
              and int(r.get("batches") or 0) >= rules.STRAGGLER_MIN_BATCHES]
    if len(usable) < 2:
        return None
    slow = max(usable, key=lambda r: float(r["data_wait_share"]))
    others = [float(r["data_wait_share"]) for r in usable if r is not slow]
    base = statistics.median(others)
    share = float(slow["data_wait_share"])
    if (share < rules.MODERATE or share - base < rules.STRAGGLER_GAP
            or share < rules.STRAGGLER_RATIO * base):
        return None
    where = f"rank {slow['rank']}" + (f" on {slow['host']}" if slow.get("host") else "")
    gap = share - base
    return Finding("straggler", [
        f"{where} waited {share * 100:.0f}% of its step time for data, the other "
        f"{len(others)} rank(s) {base * 100:.0f}% (median): in synchronous data-parallel "
        "training the slowest input pipeline sets every rank's pace"], None, [
        Recommendation(
            f"look at {where}'s input: its storage (a slower, remote or busier disk), its "
            "page cache, its DataLoader workers and CPU",
            f"it waits {gap * 100:.0f} points more than the others",
            f"up to {1 / (1 - min(gap, 0.99)):.2f}x more steps per second for every rank if "
            "it waited no more than they do")],
        {k: slow[k] for k in ("rank", "host", "run") if k in slow})
