"""What the verdict reads of a run (:class:`RunColumns`) and its windows (:class:`Span`)
(NOTE [columns] in iolens/analysis/columns/__init__.py)."""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from iolens.analysis.columns.named import (
    DeviceColumns,
    DeviceLoad,
    RankColumns,
    StoreColumns,
)
from iolens.analysis.columns.stage import StageColumns


@dataclass(frozen=True)
class RunView:
    """A run as the verdict takes it: the columns of its intervals, and those of its
    devices, storage entries and ranks, read once from its records (NOTE [columns])."""

    run: StageColumns
    devices: dict[str, DeviceColumns]
    stores: dict[str, StoreColumns]
    ranks: dict[str, RankColumns]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> RunView:
        return cls(StageColumns.of(records), DeviceColumns.of(records),
                   StoreColumns.of(records), RankColumns.of(records))

    def take(self, idx: Sequence[int]) -> RunView:
        """The view of the intervals ``idx`` (in the run's order) only: the one read from
        their records alone."""
        return RunView(self.run.take(idx), _take(self.devices, idx), _take(self.stores, idx),
                       _take(self.ranks, idx))


_Named = TypeVar("_Named", DeviceColumns, StoreColumns, RankColumns)


def _take(named: dict[str, _Named], idx: Sequence[int]) -> dict[str, _Named]:
    """The columns of each name over the intervals ``idx`` (in order) only, their ``at``
    the intervals' positions among ``idx``, in the order those intervals first name them
    (as :meth:`DeviceColumns.of` would give them)."""
    pos = {i: k for k, i in enumerate(idx)}
    out: list[tuple[int, _Named]] = []
    for c in named.values():
        keep = [j for j, i in enumerate(c.at) if i in pos]
        if not keep:
            continue
        cols: dict[str, Any] = {f: tuple(col[j] for j in keep)
                                for f, col in vars(c).items() if f != "name"}
        cols["at"] = tuple(pos[i] for i in cols["at"])
        out.append((cols["at"][0], replace(c, **cols)))
    out.sort(key=lambda p: p[0])  # (stable: names first seen in one interval keep their order)
    return {c.name: c for _, c in out}


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


"""NOTE [the time a span's batches took]: a batch counts in the interval it ends in. Where
steps outlast the interval (a 200 ms step read each 0.25 s), some intervals end no batch:
they are not timed, and not in a span, yet their seconds went to the batches of the next
timed one, and so did what the device read in them. A rate over the timed intervals alone
then runs fast: the demo's run of files on its slow disk served 150 samples/s over its 119
intervals, 224 over its 72 timed ones, and read 63 KiB a sample where the timed ones gave
44, so the device's ceiling was put at 7.2 steps/s where it served 4.7, and the pack at
1.4 times what it then served. :meth:`Span.covered` adds to each timed interval the
untimed ones before it that its longest step reached back into: never past the timed one
before it (nor before the run's first), so a pause with no batch (an evaluation, a
checkpoint) stays out. A storage-bound window's device rate, the fetch its evidence tells
and the bytes a sample of its pack are taken over those."""


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

    def covered(self) -> set[int]:
        """The span's intervals and, before each, those its batches took (NOTE [the time a
        span's batches took]), as indices among the run's."""
        run, steps, at = self.cols.run, self.cols.steps, self.cols.timed_at
        out = set()
        for k in self.picks:
            i = at[k]
            out.add(i)
            took, j = run.secs[i], i - 1
            while k > 0 and j > at[k - 1] and took < steps.step_max_s[k]:
                out.add(j)
                took += run.secs[j]
                j -= 1
        return out

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
