"""What the live view shows: the last few records, totals since it began, and its header (pure)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

Record = Mapping[str, Any]
"""One interval record as :meth:`iolens.recorder.sampler.Recorder.sample` returns it."""

DEFAULT_LENGTH = 30
"""Records kept for the sparklines: half a minute at the default interval."""


@dataclass
class Header:
    """What the view is watching, shown above the figures."""

    title: str = "iolens"
    command: str | None = None
    """The job's command line, if a process is watched."""
    pid: int | None = None
    """The watched process (with its descendants); None for the whole machine."""
    run_dir: str | None = None
    """Where the run is recorded; None when nothing is (``iolens top``)."""
    gpu_reason: str | None = None
    """Why there is no GPU figure (NVML missing, no driver), shown in the GPU panel."""
    notes: list[str] = field(default_factory=list)
    """Things the user should know (a fallback taken, sampling failures): the last few show."""
    footer: str | None = None
    """A last line, e.g. how to quit."""
    storage: list[dict[str, Any]] = field(default_factory=list)
    """What serves the dataset as found so far (meta.json's ``storage``), for the verdict."""


class History:
    """A bounded deque of the most recent records plus running totals over all of them.

    The totals (batches, epochs, data wait and step time) cover every record
    added, not only the ones still kept, so the view can show "since start"
    figures without keeping the whole run in memory.
    """

    def __init__(self, length: int = DEFAULT_LENGTH, records: Iterable[Record] = ()) -> None:
        self.records: deque[Record] = deque(maxlen=max(1, length))
        self.count = 0
        """Records added since the start."""
        self.batches = 0
        self.epochs = 0
        self.wait_s = 0.0
        """Data wait summed over every interval whose steps the DataLoader timed."""
        self.step_s = 0.0
        """Step time summed over the same intervals."""
        for rec in records:
            self.add(rec)

    def add(self, record: Record) -> None:
        """Keep ``record`` (dropping the oldest beyond the length) and count it in the totals.

        Anything but a mapping is ignored.
        """
        if not isinstance(record, Mapping):
            return
        self.records.append(record)
        self.count += 1
        train = record.get("train")
        if not isinstance(train, Mapping):
            return
        self.batches += _int(train.get("batches"))
        self.epochs += _int(train.get("epochs_started"))
        if train.get("step_source") == "dataloader":
            self.wait_s += _float(_get(train, "data_wait", "sum_s"))
            self.step_s += _float(_get(train, "step", "sum_s"))

    @property
    def latest(self) -> Record | None:
        """The newest record, or None before the first."""
        return self.records[-1] if self.records else None

    @property
    def wait_share(self) -> float | None:
        """Share of step time spent waiting for data since the start, or None with no steps."""
        return self.wait_s / self.step_s if self.step_s > 0 else None

    def window_wait_share(self) -> float | None:
        """The same share over the records still kept (the recent window)."""
        wait = step = 0.0
        for rec in self.records:
            train = rec.get("train")
            if isinstance(train, Mapping) and train.get("step_source") == "dataloader":
                wait += _float(_get(train, "data_wait", "sum_s"))
                step += _float(_get(train, "step", "sum_s"))
        return wait / step if step > 0 else None

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)


def _get(mapping: Mapping[str, Any], *keys: str) -> Any:
    """``mapping[k1][k2]...``, or None where any level is missing or not a mapping."""
    cur: Any = mapping
    for key in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _float(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return 0.0


def _int(value: Any) -> int:
    return int(_float(value))
