"""The input pipeline from inside: the stage figures of a run's DataLoader workers (pure).

The recorder sums, per interval, what the workers timed of each batch they
made (NOTE [stage timing] in iolens/training/_hooks.py): the fetch of its
samples (wall, and the part on the CPU), the collate, the wait for indices
(idle), the files opened, and the hand-over to the loop. Here they become
per-sample and per-batch figures over a span of records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from iolens.analysis.columns import StageColumns, amount, network_bytes

__all__ = ["Pipeline", "amount", "network_bytes", "pipeline", "pipeline_over", "stage_series"]


@dataclass
class Pipeline:
    """The stage figures over a span of records."""

    batches: int
    samples: int
    fetch_s: float
    fetch_cpu_s: float
    collate_s: float
    idle_s: float
    files: int
    handovers: int
    handover_s: float
    read_bytes: float
    """Bytes the fetching processes read through syscalls (rchar) in the span."""
    disk_bytes: float
    """Bytes they read from block devices (read_bytes: page faults of a memmap too)."""
    in_process: bool
    """The training process fetched its own batches (num_workers=0)."""
    processes: int
    net_bytes: float = 0.0
    """Bytes received on the dataset's network connections in the span (NOTE [network
    storage] in iolens/recorder/network.py)."""
    mapped: bool = False
    """The dataset is read through a memory map (found in /proc/PID/maps)."""
    on_disk: bool = True
    """The dataset is on a block device: its reads count in read_bytes."""
    queue_s: float = 0.0
    """Seconds the workers waited on a run queue for a core in the span (their run
    delay) while they fetched: the delay in the share of their CPU the fetch took (NOTE
    [a fetch that waits for a core])."""
    byte_samples: int = 0
    """The samples of the intervals the bytes were counted over, where not all the span's
    (0: all of them; NOTE [the loop's own reads])."""

    @property
    def fetch_s_per_sample(self) -> float | None:
        return self.fetch_s / self.samples if self.samples else None

    @property
    def fetch_cpu_share(self) -> float | None:
        return min(1.0, self.fetch_cpu_s / self.fetch_s) if self.fetch_s > 0 else None

    @property
    def fetch_queue_s(self) -> float:
        """NOTE [a fetch that waits for a core]: a fetch off the CPU is either blocked (the
        storage, the network, a lock, a sleep) or runnable and waiting for a core that the
        other workers and the loop keep busy. The workers' run delay (/proc/PID/schedstat)
        is the second. It is the fetch's in the share of the workers' CPU that the fetch
        took (:attr:`queue_s`), up to all of the fetch's time off the CPU. Workers on more
        cores than are free read as CPU-bound, not as waiting on something else.
        The share, not the whole delay against the fetch's time off CPU as it was: a
        fetch is timed in the interval in which it ends, and the delay as it accrues, so
        the two agree over a run but not over a few intervals. Twelve workers on 2 cores
        ended their batches together, 12 in one interval and none in the next; the
        timed intervals left out some of either, and their last timings came after the
        recorder last saw them. 3.5-13 ms of each sample's 125 read as blocked, which
        fewer workers would keep, where the share leaves 0.5-1.5 ms."""
        return min(self.queue_s, max(0.0, self.fetch_s - self.fetch_cpu_s))

    @property
    def fetch_queue_share(self) -> float | None:
        return min(1.0, self.fetch_queue_s / self.fetch_s) if self.fetch_s > 0 else None

    @property
    def fetch_blocked_share(self) -> float | None:
        share = self.fetch_cpu_share
        queued = self.fetch_queue_share or 0.0
        return None if share is None else max(0.0, 1.0 - share - queued)

    @property
    def worker_idle_share(self) -> float | None:
        if self.in_process:
            return None
        busy = self.fetch_s + self.collate_s + self.idle_s
        return self.idle_s / busy if busy > 0 else None

    @property
    def collate_s_per_batch(self) -> float | None:
        return self.collate_s / self.batches if self.batches else None

    @property
    def handover_s_per_batch(self) -> float | None:
        return self.handover_s / self.handovers if self.handovers else None

    @property
    def bytes_source(self) -> str:
        """The counter the bytes per sample rest on (NOTE [bytes per sample])."""
        best = max(self.read_bytes, self._data_disk_bytes, self.net_bytes)
        if best <= 0:
            return "mapped" if self.mapped else "rchar"
        if best == self.net_bytes:
            return "socket"
        if best == self.read_bytes:
            return "rchar"
        return "mapped" if self.mapped else "read_bytes"

    @property
    def bytes_per_sample(self) -> float | None:
        """NOTE [bytes per sample]: what reached the fetching processes per sample, from
        the counter that saw the most of it. rchar counts read() calls (the page cache's
        bytes too, and a ``pipe:curl`` child's output) but not a memory map's reads nor
        recv() on a socket; read_bytes counts what the job's processes made a block
        device read (a memory map's faults and readahead too: never below what the
        device served them); the sockets' own counts (tcp_info) hold what came over the
        network. A memory map read from the page cache shows in none of them."""
        best = max(self.read_bytes, self._data_disk_bytes, self.net_bytes)
        n = self.byte_samples or self.samples
        return best / n if n else None

    @property
    def _data_disk_bytes(self) -> float:
        """read_bytes, where the dataset is on a block device (else they are code)."""
        return self.disk_bytes if self.on_disk or self.mapped else 0.0

    @property
    def disk_bytes_per_sample(self) -> float | None:
        n = self.byte_samples or self.samples
        return self.disk_bytes / n if n else None

    @property
    def busy_blocked_share(self) -> float | None:
        """The fetch's time off CPU as a share of the workers' busy time (fetch and
        collate, the collate counted as CPU)."""
        busy = self.fetch_s + self.collate_s
        off = max(0.0, self.fetch_s - self.fetch_cpu_s - self.fetch_queue_s)
        return off / busy if busy > 0 else None

    @property
    def files_per_sample(self) -> float | None:
        return self.files / self.samples if self.samples else None

    def to_dict(self) -> dict[str, Any]:
        """The figures of ``report --format json``'s ``pipeline``."""
        def r(v: float | None, n: int = 6) -> float | None:
            return None if v is None else round(v, n)

        return {
            "fetch_s_per_sample": r(self.fetch_s_per_sample, 7),
            "fetch_cpu_share": r(self.fetch_cpu_share, 4),
            "fetch_blocked_share": r(self.fetch_blocked_share, 4),
            "fetch_queue_share": r(self.fetch_queue_share, 4),
            "collate_s_per_batch": r(self.collate_s_per_batch, 7),
            "handover_s_per_batch": r(self.handover_s_per_batch, 7),
            "worker_idle_share": r(self.worker_idle_share, 4),
            "bytes_per_sample": r(self.bytes_per_sample, 1),
            "bytes_source": self.bytes_source,
            "files_per_sample": r(self.files_per_sample, 4),
            "batches": self.batches,
            "samples": self.samples,
            "in_process": self.in_process,
            "processes": self.processes,
        }


def pipeline(records: Iterable[dict[str, Any]],
             meta: dict[str, Any] | None = None) -> Pipeline | None:
    """The stage figures over ``records``, or None when no batch's stages were timed.

    ``meta`` (the run's meta.json) says how the dataset is read, for the bytes per
    sample (NOTE [bytes per sample]): through a memory map (its storage entry is
    ``mapped``); into a cache the fetching processes then read (a ``cache`` role: each
    byte read twice and written once, so what they wrote is taken off what they read);
    from a block device (then read_bytes counts: without one, what the processes made
    a device read is their own code paged in, not data)."""
    recs = records if isinstance(records, Sequence) else list(records)
    return pipeline_over(StageColumns.of(recs), range(len(recs)), meta)


def pipeline_over(c: StageColumns, idx: Sequence[int],
                  meta: dict[str, Any] | None = None) -> Pipeline | None:
    """:func:`pipeline` over the intervals ``idx`` (in that order) of a run's columns."""
    meta = meta or {}
    mapped, cache = dataset_mapped(meta), dataset_cached(meta)
    on_disk = dataset_on_disk(meta)
    batches = samples = files = handovers = processes = 0
    fetch = cpu = collate = idle = handover = read = disk = net = queue = 0.0
    in_process = False
    first = last = -1
    for k, i in enumerate(idx):
        n = c.p_batches[i]
        batches += n
        samples += c.p_samples[i]
        fetch += c.p_fetch_s[i]
        cpu += c.p_fetch_cpu_s[i]
        collate += c.p_collate_s[i]
        idle += c.p_idle_s[i]
        files += c.p_files[i]
        processes = max(processes, c.p_processes[i])
        handovers += c.p_handovers[i]
        handover += c.p_handover_s[i]
        in_process = in_process or c.p_in_process[i]
        if n > 0:
            first = k if first < 0 else first
            last = k
    if batches == 0:
        return None
    # The bytes, over every interval from the first with a worker (the first batch's
    # reads come before it is made) or, with num_workers=0, from the first batch (before
    # it the training process reads its own code) to the last batch: a fetch slower than
    # an interval reads in intervals where no batch is made.
    byte_samples = 0
    if not in_process:
        first = next((k for k, i in enumerate(idx[:first]) if c.worker_pids[i]), first)
    elif sum(c.p_batches[i] > 0 for i in idx[first:last + 1]) >= OWN_READS_SKIP_FROM:
        # NOTE [the loop's own reads]
        first += 1
        byte_samples = sum(c.p_samples[i] for i in idx[first:last + 1])
    rchar, wchar, disk_s = ((c.main_rchar_s, c.main_wchar_s, c.main_read_s) if in_process
                            else (c.worker_rchar_s, c.worker_wchar_s, c.worker_read_s))
    on_cpu = 0.0  # the workers' CPU where they were seen
    for i in idx[first:last + 1]:
        secs = c.secs[i]
        got = rchar[i]
        read += (max(0.0, got - wchar[i]) if cache else got) * secs
        disk += disk_s[i] * secs
        net += c.net_bytes[i]
        if not in_process and c.has_workers[i]:  # (the loop's own wait is its compute's)
            queue += c.worker_queue_s[i]
            on_cpu += c.worker_cpu_s[i]
    if on_cpu > 0:  # NOTE [a fetch that waits for a core]: the fetch's part of the wait
        queue *= cpu / on_cpu
    return Pipeline(batches, samples, fetch, cpu, collate, idle, files, handovers, handover,
                    read, disk, in_process, processes, net, mapped, on_disk, queue,
                    byte_samples)


OWN_READS_SKIP_FROM = 4
"""From this many intervals with batches on, a run without workers counts its bytes from
the interval after its first batch's (NOTE [the loop's own reads])."""


"""NOTE [the loop's own reads]: with num_workers=0 the bytes a sample reads are the
training process's rchar and read_bytes, and the process reads its own code too: the
modules it imports as it starts its first epoch, before the first batch, fall in the
interval of that batch. A lab run that read no file (5 ms off the CPU a sample, 6 s, 0.5 s
intervals) read 0.77 MB in that interval and none in the 12 after it: 829 bytes a sample
over its 928, and up to 7.7 KiB in other runs of it, against 8 KiB that call a fetch one
that reads a dataset (rules.READS_DATA_BYTES_IN_PROCESS). From OWN_READS_SKIP_FROM
intervals with batches, that interval is left out of the bytes and of the samples they are
divided by."""


def dataset_mapped(meta: dict[str, Any]) -> bool:
    """Whether a process of the job mapped a data file on the dataset's storage (meta.json's
    first ``storage`` entry), opened first or not (NOTE [opened and mapped] in
    iolens/recorder/storage.py)."""
    st = meta.get("storage")
    top = st[0] if isinstance(st, list) and st and isinstance(st[0], dict) else {}
    return top.get("mapped") is True


def dataset_on_disk(meta: dict[str, Any]) -> bool:
    """Whether a storage entry of the dataset (or of its cache's source) is on a block
    device (``block`` or ``overlay``)."""
    st = meta.get("storage")
    return isinstance(st, list) and any(isinstance(s, dict) and s.get("kind") in (
        "block", "overlay") and s.get("role") != "cache" for s in st)


def dataset_cached(meta: dict[str, Any]) -> bool:
    """Whether the job fills a cache it reads (a storage entry with the role ``cache``)."""
    st = meta.get("storage")
    return isinstance(st, list) and any(isinstance(s, dict) and s.get("role") == "cache"
                                        for s in st)


def stage_series(c: StageColumns) -> list[dict[str, float]]:
    """Per interval with timed stages (of the run's columns ``c``): the mean per batch of
    fetch on CPU, fetch blocked, collate, hand-over and idle, in seconds (the report's stage
    chart)."""
    out = []
    for i, n in enumerate(c.p_batches):
        if n <= 0:
            continue
        fetch, cpu, hn = c.p_fetch_s[i], c.p_fetch_cpu_s[i], c.p_handovers[i]
        out.append({
            "elapsed_s": c.elapsed_s[i],
            "fetch_cpu_s": cpu / n,
            "fetch_blocked_s": max(0.0, fetch - cpu) / n,
            "collate_s": c.p_collate_s[i] / n,
            "handover_s": c.p_handover_s[i] / hn if hn else 0.0,
            "idle_s": c.p_idle_s[i] / n,
        })
    return out
