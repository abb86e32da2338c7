"""What the verdict reads of a run (:class:`RunColumns`) and its windows (:class:`Span`)
(NOTE [columns] in iolens/analysis/columns/__init__.py)."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

from iolens.analysis.columns.named import (
    DeviceColumns,
    DeviceLoad,
    RankColumns,
    StoreColumns,
)
from iolens.analysis.columns.stage import StageColumns


@dataclass(frozen=True)
class RunColumns:
    """What the verdict reads of a run, read once (NOTE [columns]): the columns of its
    intervals and of its devices, and those of its intervals with timed batches (``steps``)
    at ``timed_at`` among them. Spans of the run are indices into these, not records."""

    run: StageColumns
    devices: dict[str, DeviceColumns]
    timed_at: Sequence[int]
    steps: StageColumns
    stores: dict[str, StoreColumns]
    """Each storage entry's columns (a FUSE mount's, a network store's)."""
    ranks: dict[str, RankColumns]
    """Each rank's columns (a multi-rank job's)."""


@dataclass(frozen=True)
class Span:
    """Some of a run's timed intervals (a verdict's window): their positions among them
    (``picks``, in order) in the run's columns."""

    cols: RunColumns
    picks: Sequence[int]

    def total(self, column: str) -> float:
        """The timed intervals' column ``column`` summed over the span, as sum() does."""
        col: Sequence[float] = getattr(self.cols.steps, column)
        out: float = sum(col[i] for i in self.picks)
        return out

    def within(self) -> set[int]:
        """The span's intervals, as indices among the run's."""
        at = self.cols.timed_at
        return {at[i] for i in self.picks}

    def load(self, device: str, within: Container[int] | None = None) -> DeviceLoad:
        """``device`` over the span (``within``: :meth:`within`, where the caller has it)."""
        dev = self.cols.devices.get(device)
        if dev is None:
            return DeviceLoad(device)
        return dev.load(self.within() if within is None else within)

    def devices(self, within: Container[int] | None = None) -> list[str]:
        """The devices the span's intervals name, in the order they first name them."""
        within = self.within() if within is None else within
        first: dict[str, int] = {}
        for name, d in self.cols.devices.items():
            i = next((i for i in d.at if i in within), None)
            if i is not None:
                first[name] = i
        return sorted(first, key=first.__getitem__)

    def bounds(self) -> tuple[float, float] | None:
        """When the span's first interval began and its last ended (seconds into the run,
        the start at 0 or later); None for an empty span."""
        if not self.picks:
            return None
        steps, first = self.cols.steps, self.picks[0]
        return (max(0.0, steps.elapsed_s[first] - steps.secs[first]),
                steps.elapsed_s[self.picks[-1]])
