"""Advice where the job waits on storage no local device shows: network file systems,
FUSE daemons, HTTP and object stores.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.columns import DeviceLoad, Span
from iolens.analysis.pipeline import Pipeline
from iolens.analysis.verdict.figures import num
from iolens.analysis.verdict.result import Recommendation, Verdict
from iolens.analysis.verdict.storage import probe_rec, samples_per_s_of, store_limited
from iolens.analysis.verdict.workers import fetch_text, raise_workers


def storage_from_inside(v: Verdict, pipe: Pipeline, span: Span, *,
                         share: float, when: str, ceiling: str, workers: int) -> None:
    """storage-bound from the workers' own timing over ``span``: the fetch blocks off CPU
    while reading the dataset, whatever serves it (a FUSE or NFS mount, a throttled
    device)."""
    v.cls = "storage-bound"
    where = v.storage[0] if v.storage else None
    if where is not None and where.get("disks"):
        v.devices = [str(d) for d in where["disks"]]
        load = span.load(v.devices[0])
        what = (f"{where['mount']} ({where['fstype']} on {where['device']}: "
                f"{load.util:.0f}% util, r_await {load.r_await:.1f} ms, "
                f"{load.rMB_s:.1f} MB/s)")
    elif where is not None:
        what = f"{where['mount']} ({where['fstype']}, no block device)"
    else:
        what = "storage iolens could not map"
    v.evidence.append(f"the fetch blocks off CPU while it reads the dataset from {what}{when}")
    v.evidence.append(fetch_text(pipe))
    mount = span.cols.stores.get(str(where["mount"])) if where is not None else None
    waiting = mount.mean("waiting", mount.rows(span.within())) if mount is not None else None
    if waiting is not None:
        v.evidence.append(f"{waiting:.1f} requests waiting on the FUSE connection on average")
    v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
    kind = where.get("kind") if where is not None else None
    cache = v.fix(
        "cache the dataset near the job: the mount's own cache (rclone --vfs-cache-mode "
        "full, mountpoint-s3 --cache DIR, gcsfuse's file cache, s3fs -o use_cache=DIR), "
        "or copy it to local NVMe or /dev/shm before training",
        f"every epoch reads it again through {where['fstype'] if where else 'the mount'}",
        ceiling, {"storage": "ram"}, pm.cached(),
        basis=["if the dataset fits the cache: no request reaches the store"])
    if kind in ("fuse", "nfs"):
        limit = v.probe.get("limit") if v.probe else None
        if limit == "rate":
            # The store serves a fixed number of requests a second: what it serves now.
            store_limited(v, samples_per_s_of(v))
            v.evidence.append(
                f"the storage probe: the store serves about "
                f"{num(v.probe, 'iops_ceiling'):.0f} requests/s however many are in "
                "flight (a rate limit): more workers cannot fetch faster")
        target = v.model.workers_to_next_limit() if v.model is not None else None
        more = target or (max(2 * workers, workers + 2) if workers else 4)
        if limit == "latency":
            if target is not None:
                v.offer(raise_workers(v, workers, more, "the probe found the store answers "
                                       "more requests at once about as fast as one: its "
                                       "latency, not a rate limit, sets the pace", ceiling))
            v.offer(cache)
        elif limit == "rate":
            v.offer(cache)
            v.recommendations.append(v.fix(
                f"do not add DataLoader workers: the store limits the rate at about "
                f"{num(v.probe, 'iops_ceiling'):.0f} requests/s",
                "the probe found more requests in flight are not served faster", "none",
                {"num_workers": more}, pm.more_workers(more), basis=[f"{more} workers"]))
        else:
            v.offer(cache)
            v.recommendations.append(probe_rec(
                v, "whether the store answers slowly (then more workers help) "
                "or limits the requests it serves (then only a cache does) decides the fix"))
            v.offer(_if_slow_store(
                v, workers, more, ceiling, "each worker waits on the store's latency one "
                "sample at a time", unless="limiting how many it serves",
                basis="if the store's latency, not a rate limit, sets the pace (the probe "
                "tells)"))
        if (pipe.files_per_sample or 0.0) >= 0.5:
            v.recommendations.append(Recommendation(
                "store fewer, larger objects: tar shards (WebDataset) read sequentially, one "
                "request per shard instead of one per sample",
                f"each sample costs {pipe.files_per_sample or 0.0:.1f} file opens on the "
                f"store, {(pipe.bytes_per_sample or 0.0) / 1024:.0f} KiB each", ceiling,
                None, "the store's cost per request of a large object is not measured",
                {"pack": True}))
    else:
        cache.action = ("lift the I/O limit (cgroup io.max / blkio throttle), or copy the "
                        "dataset to faster local storage or RAM first")
        cache.because = "the reads wait though the device is not saturated: the limit is above it"
        v.offer(cache)

def net_scaling(figs: Iterable[tuple[float, float]]) -> str | None:
    """Whether a network store gives more bytes a second to more connections at once
    (``figs``: each interval's connections open and bytes received a second):
    ``latency`` (it does: each request waits on the store's answer), ``capped`` (it does
    not: the store, or the link, caps the throughput), or None when the run's intervals
    do not tell (fewer than two levels of connections, each seen in
    rules.NET_SCALING_INTERVALS intervals or more)."""
    by: dict[int, list[float]] = {}
    for conns, rx in figs:
        n = int(conns)
        if n >= 1:
            by.setdefault(n, []).append(rx)
    levels = sorted(n for n, xs in by.items() if len(xs) >= rules.NET_SCALING_INTERVALS)
    if len(levels) < 2:
        return None
    lo, hi = levels[0], levels[-1]
    rx_lo, rx_hi = statistics.mean(by[lo]), statistics.mean(by[hi])
    if rx_lo <= 0:
        return None
    more = hi / lo - 1  # (the share more connections: 1 = twice as many)
    gain = rx_hi / rx_lo - 1
    if gain <= rules.NET_CAPPED_GAIN * more:
        return "capped"
    if gain >= rules.NET_LATENCY_GAIN * more:
        return "latency"
    return None

def network_store(v: Verdict, pipe: Pipeline, span: Span,
                   where: dict[str, Any], load: DeviceLoad | None, *, share: float,
                   when: str, ceiling: str, workers: int) -> None:
    """storage-bound on a store the job reads over the network over ``span`` (NOTE
    [network storage]
    in iolens/recorder/network.py). A store whose own disk is saturated (a server on this
    machine), or whose bytes a second do not grow with the connections open, caps the
    throughput: more workers only add requests to its queue. One that gives more to more
    connections answers slowly: more requests in flight help."""
    v.cls = "storage-bound"
    name = str(where.get("mount"))
    peer = span.cols.stores.get(str(where.get("peer") or ""))
    rows = peer.rows(span.within()) if peer is not None else []
    figs = [(peer.secs[k], peer.connections[k], peer.rx_bytes_s[k], peer.new_connections_s[k])
            for k in rows] if peer is not None else []
    secs = sum(f[0] for f in figs) or 1.0
    rx = sum(f[2] * f[0] for f in figs) / secs
    conns = sum(f[1] * f[0] for f in figs) / secs
    new = sum(f[3] * f[0] for f in figs) / secs
    server = (f", served by {where.get('server') or 'a process'} (pid {where['server_pid']}) "
              "on this machine" if where.get("server_pid") else "")
    v.evidence.append(f"the fetch blocks off CPU while it reads the dataset over the network "
                      f"from {name}{server}: {rx / 2**20:.1f} MB/s received on {conns:.1f} "
                      f"connections open on average, {new:.1f} new a second{when}")
    scaling = net_scaling((f[1], f[2]) for f in figs)
    why: str | None = None
    if load is not None:
        v.devices = [load.name]
        word = "saturated" if load.util >= rules.UTIL_SATURATED else "slow"
        v.evidence.append(f"the store reads the data from {load.name}, {word}: {load.util:.0f}% "
                          f"util, r_await {load.r_await:.1f} ms, {load.rMB_s:.1f} MB/s")
        why = f"the store's disk {load.name} is {word}"
    elif scaling == "capped":
        why = ("the store gave no more bytes a second to more connections at once: it caps "
               "the throughput")
    elif scaling == "latency":
        v.evidence.append("the store gave more bytes a second to more connections at once: "
                          "it answers slowly rather than capping the throughput")
    v.evidence.append(fetch_text(pipe))
    v.evidence.append(f"the loop waited {share * 100:.1f}% of its step time for data")
    cache = v.fix(
        "copy the dataset near the job before training (local NVMe or /dev/shm), or read "
        "it through a cache on this machine",
        f"every epoch fetches it again from {name}", ceiling, {"storage": "ram"},
        pm.cached(), basis=["if the dataset fits the local copy: no request reaches the store"])
    target = v.model.workers_to_next_limit() if v.model is not None else None
    more = target or (max(2 * workers, workers + 2) if workers else 4)
    if why is not None:
        v.evidence.append(why + ": more requests in flight are not served faster")
        store_limited(v, samples_per_s_of(v))
        v.offer(cache)
        v.recommendations.append(v.fix(
            f"do not add DataLoader workers: {why}", "more requests in flight are not "
            "served faster", "none", {"num_workers": more}, pm.more_workers(more),
            basis=[f"{more} workers"]))
    elif scaling == "latency":
        v.offer(raise_workers(v, workers, more, "the store answers slowly: more requests in "
                               "flight are served about as fast each", ceiling))
        v.offer(cache)
    else:
        v.offer(cache)
        v.offer(_if_slow_store(
            v, workers, more, ceiling, "each worker waits on the store one request at a time",
            unless="capping its throughput", basis="if the store's latency, not a cap on its "
            "throughput, sets the pace (not told by this run)"))

def _if_slow_store(v: Verdict, workers: int, more: int, ceiling: str, because: str, *,
                   unless: str, basis: str) -> Recommendation:
    """More workers, on the condition the run cannot settle: that the store answers each
    request slowly rather than ``unless`` (a rate limit, a cap on its throughput)."""
    rec = raise_workers(v, workers, more, because, ceiling)
    rec.action = (f"if the store answers each request slowly rather than {unless}, keep more "
                  "requests in flight: " + rec.action)
    if rec.prediction is not None:
        rec.prediction.basis.insert(0, basis)
    return rec
