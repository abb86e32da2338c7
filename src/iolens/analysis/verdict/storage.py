"""Advice where a device serving the dataset binds: what the storage probe measured,
packing small files, reading in blocks, a cache in RAM.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.columns import DeviceLoad, Span, added
from iolens.analysis.pipeline import Pipeline
from iolens.analysis.verdict.figures import num
from iolens.analysis.verdict.result import Recommendation, Verdict


def probe_for(meta: dict[str, Any], storage: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The storage probe's result (meta's ``storage_probe``, from ``iolens probe --storage
    PATH --run RUN``) when it probed what serves the dataset: the same mount or device."""
    p = meta.get("storage_probe")
    if not isinstance(p, dict) or p.get("limit") not in ("iops", "bandwidth", "latency",
                                                          "rate"):
        return None
    if not storage:
        return p
    top = storage[0]
    same = (p.get("mount") == top.get("mount")
            or (p.get("device") is not None and p.get("device") == top.get("device")))
    return p if same else None

def probe_rec(v: Verdict, settles: str) -> Recommendation:
    """The probe of the dataset's storage, where it would settle the advice."""
    return Recommendation(
        f"measure the storage's ceilings: `iolens probe --storage {_where(v)} --run "
        f"{v.run_dir}` (a few seconds of read-only reads), then `iolens report {v.run_dir}` "
        "again",
        settles, "a prediction for the fix that fits",
        unavailable="a measurement, not a change: it settles which fix to predict")

def store_limited(v: Verdict, samples_per_s: float) -> None:
    """From here on the model knows the storage serves at most ``samples_per_s``."""
    m = v.model
    if m is not None:
        v.model = m.with_storage(samples_per_s)

"""NOTE [what the device serves]: a saturated device's ceiling is the samples a second it
served over the intervals of its load, scaled to its full utilization. The run's rate over
all its steps is not that: it holds the first batch's wait for start-up (a lab run's first
step took 1.5 s of 6), which the model counts again as the first epoch's start. An 8 MiB/s
disk under 64 KiB files served 128 samples/s at 100% util, where the run's rate gave 98:
the model then put the run at 5.25 steps/s against 6.15 measured, and its predictions,
scaled by that misfit, 17% higher."""


def served_per_s(span: Span, batch: float, covered: Collection[int]) -> float:
    """Samples a second over ``span``: the batches it timed, of ``batch`` samples, over the
    seconds they took (``covered``: :meth:`Span.covered`)."""
    secs = added(span.cols.run.secs[i] for i in sorted(covered))
    return span.total("batches") * batch / secs if secs > 0 else 0.0


def sample_bytes(span: Span, device: str, batch: float, covered: Collection[int]) -> float:
    """What ``device`` read a sample over ``span``: its bytes over the seconds the span's
    batches took (``covered``: :meth:`Span.covered`), over their samples."""
    samples = span.total("batches") * batch
    load = span.load(device, covered)
    return load.rkB_s * 1024 * load.secs / samples if samples > 0 else 0.0


def samples_per_s_of(v: Verdict) -> float:
    m = v.model
    return m.whole.steps_per_s * m.whole.batch if m is not None and m.whole else 0.0

def packed_text(v: Verdict, pipe: Pipeline | None) -> str | None:
    """Whether the dataset sits in large files already (LMDB, HDF5, Arrow, tar shards):
    ``blocks`` when it is also read in blocks (a block sampler, or streamed), ``scattered``
    when it is read one sample at a time, None when it is a file per sample (or unknown).

    A dataset file many samples large, or one the job maps, is a pack: the storage entry
    has the largest data file the job held open or mapped."""
    top = v.storage[0] if v.storage else {}
    per = (pipe.bytes_per_sample or 0.0) if pipe is not None else 0.0
    large = num(top, "largest_file") >= max(rules.PACKED_FILE_BYTES,
                                             rules.PACKED_FILE_SAMPLES * per)
    if not (large or top.get("mapped")):
        return None
    if pipe is not None and (pipe.files_per_sample or 0.0) >= rules.PACKED_FILES_PER_SAMPLE:
        return None  # (a file opened per sample beside the large one: a file per sample)
    in_blocks = block_sampled(v) or any(d.get("iterable") is True for d in v.loaders)
    return "blocks" if in_blocks else "scattered"

def block_sampled(v: Verdict) -> bool:
    """Whether the run's loaders read in blocks of consecutive samples (the sampler the
    pack advice names)."""
    return any("BlockShuffleSampler" in str(d.get("sampler") or "") for d in v.loaders)

def saturated_device(v: Verdict, load: DeviceLoad, *, ceiling: str, workers: int,
                      iterable: bool = False, packed: str | None = None,
                      served: float = 0.0, per: float = 0.0) -> None:
    """A device the job's reads saturate, or keep slow with a queue: what it serves now is
    its ceiling in this reading pattern (``served``: samples a second, and ``per``: the
    dataset's bytes a sample, over the time the window's batches took: NOTE [the time a
    span's batches took] in iolens/analysis/columns/run.py). A cache lifts it; a pack only where
    the device limits requests, not bytes, and the data is not in large files already:
    then reading the large files in larger requests (a batch of consecutive samples) is
    what a pack would have brought; data read in blocks already is told no more."""
    word = "saturated" if load.util >= rules.UTIL_SATURATED else "slow"
    state = word if word == "saturated" else (
        f"slow ({load.r_await:.1f} ms a read, {load.aqu_sz:.1f} queued)")
    # NOTE [what the device serves]
    sps = served or samples_per_s_of(v)
    if sps > 0:
        store_limited(v, sps * 100 / max(load.util, rules.UTIL_SATURATED))
    small = load.rareq_kib < rules.SMALL_READ_KIB
    probe = v.probe
    cache = v.fix(
        "cache the dataset in RAM (/dev/shm, or the page cache once it fits and is read "
        "again) or put it on faster local storage (NVMe)",
        f"{load.name} answers in {load.r_await:.1f} ms at {load.util:.0f}% util", ceiling,
        {"storage": "ram"}, pm.cached(),
        basis=["if the dataset fits in RAM: no reads reach a device"])
    pack_action = _pack_action(iterable) if packed is None else _block_action()
    because_small = (f"{load.name} is {state} with small reads ({load.rareq_kib:.0f} KiB "
                     f"on average, {load.r_s:.0f}/s)")
    limit = probe.get("limit") if probe else None
    if small and packed == "blocks":
        v.offer(cache)
        v.declined.append(Recommendation(
            _pack_action(iterable), "the dataset is in large files read in blocks already",
            "none", unavailable="the data is packed and read in order already",
            change={"pack": True}))
        v.evidence.append("the dataset is in large files, read in blocks already: a pack "
                          "would change nothing")
    elif small and limit == "iops":
        v.offer(_pack_rec(v, probe or {}, load, sps, per, action=pack_action,
                          because=because_small, ceiling=ceiling))
        v.offer(cache)
    elif small and limit == "bandwidth":
        v.offer(cache)
        v.declined.append(Recommendation(
            pack_action, "the probe found the device limits bytes, not requests: "
            f"large reads give no more than {_mb(probe)} MB/s", "none",
            unavailable="packing reads the same bytes from a device that limits bytes",
            change={"pack": True}))
        v.evidence.append(f"the storage probe: {load.name} limits bytes ({_mb(probe)} MB/s "
                          "whatever the request size), not requests: packing would not help")
    elif small:
        v.offer(cache)
        if v.storage:  # (the probe needs a path on the storage: never a placeholder)
            v.recommendations.append(probe_rec(
                v, "whether the device limits requests (then packing helps) or bytes "
                "(then only a cache or faster storage does) decides the fix"))
        v.recommendations.append(Recommendation(
            pack_action, because_small, ceiling, None,
            "whether the device limits requests or bytes is not known: the probe tells",
            {"pack": True}))
    else:
        v.offer(cache)
    more = max(2 * workers, workers + 2)
    v.recommendations.append(v.fix(
        f"do not add DataLoader workers (or prefetch) while {load.name} is {state}",
        f"{load.name} is {load.util:.0f}% busy", "little until the device is relieved",
        {"num_workers": more}, pm.more_workers(more),
        basis=[f"{more} workers: more requests in flight on a {word} device"]))

def _block_action() -> str:
    """The pack advice for data in large files already, read one sample at a time."""
    return ("read the large files in larger requests: a batch of consecutive samples at a "
            "time, in a random order of blocks (sampler=iolens.data.BlockShuffleSampler("
            "dataset, batch_size), with __getitems__ reading a batch in one request, as "
            "iolens.data.LMDBDataset and HDF5Dataset do), or HDF5 chunks of a batch; the "
            "data is packed already")

def _pack_action(iterable: bool) -> str:
    """The pack advice in the form that fits the job's loader: tar shards streamed whole for
    an IterableDataset (``iterable``), an indexed pack read in shuffled blocks for a
    map-style one."""
    if iterable:
        return ("pack the dataset into tar shards read whole: `iolens pack SRC DST --format "
                "webdataset --shard-size 256M --shuffle`; read them with "
                "webdataset.WebDataset(DST/shard-{00000..N}.tar, shardshuffle=True)"
                ".shuffle(1000): the shards in a new order each epoch, each read in order, "
                "the samples mixed in a buffer")
    return ("pack the dataset into large files read in large requests: `iolens pack SRC DST "
            "--shuffle` writes LMDB or HDF5 shards in a random order; read them with "
            "iolens.data.LMDBDataset or HDF5Dataset and "
            "sampler=iolens.data.BlockShuffleSampler(dataset, batch_size), so that each "
            "batch is one read of consecutive samples")

def _where(v: Verdict) -> str:
    """The dataset's folder to probe: its first folder, else its mount."""
    top = v.storage[0]
    folders = top.get("folders") or []
    return str(folders[0] if folders and isinstance(folders[0], str) else top["mount"])

def _mb(probe: dict[str, Any] | None) -> str:
    bw = num(probe, "bandwidth_ceiling")
    return f"{bw / 2**20:.1f}"

def _pack_rec(v: Verdict, probe: dict[str, Any], load: DeviceLoad, sps: float,
              sample_bytes: float, *, action: str, because: str,
              ceiling: str) -> Recommendation:
    """Packing on a device that limits requests: the same bytes in requests of about
    PACK_REQUEST_BYTES, each costing one of the device's requests (``sps``: the samples a
    second the device served over ``load``'s intervals; ``sample_bytes``: the dataset's
    bytes a sample, where known, else what the device read a sample over them)."""
    iops, bw = num(probe, "iops_ceiling"), num(probe, "bandwidth_ceiling")
    per = sample_bytes or ((load.rkB_s * 1024 / sps) if sps > 0 else 0.0)  # (bytes a sample)
    m = v.model
    if per <= 0 or iops <= 0 or bw <= 0 or m is None or m.whole is None:
        return Recommendation(action, because, ceiling, None,
                              "the device's bytes per sample or the probe's ceilings are "
                              "missing", {"pack": True})
    # In order, the kernel reads a pack in requests of its readahead window, the size the
    # probe read at; a batch larger than the window is read in one larger request.
    seq = probe.get("sequential") or {}
    window = num(seq, "request_bytes") or rules.PACK_REQUEST_BYTES
    request = max(per, window, min(m.whole.batch * per, rules.PACK_REQUEST_BYTES))
    packed = min(iops * request / per, bw / per)
    fetch = m.whole.fetch_cpu_s + per / bw
    return v.fix(action, because + f"; the probe found it limits requests ({iops:.0f}/s), "
                 f"with {bw / 2**20:.1f} MB/s in large reads", ceiling, {"pack": True},
                 pm.storage_at(packed, fetch),
                 basis=[f"packed, {per / 1024:.0f} KiB per sample read a batch at a time, in "
                        f"requests of {request / 1024:.0f} KiB: the device serves "
                        f"{packed:.0f} samples/s"])

def reads_dataset(pipe: Pipeline, storage: Sequence[dict[str, Any]] = ()) -> bool:
    """Whether the fetch reads files or bytes enough to be reading a dataset: files
    opened, bytes read through syscalls, bytes read from a device where the dataset is on
    one or mapped (page faults of a memmap count there, not in rchar), or a dataset mapped
    into memory. Bytes read from a device with no dataset on one are code: a worker that
    imports a module the page cache no longer holds (a lab case whose fetch sleeps read
    from none to 263 bytes a sample that way in five runs, and 1 KiB or more in one of
    four others, where it was called a reader of data)."""
    least = rules.READS_DATA_BYTES_IN_PROCESS if pipe.in_process else rules.READS_DATA_BYTES
    return (bool(pipe.files) or (pipe.bytes_per_sample or 0.0) >= least
            or ((pipe.disk_bytes_per_sample or 0.0) >= least and (pipe.on_disk or pipe.mapped))
            or any(s.get("mapped") for s in storage[:1]))

def waits_on_storage(pipe: Pipeline, span: Span, storage: list[dict[str, Any]],
                      d_share: float) -> bool:
    """Whether a fetch that blocks off CPU blocks on the dataset's storage.

    It must read the dataset. On FUSE or NFS (the mount the most files were opened
    on) that is enough: those reads are what blocks. On a block device, the device
    must be slow (r_await), busy (rules.BLOCKED_DEVICE_UTIL), or the fetching processes
    blocked on I/O (state D) in most of their samples (``d_share``, NOTE [blocked by
    role] in iolens/analysis/verdict/figures.py), as under a throttle above the device; a
    fetch that sleeps or waits on a lock or a remote call sits in state S beside a fast,
    idle device.
    """
    if not reads_dataset(pipe, storage):
        return False
    top = storage[0] if storage else None
    if top is not None and top.get("kind") in ("fuse", "nfs"):
        return True
    if d_share >= rules.D_STATE_SHARE:
        return True
    loads = [span.load(d) for d in (top.get("disks") or [])] if top is not None else []
    return any(x.r_await >= rules.AWAIT_SLOW_MS or x.util >= rules.BLOCKED_DEVICE_UTIL
               for x in loads)
