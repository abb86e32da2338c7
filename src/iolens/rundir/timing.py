"""Reading the training process's timing records and summarizing them per interval (pure)."""

from __future__ import annotations

import json
import math
import os
from array import array
from dataclasses import dataclass, field
from typing import Any

from iolens.rundir import records
from iolens.sources.procfs import pid_alive


def distribution(values_ns: list[int]) -> dict[str, float]:
    """count, sum, max, p50 and p95 of durations given in ns, in seconds (nearest rank)."""
    n = len(values_ns)
    if n == 0:
        return {"count": 0, "sum_s": 0.0, "max_s": 0.0, "p50_s": 0.0, "p95_s": 0.0}
    ordered = sorted(values_ns)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * n) - 1)] / 1e9

    return {"count": n, "sum_s": sum(ordered) / 1e9, "max_s": ordered[-1] / 1e9,
            "p50_s": rank(0.50), "p95_s": rank(0.95)}


@dataclass
class _Stream:
    last_end: int | None = None
    """When the previous batch was handed to the loop (or the epoch began)."""
    recent: list[int] = field(default_factory=list)
    """The loop's time between its latest batches (step less data wait, ns), oldest first,
    at most PAUSE_WINDOW of them."""


PAUSE_WINDOW = 32
PAUSE_AFTER = 8
"""A batch is held against the loop's PAUSE_WINDOW latest ones, once it has this many."""
PAUSE_FACTOR = 5
PAUSE_MIN_NS = 50_000_000
"""NOTE [pauses]: a batch whose step, less its data wait, took PAUSE_FACTOR times the
median of the loop's latest ones and PAUSE_MIN_NS more is a pause of the loop between two
steps (a checkpoint written, a validation pass, an evaluation logged), not a step: the
model's compute is the other batches', and what the pauses take beyond a step is their
own stage, which no change to the input pipeline removes."""


_JOIN_KEEP_NS = 30_000_000_000
"""A worker's READY record or a loop's HANDOVER record waits this long for its other
half (NOTE [stage timing] in iolens/training/_hooks.py), then is dropped."""


@dataclass
class _Stages:
    """One interval's sums of the input pipeline's stages, over the processes that fetch."""

    batches: int = 0
    samples: int = 0
    fetch_ns: int = 0
    fetch_cpu_ns: int = 0
    collate_ns: int = 0
    idle_ns: int = 0
    files: int = 0
    fetch_max_ns: int = 0
    pids: set[int] = field(default_factory=set)

    def record(self, handovers: list[int], in_process: bool) -> dict[str, Any]:
        return {"batches": self.batches, "samples": self.samples, "processes": len(self.pids),
                "in_process": in_process,
                "fetch_s": self.fetch_ns / 1e9, "fetch_cpu_s": self.fetch_cpu_ns / 1e9,
                "fetch_max_s": self.fetch_max_ns / 1e9, "collate_s": self.collate_ns / 1e9,
                "idle_s": self.idle_ns / 1e9, "files": self.files,
                "handover": distribution(handovers)}


@dataclass
class TrainingAggregator:
    """Turns timing records into per-interval figures.

    For each loader in each process, a batch's *data wait* is how long
    ``next()`` took, and its *step* is the time from the previous batch's
    hand-over (or from the start of the epoch) to this one's.
    """

    waits: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    """When each batch of ``waits`` was handed over (ns), in the same order."""
    marks: list[int] = field(default_factory=list)
    epochs: int = 0
    num_workers: int = 0
    """The most DataLoader workers a loader that started an epoch asked for."""
    epoch_start_waits: list[int] = field(default_factory=list)
    epoch_start_steps: list[int] = field(default_factory=list)
    """The steps of the batches that opened an epoch, in the order of ``epoch_start_waits``:
    from the start of the epoch (``iter()``, which starts workers) to the batch."""
    firsts: list[int] = field(default_factory=list)
    """Indices into ``waits`` (this interval) of the batches that opened an epoch."""
    pause_waits: list[int] = field(default_factory=list)
    pause_steps: list[int] = field(default_factory=list)
    """The data waits and steps of the batches whose step held a pause (NOTE [pauses])."""
    worker_pids: dict[int, int] = field(default_factory=dict)
    """Worker pid -> worker id, as the loaders reported them."""
    ranks: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Training process pid -> (rank, world size), for multi-rank jobs (torchrun)."""
    skipped: int = 0
    """Records left out since the start: an unknown type, or times or counts that cannot be
    (a batch returned before it was asked for, a negative worker count): a damaged file."""
    _per_pid: dict[int, list[float]] = field(default_factory=dict)
    """This interval's [batches, data wait ns, step ns] of each training process."""
    _streams: dict[tuple[int, int], _Stream] = field(default_factory=dict)
    _last_mark: dict[int, int] = field(default_factory=dict)
    _epoch_pending: set[tuple[int, int]] = field(default_factory=set)
    worker_loader: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Worker pid -> (training process pid, loader tag), from the WORKER records."""
    _stages: _Stages = field(default_factory=_Stages)
    _handovers: list[int] = field(default_factory=list)
    _ready: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)
    """The times workers handed batches over (READY records) not yet joined, keyed by
    (training process pid, loader tag, batch index) once the worker's loader is known
    and by (-worker pid, 0, batch index) until then."""
    _waiting: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    """HANDOVER records not yet joined: (pid, tag, batch index, next() called, returned,
    when its epoch started)."""
    _epoch_at: dict[tuple[int, int], int] = field(default_factory=dict)
    _latest: int = 0
    """The latest return of ``next()`` in a HANDOVER record (ns, the training process's
    clock), which ages the unjoined ones: a damaged READY time cannot move it."""
    _in_process: set[int] = field(default_factory=set)
    iterable: bool = False
    """A loader that is not a torch DataLoader started an epoch in this interval."""
    last_data_ns: int = 0
    """When the loop last got a batch, or began an epoch (monotonic ns): the start of the
    wait for the next batch, if one is going on (NOTE [no batch for a while])."""
    longest_step_ns: int = 0
    """The longest step seen (ns): a gap between batches many times it is no step."""
    fetchers: set[int] = field(default_factory=set)
    """Processes that have fetched batches (DataLoader workers, or a training process with
    num_workers=0): those whose files are the dataset's."""

    def feed(self, pid: int, recs: array[int]) -> None:
        """Add records (a flat array of kind, a, b triples) from process ``pid``."""
        for i in range(0, len(recs) - 2, 3):
            kind, a, b = recs[i], recs[i + 1], recs[i + 2]
            rtype, tag = kind & records.TYPE_MASK, kind >> records.TAG_SHIFT
            key = (pid, tag)
            if rtype == records.BATCH:
                stream = self._streams.setdefault(key, _Stream())
                wait = b - a
                step = b - stream.last_end if stream.last_end is not None else wait
                if wait < 0 or step < 0:  # the clock is monotonic: a damaged record
                    self.skipped += 1
                    continue
                self.waits.append(wait)
                self.steps.append(step)
                self.ends.append(b)
                self.last_data_ns = max(self.last_data_ns, b)
                self.longest_step_ns = max(self.longest_step_ns, step)
                stream.last_end = b
                per = self._per_pid.get(pid)
                if per is None:
                    per = self._per_pid[pid] = [0, 0, 0]
                per[0] += 1
                per[1] += wait
                per[2] += step
                if key in self._epoch_pending:
                    self._epoch_pending.discard(key)
                    self.epoch_start_waits.append(wait)
                    self.epoch_start_steps.append(step)
                    self.firsts.append(len(self.waits) - 1)
                else:
                    self._pause(stream, wait, step)
            elif rtype == records.EPOCH:
                if b < 0:
                    self.skipped += 1
                    continue
                self._streams.setdefault(key, _Stream()).last_end = a
                self._epoch_at[key] = a
                self._epoch_pending.add(key)
                self.last_data_ns = max(self.last_data_ns, a)
                self.epochs += 1
                self.num_workers = max(self.num_workers, b)
            elif rtype == records.STEP:
                last = self._last_mark.get(pid)
                if last is not None and a < last:
                    self.skipped += 1
                    continue
                if last is not None:
                    self.marks.append(a - last)
                self._last_mark[pid] = a
            elif rtype == records.WORKER and a > 0 and b >= 0:
                self.worker_pids[a] = b
                self.worker_loader[a] = key
            elif records.FETCH <= rtype <= records.HANDOVER:
                self._stage(pid, rtype, tag, a, b)
            elif rtype == records.ITERABLE and a == 1:
                self.iterable = True
            elif rtype == records.RANK and 0 <= a < b:
                self.ranks[pid] = (a, b)
            else:
                self.skipped += 1

    def _pause(self, stream: _Stream, wait: int, step: int) -> None:
        """Hold a batch's time beyond its wait against the loop's latest (NOTE [pauses])."""
        loop = step - wait
        recent = stream.recent
        if len(recent) >= PAUSE_AFTER:
            typical = sorted(recent)[len(recent) // 2]
            if loop > PAUSE_FACTOR * typical and loop - typical > PAUSE_MIN_NS:
                self.pause_waits.append(wait)
                self.pause_steps.append(step)
        recent.append(loop)
        if len(recent) > PAUSE_WINDOW:
            del recent[0]

    def _stage(self, pid: int, rtype: int, tag: int, a: int, b: int) -> None:
        """One record of the input pipeline's stages (NOTE [stage timing])."""
        st = self._stages
        if rtype == records.FETCH:
            if a < 0 or b < 0:
                self.skipped += 1
                return
            st.batches += 1
            st.fetch_ns += a
            st.fetch_cpu_ns += min(a, b)  # the CPU clock ticks coarser than the wall one
            st.fetch_max_ns = max(st.fetch_max_ns, a)
            st.pids.add(pid)
            self.fetchers.add(pid)
            if pid not in self.worker_loader:
                self._in_process.add(pid)
        elif rtype == records.STAGE:
            if a < 0 or b < 0:
                self.skipped += 1
                return
            st.collate_ns += a
            st.idle_ns += b
        elif rtype == records.COUNT:
            if a < 0 or b < 0:
                self.skipped += 1
                return
            st.samples += a
            st.files += b
        elif rtype == records.READY:
            if a < 0:
                self.skipped += 1
                return
            self._in_process.discard(pid)
            loader = self.worker_loader.get(pid)
            k = (loader[0], loader[1], a) if loader else (-pid, 0, a)
            self._ready.setdefault(k, []).append(b)
        elif rtype == records.HANDOVER:
            stream = self._streams.get((pid, tag))
            end = stream.last_end if stream is not None else None
            if a < 0 or end is None or end < b:
                self.skipped += 1
                return
            # The epoch it belongs to starts where its loader's latest epoch started now.
            self._waiting.append((pid, tag, a, b, end, self._epoch_at.get((pid, tag), 0)))
            self._latest = max(self._latest, end)

    def _join(self) -> None:
        """Pair each batch the loop got from a worker with the moment the worker handed it
        over: its hand-over runs from then, or from ``next()`` if that came later, to the
        return of ``next()`` (the queue, unpickling, pin_memory)."""
        for k in [k for k in self._ready if k[0] < 0]:
            loader = self.worker_loader.get(-k[0])
            if loader is not None:
                self._ready.setdefault((loader[0], loader[1], k[2]), []).extend(
                    self._ready.pop(k))
        keep = []
        for item in self._waiting:
            pid, tag, idx, called, ret, since = item
            times = self._ready.get((pid, tag, idx))
            best = max((t for t in times or () if since <= t <= ret), default=None)
            if best is not None and times is not None:
                times.remove(best)
                self._handovers.append(ret - max(called, best))
            elif self._latest - ret < _JOIN_KEEP_NS:
                keep.append(item)
        self._waiting = keep
        old = self._latest - _JOIN_KEEP_NS
        for k in list(self._ready):
            left = [t for t in self._ready[k] if t >= old]
            if left:
                self._ready[k] = left
            else:
                del self._ready[k]

    def take(self) -> dict[str, Any]:
        """The figures since the last call, then start a new interval."""
        steps = self.steps if self.steps else self.marks
        out: dict[str, Any] = {
            "batches": len(self.waits),
            "epochs_started": self.epochs,
            "data_wait": distribution(self.waits),
            "step": distribution(steps),
            "step_source": "dataloader" if self.steps else ("marks" if self.marks else None),
        }
        step_sum = out["step"]["sum_s"]
        out["data_wait_share"] = (out["data_wait"]["sum_s"] / step_sum
                                  if self.steps and step_sum > 0 else None)
        if self.epoch_start_waits:
            out["epoch_start_wait"] = distribution(self.epoch_start_waits)
            out["epoch_start_step"] = distribution(self.epoch_start_steps)
        if self.pause_steps:
            out["pause_wait"] = distribution(self.pause_waits)
            out["pause_step"] = distribution(self.pause_steps)
        if self.epochs:
            out["num_workers"] = self.num_workers
        if self.iterable:
            out["iterable_loader"] = True
            self.iterable = False
        self._join()
        if self._stages.batches or self._handovers:
            out["pipeline"] = self._stages.record(self._handovers,
                                                  bool(self._in_process & self._stages.pids))
        self._stages = _Stages()
        self._handovers = []
        if self.ranks and self._per_pid:
            # Per rank (several training processes): whose input pipeline is slowest.
            out["ranks"] = {
                str(self.ranks[pid][0]): {"pid": pid, "batches": int(n),
                                          "data_wait_s": w / 1e9, "step_s": st / 1e9}
                for pid, (n, w, st) in sorted(self._per_pid.items()) if pid in self.ranks}
            out["world_size"] = max(ws for _, ws in self.ranks.values())
        self._per_pid = {}
        self.waits, self.steps, self.marks, self.epochs = [], [], [], 0
        self.ends = []
        self.num_workers = 0
        self.epoch_start_waits = []
        self.epoch_start_steps = []
        self.firsts = []
        self.pause_waits, self.pause_steps = [], []
        return out


def timing_pid(name: str) -> int | None:
    """The pid of a timing file's name (``<pid>.bin``), or None for any other file.

    ASCII digits only: ``str.isdigit`` also accepts digits such as "²" that ``int``
    refuses.
    """
    stem, ext = name[:-4], name[-4:]
    if ext != ".bin" or not (stem.isascii() and stem.isdigit()):
        return None
    return int(stem)


_LOOP = frozenset((records.BATCH, records.EPOCH, records.STEP))
"""Record types only a process running a training loop writes (not a worker's stages)."""


class TimingReader:
    """Follows ``<run>/timing/*.bin`` as the training processes append to them."""

    def __init__(self, directory: str | None, spare: str | None = None) -> None:
        """``directory`` None reads nothing (no training side to follow); ``spare`` is
        where the training processes go on writing when ``directory`` fails them (NOTE
        [spare timing folder] in iolens/training/_hooks.py)."""
        self.directory = directory
        self.spare = spare
        self._offsets: dict[str, int] = {}
        self._done: set[str] = set()
        self.pids: set[int] = set()
        """Processes that have written timing records: those running the training loop."""
        self.paths: list[tuple[int, str, int]] = []
        """(pid, folder, opens so far): folders the job's input pipeline opened files in,
        or -1 for a folder the job opened files for writing in, not yet taken (NOTE
        [dataset folders] in iolens/training/_hooks.py); the recorder empties it."""
        self.urls: list[str] = []
        """URLs the job's Python code opened, not yet taken (NOTE [network storage] in
        iolens/recorder/network.py); the recorder empties it."""
        self.loaders: dict[str, dict[str, Any]] = {}
        """The settings of each loader the job iterated, by its file's name (NOTE [loader
        settings] in iolens/training/_hooks.py)."""

    def poll(self, into: TrainingAggregator) -> int:
        """Feed every whole record written since the last poll; returns how many."""
        if self.directory is None:
            return 0
        paths: list[tuple[int, str]] = []
        # The run's folder first: a process that moved to the spare one wrote there first.
        for directory in [d for d in (self.directory, self.spare) if d]:
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                pid = timing_pid(name)
                if pid is not None:
                    paths.append((pid, os.path.join(directory, name)))
                elif name.endswith(".paths") and timing_pid(name[:-6] + ".bin") is not None:
                    self._read_paths(int(name[:-6]), os.path.join(directory, name))
                elif name.startswith("loader-") and "batch_types" not in self.loaders.get(
                        name, {}):
                    # (read again until it holds the first batch's types, which the job
                    # adds to the file after its settings)
                    self._read_loader(name, os.path.join(directory, name))
        count = 0
        # Workers' records after the training processes': their loader is then known.
        paths.sort(key=lambda p: p[0] not in self.pids)
        for pid, path in paths:
            if path in self._done:
                continue
            offset = self._offsets.get(path, 0)
            # Asked before the read: a process that writes its last records and ends
            # between the two must not be taken as one whose file was read to its end.
            alive = pid_alive(pid)
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except OSError:
                continue
            whole = len(data) - len(data) % records.RECORD_BYTES
            if not whole:
                if not data and not alive:
                    # Its process is gone and all it wrote is read: not opened again (a
                    # run with workers started anew each epoch leaves many such files).
                    self._done.add(path)
                continue
            recs = array("q")
            recs.frombytes(data[:whole])
            self._offsets[path] = offset + whole
            if pid not in self.pids and any(
                    (recs[i] & records.TYPE_MASK) in _LOOP for i in range(0, len(recs), 3)):
                self.pids.add(pid)
            into.feed(pid, recs)
            count += whole // records.RECORD_BYTES
        return count

    def _read_loader(self, name: str, path: str) -> None:
        """One loader's settings: a small JSON object, written whole (atomically)."""
        try:
            with open(path, "rb") as fh:
                item = json.loads(fh.read(1 << 16))
        except (OSError, ValueError, RecursionError):
            return
        if isinstance(item, dict):
            self.loaders[name] = {k: v for k, v in item.items()
                                  if isinstance(v, (str, int, float, bool))}
            for key in ("set", "set_skipped"):  # (iolens run --set: taken, or left out)
                given = item.get(key)
                if isinstance(given, dict):
                    self.loaders[name][key] = {str(k): v for k, v in given.items()
                                               if isinstance(v, (str, int, float, bool))}

    def _read_paths(self, pid: int, path: str) -> None:
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(1 << 20)
        except OSError:
            return
        whole = data.rfind(b"\n") + 1
        if not whole:
            return
        self._offsets[path] = offset + whole
        for line in data[:whole].splitlines():
            try:
                item = json.loads(line)
            except (ValueError, RecursionError):
                continue
            folder, opens = (item, 1) if isinstance(item, str) else (
                item if isinstance(item, list) and len(item) == 2 else (None, 0))
            if (isinstance(folder, str) and folder.startswith("/") and type(opens) is int
                    and opens >= -1):  # (-1: files were written there, not read)
                self.paths.append((pid, folder, opens))
            elif isinstance(folder, str) and "://" in folder[:16] and len(self.urls) < 256:
                self.urls.append(folder)
