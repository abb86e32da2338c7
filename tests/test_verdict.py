"""The verdict rules on constructed records, with the borderline case of each threshold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from iolens import IolensError
from iolens.analysis import rules
from iolens.analysis.pipeline import pipeline
from iolens.analysis.rundata import load_run
from iolens.analysis.verdict import Verdict, clock, diagnose, severity, verdict_lines


def dev(util: float = 0.0, r_s: float = 0.0, rkb: float = 0.0, r_await: float = 0.0,
        w_s: float = 0.0, wkb: float = 0.0, w_await: float = 0.0, aqu: float = 0.0
        ) -> dict[str, float]:
    return {"r_s": r_s, "rkB_s": rkb, "r_await": r_await, "rareq_sz": rkb / r_s if r_s else 0,
            "w_s": w_s, "wkB_s": wkb, "w_await": w_await, "aqu_sz": aqu, "util": util}


def rec(i: int, *, batches: int = 10, wait: float = 0.05, step: float = 0.1,
        devices: dict[str, dict[str, float]] | None = None, workers: int = 2,
        worker_cpu: float = 30.0, job_read: float = 0.0, job_write: float = 0.0,
        main_write: float = 0.0, worker_rchar: float = 0.0, idle: float = 50.0,
        states: dict[str, int] | None = None, epoch_start: float | None = None,
        epochs: int = 0, secs: float = 1.0) -> dict[str, Any]:
    """Interval ``i`` (1 s long by default): ``wait`` and ``step`` are per batch, in seconds."""
    roles: dict[str, Any] = {"main": {"pids": 1, "cpu_pct": 90.0, "read_bytes_s": 0.0,
                                      "write_bytes_s": main_write, "rchar_s": 0.0}}
    if workers:
        roles["worker"] = {"pids": workers, "cpu_pct": worker_cpu * workers,
                           "read_bytes_s": job_read, "write_bytes_s": 0.0,
                           "rchar_s": worker_rchar}
    train: dict[str, Any] = {
        "batches": batches, "epochs_started": epochs,
        "data_wait": {"count": batches, "sum_s": wait * batches, "p50_s": wait, "max_s": wait},
        "step": {"count": batches, "sum_s": step * batches, "p50_s": step, "max_s": step},
        "step_source": "dataloader" if batches else None,
    }
    if epoch_start is not None:
        train["epoch_start_wait"] = {"count": 1, "sum_s": epoch_start, "p50_s": epoch_start}
    return {
        "schema": 1, "seq": i, "elapsed_s": (i + 1) * secs, "interval_s": secs,
        "devices": devices if devices is not None else {"vda": dev()},
        "job": {"pids": 1 + workers, "read_bytes_s": job_read,
                "write_bytes_s": job_write or main_write, "roles": roles,
                "states": states or {"S": 1 + workers}},
        "cpu": {"user": 100 - idle, "system": 0.0, "iowait": 0.0, "idle": idle, "steal": 0.0},
        "train": train,
    }


def run_of(n: int = 30, **kw: Any) -> list[dict[str, Any]]:
    return [rec(i, **kw) for i in range(n)]


META = {"cpus": 8}


# -- severity ----------------------------------------------------------------------------


@pytest.mark.parametrize(("share", "band"), [
    (0.0, "none"), (0.0499, "none"), (0.05, "moderate"), (0.1999, "moderate"),
    (0.20, "high"), (1.0, "high")])
def test_severity_bands(share: float, band: str) -> None:
    assert severity(share) == band


@pytest.mark.parametrize(("wait", "cls"), [(0.0049, "compute-bound"), (0.005, "loader-starved")])
def test_compute_bound_ends_at_the_moderate_band(wait: float, cls: str) -> None:
    v = diagnose(run_of(wait=wait, step=0.1), META)
    assert v.cls == cls
    assert v.data_wait_share == pytest.approx(wait / 0.1)


def test_compute_bound_says_the_input_keeps_up() -> None:
    v = diagnose(run_of(wait=0.002, step=0.1), META)
    assert (v.cls, v.severity) == ("compute-bound", "none")
    assert "2.0% of its step time" in v.evidence[0]
    assert "profile" in v.recommendations[0].action
    assert v.windows[0].start == 0.0 and v.windows[0].end == 30.0


# -- storage-bound -----------------------------------------------------------------------

SLOW_LOOP = {"loop0": dev(util=97, r_s=112, rkb=112 * 64, r_await=31, aqu=3.4), "vda": dev()}


ON_LOOP = {"mount": "/mnt/data", "fstype": "ext4", "device": "loop0", "disks": ["loop0"],
           "kind": "block", "folders": ["/mnt/data/train"]}


def test_storage_bound_names_the_device_with_its_evidence() -> None:
    records = run_of(wait=0.09, step=0.1, devices=SLOW_LOOP, job_read=112 * 64 * 1024 * 0.99)
    v = diagnose(records, {**META, "storage": [ON_LOOP], "run_dir": "/runs/a b"})
    assert (v.cls, v.severity, v.devices) == ("storage-bound", "high", ["loop0"])
    assert v.evidence[0] == ("loop0 97% util, r_await 31.0 ms, aqu-sz 3.4, 7.0 MB/s in 112 "
                             "reads/s of 64 KiB, 99% of its reads by this job, from 00:00 "
                             "to 00:30")
    # Whether packing helps depends on what the device limits (requests or bytes), which
    # the run alone leaves open: a cache first, the probe that settles it, then the pack
    # with no prediction and the reason.
    first, probe, pack = v.recommendations[:3]
    assert first.action.startswith("cache the dataset in RAM") and first.prediction is None
    assert first.gain.startswith("up to 10.00x more steps per second")
    assert "`iolens probe --storage /mnt/data/train --run '/runs/a b'`" in probe.action
    assert "pack the dataset" in pack.action and "64 KiB" in pack.because
    assert pack.because.startswith("loop0 is saturated with small reads"), pack.because
    assert pack.prediction is None and "the probe tells" in (pack.unavailable or "")
    assert v.lines() == [
        "verdict: storage-bound (data wait 90.0% of step time, high)",
        f"evidence: {v.evidence[0]}",
        f"try: {first.action}; expected: {first.gain}"]


def test_advice_names_no_placeholder_path() -> None:
    # Where the dataset's storage is not known, the probe (which needs a path on it) is not
    # offered with PATH left in.
    records = run_of(wait=0.09, step=0.1, devices=SLOW_LOOP, job_read=112 * 64 * 1024 * 0.99)
    v = diagnose(records, META)
    assert v.cls == "storage-bound"
    assert not any("PATH" in r.action or "iolens probe" in r.action for r in v.recommendations)


def test_data_in_large_files_is_not_packed_again() -> None:
    records = run_of(wait=0.09, step=0.1, devices=SLOW_LOOP, job_read=112 * 64 * 1024 * 0.99)
    lmdb = {**ON_LOOP, "largest_file": 80 << 20}
    v = diagnose(records, {**META, "storage": [lmdb]})
    pack = next(r for r in v.recommendations if (r.change or {}).get("pack"))
    assert "iolens pack" not in pack.action and "BlockShuffleSampler" in pack.action
    assert "packed already" in pack.action
    # ... and read in blocks already (the loader's sampler says so): no pack advice at all
    block = {"num_workers": 2, "sampler": "iolens.data.BlockShuffleSampler"}
    v = diagnose(records, {**META, "storage": [lmdb], "loaders": [block]})
    assert not any((r.change or {}).get("pack") for r in v.recommendations)
    assert any((r.change or {}).get("pack") for r in v.declined)
    # a small file per sample is packed as before
    v = diagnose(records, {**META, "storage": [{**ON_LOOP, "largest_file": 64 << 10}]})
    assert any("iolens pack" in r.action for r in v.recommendations)


def test_the_pack_advice_fits_the_loader() -> None:
    records = run_of(wait=0.09, step=0.1, devices=SLOW_LOOP, job_read=112 * 64 * 1024 * 0.99)
    mapped = next(r for r in diagnose(records, META).recommendations if "pack" in r.action)
    assert "BlockShuffleSampler" in mapped.action and "webdataset" not in mapped.action
    for r in records:
        r["train"]["iterable_loader"] = True
    stream = next(r for r in diagnose(records, META).recommendations if "pack" in r.action)
    assert "--format webdataset" in stream.action and "shardshuffle=True" in stream.action
    assert ".shuffle(" in stream.action and "BlockShuffleSampler" not in stream.action


def test_large_reads_point_to_faster_storage_not_packing() -> None:
    big = {"sda": dev(util=99, r_s=40, rkb=40 * 512, r_await=25, aqu=2)}
    v = diagnose(run_of(wait=0.05, step=0.1, devices=big, job_read=40 * 512 * 1024), META)
    assert v.cls == "storage-bound"
    assert "faster local storage" in v.recommendations[0].action
    assert not any("pack" in r.action for r in v.recommendations)


@pytest.mark.parametrize(("util", "cls"), [(rules.UTIL_SATURATED - 0.1, "loader-starved"),
                                           (rules.UTIL_SATURATED, "storage-bound")])
def test_util_threshold(util: float, cls: str) -> None:
    d = {"vdb": dev(util=util, r_s=100, rkb=6400, r_await=2)}
    assert diagnose(run_of(wait=0.05, devices=d, job_read=6400 * 1024), META).cls == cls


@pytest.mark.parametrize(("own", "cls"), [(rules.JOB_SHARE_OWN - 0.01, "loader-starved"),
                                          (rules.JOB_SHARE_OWN, "storage-bound")])
def test_the_job_must_make_up_the_load(own: float, cls: str) -> None:
    d = {"vdb": dev(util=95, r_s=100, rkb=6400, r_await=20, aqu=2)}
    assert diagnose(run_of(wait=0.05, devices=d, job_read=6400 * 1024 * own), META).cls == cls


def test_slow_await_with_a_queue_counts_as_slow_even_below_full_util() -> None:
    d = {"nvme0n1": dev(util=60, r_s=3000, rkb=3000 * 16, r_await=12, aqu=36)}
    v = diagnose(run_of(wait=0.05, devices=d, job_read=3000 * 16 * 1024), META)
    assert v.cls == "storage-bound" and v.devices == ["nvme0n1"]
    # at 60% util the device is slow, not saturated, and the advice says so
    texts = [r.action + r.because for r in v.recommendations]
    assert not any("saturated" in t for t in texts), texts
    assert any("while nvme0n1 is slow (12.0 ms a read, 36.0 queued)" in t for t in texts), texts


def test_io_wait_above_the_device_is_storage_bound() -> None:
    d = {"loop0": dev(util=8, r_s=20, rkb=1280, r_await=0.4)}
    v = diagnose(run_of(wait=0.08, devices=d, job_read=1280 * 1024, states={"D": 2, "S": 1}),
                 META)
    assert v.cls == "storage-bound" and v.devices == ["loop0"]
    assert "limit is above the device" in v.evidence[0]


# -- CPU and loader --------------------------------------------------------------------


@pytest.mark.parametrize(("cpu", "cls"), [(rules.WORKER_CPU_BUSY - 0.1, "loader-starved"),
                                          (rules.WORKER_CPU_BUSY, "cpu-bound-input")])
def test_worker_cpu_threshold(cpu: float, cls: str) -> None:
    assert diagnose(run_of(wait=0.05, worker_cpu=cpu), META).cls == cls


def test_cpu_bound_input_suggests_the_free_cores() -> None:
    v = diagnose(run_of(wait=0.06, workers=2, worker_cpu=98, idle=50), META)
    assert v.cls == "cpu-bound-input"
    assert v.evidence[0] == "2 DataLoader workers at 98% of a core each, from 00:00 to 00:30"
    assert v.recommendations[0].action == "raise num_workers from 2 to 6"  # 4 of 8 cores idle


@pytest.mark.parametrize(("cpu", "cls"), [(rules.WORKER_CPU_SOME - 1, "loader-starved"),
                                          (rules.WORKER_CPU_SOME, "cpu-bound-input")])
def test_a_machine_without_idle_cpu(cpu: float, cls: str) -> None:
    v = diagnose(run_of(wait=0.06, worker_cpu=cpu, idle=rules.MACHINE_IDLE_LOW - 1), META)
    assert v.cls == cls
    if cls == "cpu-bound-input":
        assert "cheaper" in v.recommendations[0].action  # no free core to add workers on


def test_loader_starved_with_idle_resources() -> None:
    v = diagnose(run_of(wait=0.03, workers=2, worker_cpu=20), META)
    assert (v.cls, v.severity) == ("loader-starved", "high")
    # 4 of 8 cores idle and each worker uses 0.2 of one: room for many, doubled at most.
    assert v.recommendations[0].action == "raise num_workers from 2 to 4"
    assert "prefetch_factor" in v.recommendations[1].action


def test_no_workers_means_loading_in_the_main_process() -> None:
    v = diagnose(run_of(wait=0.03, workers=0), META)
    assert v.cls == "loader-starved"
    assert "num_workers=0" in v.evidence[0]
    assert v.recommendations[0].action == "raise num_workers from 0 to 7"


# -- write stalls ------------------------------------------------------------------------


def test_checkpoint_writes_that_stall_steps() -> None:
    records = run_of(20, wait=0.002, step=0.1)
    flood = {"vdb": dev(util=98, w_s=200, wkb=200 * 1024, w_await=80, aqu=9)}
    for i in (5, 6, 15, 16):  # two checkpoints, each stalling two intervals
        records[i] = rec(i, wait=0.002, step=0.1, batches=2, devices=flood,
                         main_write=200 * 1024 * 1024)
        records[i]["train"]["step"]["sum_s"] = 1.0  # 2 batches in 1 s instead of 0.2 s
    v = diagnose(records, META)
    assert (v.cls, v.devices) == ("write-stall", ["vdb"])
    assert "writes by the training process" in v.evidence[0]
    assert "asynchronously" in v.recommendations[0].action
    assert v.windows[0].start == 5.0 and v.windows[0].end == 18.0  # with the step after


def test_writes_by_someone_else_are_not_a_write_stall() -> None:
    flood = {"vdb": dev(util=98, w_s=200, wkb=200 * 1024, w_await=80)}
    records = run_of(10, wait=0.002, devices=flood, main_write=0.0)
    assert diagnose(records, META).cls == "compute-bound"


# -- findings ----------------------------------------------------------------------------


def test_noisy_neighbor_on_a_shared_device() -> None:
    d = {"vdb": dev(util=70, r_s=500, rkb=50_000)}
    v = diagnose(run_of(wait=0.002, devices=d, job_read=1_000_000), META)
    assert v.cls == "compute-bound"
    (f,) = [f for f in v.findings if f.cls == "noisy-neighbor"]
    assert "only 2% of it by this job" in f.evidence[0]


def test_a_loop_devices_backing_disk_is_not_a_neighbor() -> None:
    d = {"loop0": dev(util=95, r_s=100, rkb=6400, r_await=30, aqu=3),
         "vda": dev(util=96, r_s=100, rkb=6400, r_await=29, aqu=3)}
    v = diagnose(run_of(wait=0.09, devices=d, job_read=6400 * 1024), META)
    assert v.cls == "storage-bound"
    assert not [f for f in v.findings if f.cls == "noisy-neighbor"]


def test_reads_through_a_loop_device_count_as_the_jobs_on_its_backing_disk() -> None:
    """The job's own read_bytes see a tenth of the reads (the rest through a mapping), the
    loop device carries them all: the busy backing disk is not a neighbour's. With the
    loop device idle, the same reads are another process's."""
    d = {"loop0": dev(util=30, r_s=100, rkb=6400), "vda": dev(util=90, r_s=100, rkb=6400)}
    v = diagnose(run_of(wait=0.002, devices=d, job_read=640 * 1024), META)
    assert not [f for f in v.findings if f.cls == "noisy-neighbor"]
    d["loop0"] = dev()
    v = diagnose(run_of(wait=0.002, devices=d, job_read=640 * 1024), META)
    (f,) = [f for f in v.findings if f.cls == "noisy-neighbor"]
    assert f.evidence[0].startswith("vda 90% util, 6.2 MB/s read"), f.evidence


def test_warm_cache_threshold() -> None:
    mb = 1 << 20
    warm = diagnose(run_of(wait=0.002, worker_rchar=20 * mb, job_read=1.5 * mb), META)
    cool = diagnose(run_of(wait=0.002, worker_rchar=20 * mb, job_read=2.1 * mb), META)
    assert [f.cls for f in warm.findings] == ["warm-cache"]
    assert "92% of what the worker processes read came from the page cache" in \
        warm.findings[0].evidence[0]
    assert not cool.findings


def test_cold_start() -> None:
    records = [rec(i, wait=0.08 if i < 6 else 0.01) for i in range(30)]
    (f,) = [f for f in diagnose(records, META).findings if f.cls == "cold-start"]
    assert f.window is not None and (f.window.start, f.window.end) == (0.0, 6.0)
    steady = diagnose([rec(i, wait=0.03) for i in range(30)], META)
    assert not [f for f in steady.findings if f.cls == "cold-start"]


def test_epoch_start_stall() -> None:
    records = [rec(i, wait=0.01, epoch_start=0.8 if i % 5 == 0 else None) for i in range(30)]
    (f,) = [f for f in diagnose(records, META).findings if f.cls == "epoch-start-stall"]
    assert "800 ms on average over 6 epochs" in f.evidence[0]
    assert "persistent_workers=True" in f.recommendations[0].action


def test_no_disk_stats() -> None:
    records = run_of(wait=0.002, devices={})
    meta = {"notes": ["/proc/diskstats: unreadable: no device statistics on this system"],
            "disk_source": None}
    (f,) = diagnose(records, meta).findings
    assert f.cls == "no-disk-stats" and "no device statistics" in f.evidence[0]


def test_no_disk_stats_is_said_in_the_verdict() -> None:
    """No device figures: the verdict says what it rests on and claims nothing of storage."""
    note = "cannot read /proc/diskstats (Permission denied): no device statistics on this system"
    v = diagnose(run_of(wait=0.05, step=0.1, devices={}), {"notes": [note], "cpus": 8})
    assert v.cls == "loader-starved"
    assert v.caveat == ("no device statistics: cannot read /proc/diskstats (Permission denied); "
                        "the verdict rests on the training loop's timing (data wait share, step "
                        "time) and the job's processes alone")
    assert v.findings[0].evidence == [v.caveat]
    assert v.to_dict()["caveat"] == v.caveat and v.lines()[-1] == f"note: {v.caveat}"
    assert "the storage not measured" in v.evidence[0]
    assert "not saturated (the device was not measured)" in v.recommendations[0].because
    measured = diagnose(run_of(wait=0.05, step=0.1), META)
    assert measured.caveat is None and "note:" not in " ".join(measured.lines())
    assert "the storage not saturated" in measured.evidence[0]


def test_disk_stats_stopping_mid_run_is_said() -> None:
    """Device statistics that stop partway: a finding and caveat from when, with the reason."""
    records = run_of(10, wait=0.002) + [rec(i, wait=0.002, devices={}) for i in range(10, 20)]
    note = "device statistics stopped: cannot read /proc/diskstats (No such device)"
    v = diagnose(records, {"notes": [note]})
    (f,) = [f for f in v.findings if f.cls == "no-disk-stats"]
    assert f.evidence == [v.caveat]
    assert v.caveat == (note + " (at 00:10); from then on the verdict rests on the training "
                        "loop's timing (data wait share, step time) and the job's processes alone")
    assert f.window is not None and (f.window.start, f.window.end) == (10.0, 20.0)
    assert diagnose(records, {}).caveat is None  # no note: devices merely idle or unwatched


# -- runs without steps ------------------------------------------------------------------


def test_empty_run_has_a_verdict_of_its_own() -> None:
    v = diagnose([], {})
    assert (v.cls, v.severity, v.data_wait_share) == ("no-steps", "unknown", None)
    assert "no interval was recorded" in v.evidence[0]
    assert v.lines()[0] == "verdict: no timed training steps"


def test_no_steps_says_why() -> None:
    records = run_of(5, batches=0)
    assert "--no-instrument" in diagnose(records, {"instrumented": False}).evidence[0]
    failed = {"timing": [{"pid": 7, "error": "cannot write timing records: No space"}]}
    assert "timing failed in process 7" in diagnose(records, failed).evidence[0]
    assert "no torch DataLoader batch" in diagnose(records, {}).evidence[0]


def test_few_batches_are_flagged() -> None:
    v = diagnose(run_of(2, batches=3, wait=0.002), META)
    assert "only 6 batches timed" in v.evidence[-1]


def test_verdict_serializes_to_json() -> None:
    v = diagnose(run_of(wait=0.09, devices=SLOW_LOOP, job_read=112 * 64 * 1024), META)
    d = json.loads(json.dumps(v.to_dict()))
    assert d["class"] == "storage-bound" and d["severity"] == "high"
    assert 0 <= d["data_wait_share"] <= 1 and d["devices"] == ["loop0"]
    assert d["recommendations"][0]["expected_gain"]
    assert isinstance(v, Verdict)


def test_clock() -> None:
    assert [clock(s) for s in (0, 59.6, 61, 3725)] == ["00:00", "01:00", "01:01", "1:02:05"]


# -- reading run directories -------------------------------------------------------------


def test_load_run_reads_as_far_as_valid(tmp_path: Path) -> None:
    lines = [json.dumps(rec(i)) for i in range(4)]
    lines.insert(2, "{not json")
    lines.insert(3, "[1, 2]")
    newer = rec(9)
    newer["schema"] = 99
    lines.append(json.dumps(newer))
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n" + '{"schema": 1, "se')
    (tmp_path / "meta.json").write_text("{broken")
    run = load_run(str(tmp_path))
    assert len(run.records) == 5 and run.meta == {}
    text = " | ".join(run.notes)
    assert "meta.json could not be read" in text
    assert "3 line(s) of records.jsonl were not valid records" in text
    assert "(the first at line 3)" in text
    assert "1 record(s) come from a newer iolens" in text


def test_load_run_errors(tmp_path: Path) -> None:
    with pytest.raises(IolensError, match="no such run directory"):
        load_run(str(tmp_path / "nope"))
    with pytest.raises(IolensError, match="not a run directory"):
        load_run(str(tmp_path))
    (tmp_path / "README.md").write_text("# a file\n")
    with pytest.raises(IolensError, match=r"README.md: not a run directory \(a folder that "
                       r"`iolens run` wrote, holding meta.json and records.jsonl\)$"):
        load_run(str(tmp_path / "README.md"))


def test_declared_workers_count_when_none_was_sampled() -> None:
    records = run_of(wait=0.03, workers=0)
    records[0]["train"]["num_workers"] = 2  # the loaders asked for 2 workers
    v = diagnose(records, META)
    assert v.cls == "loader-starved"
    assert v.evidence[0].startswith("2 DataLoader workers asked for, none seen at work")


# -- from inside the input pipeline (the workers' stage figures) --------------------------


def piped(n: int = 30, *, fetch: float, cpu: float, collate: float = 0.001, idle: float = 0.0,
          handover: float = 0.0005, files: int = 8, wait: float = 0.05, step: float = 0.1,
          worker_rchar: float = 8 * 65536.0, job_read: float = 0.0,
          epoch_start: float | None = None, states: dict[str, int] | None = None,
          devices: dict[str, dict[str, float]] | None = None) -> list[dict[str, Any]]:
    """Intervals of 10 batches of 8 samples, with the workers' stages per batch."""
    out = []
    for i in range(n):
        r = rec(i, batches=10, wait=wait, step=step, workers=2, worker_cpu=20.0,
                worker_rchar=worker_rchar, job_read=job_read, epoch_start=epoch_start,
                states=states, devices=devices)
        r["train"]["pipeline"] = {
            "batches": 10, "samples": 80, "processes": 2, "in_process": False,
            "fetch_s": 10 * fetch, "fetch_cpu_s": 10 * cpu, "collate_s": 10 * collate,
            "idle_s": 10 * idle, "files": 10 * files,
            "handover": {"count": 10, "sum_s": 10 * handover}}
        out.append(r)
    return out


FUSE_META = {"cpus": 8, "storage": [
    {"mount": "/mnt/bucket", "fstype": "fuse.rclone", "device": None, "kind": "fuse",
     "disks": [], "page_cache_visible": False, "opens": 1111},
    {"mount": "/", "fstype": "ext4", "device": "vda1", "kind": "block", "disks": ["vda"],
     "page_cache_visible": True, "opens": 11}]}


def test_a_blocked_fetch_on_fuse_is_storage_bound_and_names_the_mount() -> None:
    v = diagnose(piped(fetch=0.2, cpu=0.002), FUSE_META)
    assert v.cls == "storage-bound" and v.devices == []
    assert "/mnt/bucket (fuse.rclone, no block device)" in v.evidence[0]
    assert any("cache the dataset" in r.action for r in v.recommendations)
    assert not [f for f in v.findings if f.cls == "warm-cache"]


def test_the_requests_waiting_on_a_fuse_mount_are_its_window_s_mean_over_time() -> None:
    """The FUSE connection's waiting requests, averaged over the verdict's window by the
    intervals' seconds; the intervals that did not read them are left out, as are the
    intervals outside the window (here the first ten, which waited under 5% of the step)."""
    records = piped(fetch=0.2, cpu=0.002)
    for i, r in enumerate(records):
        if i < 10:
            r["train"]["data_wait"]["sum_s"] = 0.001  # a calm start: not in the window
        r["storage"] = {"/mnt/bucket": {"waiting": 100.0 if i < 10 else 2.0 + i % 2}}
        r["interval_s"] = 2.0 if i % 2 else 1.0
    del records[20]["storage"]["/mnt/bucket"]["waiting"]  # (even: a 1-second interval)
    v = diagnose(records, FUSE_META)
    # the window's 19 intervals: 9 of 1 s waiting 2, 10 of 2 s waiting 3
    want = (9 * 2.0 + 10 * 2 * 3.0) / (9 + 10 * 2)
    assert f"{want:.1f} requests waiting on the FUSE connection on average" in v.evidence, \
        v.evidence


@pytest.mark.parametrize("by_role", [True, False])
def test_a_throttle_above_the_device_is_told_by_the_workers_state_not_the_jobs(
        by_role: bool) -> None:
    """NOTE [blocked by role]: the training process sleeps in S while its workers fetch.
    Here the 2 workers are in D in 8 of 12 intervals and on a core in the other 4: 16 of
    their 24 samples (0.67), 16 of the job's 36 (0.44). The workers' share decides where
    the records keep it; records from before that keep the job's rule."""
    records = piped(12, fetch=0.2, cpu=0.002, job_read=8 * 65536.0,
                    devices={"loop0": dev(util=2, r_s=20, rkb=1280, r_await=0.3)})
    for i, r in enumerate(records):
        d = 2 if i % 3 else 0
        r["job"]["states"] = {"D": d, "R": 2 - d, "S": 1}
        if by_role:
            r["job"]["roles"]["main"]["blocked"] = 0
            r["job"]["roles"]["worker"]["blocked"] = d
    v = diagnose(records, {**META, "storage": [ON_LOOP]})
    if by_role:
        assert v.cls == "storage-bound" and v.devices == ["loop0"], v.evidence
    else:
        assert v.cls == "loader-starved", v.evidence
        assert any("wait on something else" in e for e in v.evidence), v.evidence


@pytest.mark.parametrize(("cpu", "idle", "cls", "said"), [
    (0.045, 0.0, "storage-bound", "their fetch off the CPU 54% of their busy time"),
    (0.055, 0.0, "cpu-bound-input", "their fetch off the CPU 45% of their busy time"),
    (0.002, 0.0, "storage-bound", None),  # off the CPU 98%: no doubt
    (0.08, 0.0, "cpu-bound-input", None),  # 20%
    (0.002, 0.09, "storage-bound", "the workers idle 47% of their time"),
])
def test_a_class_decided_near_a_half_of_the_workers_time_says_it_is_a_close_call(
        cpu: float, idle: float, cls: str, said: str | None) -> None:
    """NOTE [a close call]: with no device saturated, the workers' idle time and their
    fetch's time off the CPU decide the class at a half each; within 10 points of the half
    that decided, the caveat says so and names the class it gave."""
    v = diagnose(piped(fetch=0.1, cpu=cpu, idle=idle), FUSE_META)
    assert v.cls == cls, v.evidence
    if said is None:
        assert v.caveat is None, v.caveat
    else:
        assert v.caveat == f"a close call, {said}, near the 50% that divides " + (
            "workers that keep up from busy ones" if "idle" in said
            else "a fetch that waits from one that computes") + (
            f": a run alike may be classed other than {cls}"), v.caveat


def test_only_the_most_opened_mount_is_the_dataset() -> None:
    """An NFS home read once by a library does not make a local dataset remote."""
    meta = {"cpus": 8, "storage": [
        {"mount": "/", "fstype": "ext4", "device": "vda1", "kind": "block", "disks": ["vda"],
         "page_cache_visible": True, "opens": 1111},
        {"mount": "/home", "fstype": "nfs4", "device": None, "kind": "nfs", "disks": [],
         "page_cache_visible": False, "opens": 1}]}
    v = diagnose(piped(fetch=0.2, cpu=0.002), meta)
    assert v.cls == "loader-starved", v.evidence  # a fast local disk: it waits on else
    assert any("wait on something else" in e for e in v.evidence)


def test_a_starved_loop_on_a_gpu_is_told_to_pin_memory_unless_it_does() -> None:
    """The pin_memory advice follows a GPU in any timed interval (NVML answering for it or
    not), and not a loader that pins already."""
    meta = {"cpus": 8, "storage": [
        {"mount": "/", "fstype": "ext4", "device": "vda1", "kind": "block", "disks": ["vda"],
         "page_cache_visible": True, "opens": 1111}]}

    def pins(records: list[dict[str, Any]], loaders: list[dict[str, Any]]) -> bool:
        v = diagnose(records, {**meta, "loaders": loaders})
        assert v.cls == "loader-starved", v.evidence
        return any("pin_memory=True" in r.action for r in v.recommendations)

    records = piped(fetch=0.2, cpu=0.002)
    assert not pins(records, [])
    records[7]["gpu"] = [{"index": 0, "util_pct": None}]  # one interval, NVML failing
    assert pins(records, [])
    assert not pins(records, [{"num_workers": 2, "pin_memory": True}])


def test_a_heavy_collate_beside_a_light_blocked_read_is_not_storage() -> None:
    v = diagnose(piped(fetch=0.004, cpu=0.0005, collate=0.04), FUSE_META)
    assert v.cls == "cpu-bound-input", v.evidence


def test_idle_workers_with_the_wait_in_the_hand_over_are_handover_bound() -> None:
    v = diagnose(piped(fetch=0.001, cpu=0.001, idle=0.05, handover=0.045, wait=0.05), META)
    assert v.cls == "handover-bound"
    assert not any(r.action.startswith("raise num_workers") for r in v.recommendations)


def test_idle_workers_whose_fetch_waits_for_a_core_are_cpu_bound() -> None:
    """NOTE [idle workers queued for a core]: the same idle workers and hand-over as above,
    on cores so busy that the workers' fetch waits for one 60% of its time."""
    records = piped(fetch=0.04, cpu=0.016, idle=0.05, handover=0.045, wait=0.05)
    assert diagnose(records, {"cpus": 2}).cls == "handover-bound"
    for r in records:
        worker = r["job"]["roles"]["worker"]  # on the CPU: the fetch and the collate
        worker.update(run_delay_pct=30.0, cpu_pct=17.0)  # waited 0.3 s of each 1 s
        r["cpu"].update(user=100.0, idle=0.0)
    pipe = pipeline(records, {"cpus": 2})
    assert pipe is not None and pipe.fetch_queue_share == pytest.approx(0.6)
    assert (pipe.worker_idle_share or 0.0) >= rules.WORKERS_IDLE
    v = diagnose(records, {"cpus": 2})
    assert v.cls == "cpu-bound-input", v.evidence
    assert not v.recommendations[0].action.startswith("make each batch cheaper"), v


def test_idle_workers_behind_one_slow_batch_are_not_handover_bound() -> None:
    """Batches come back in order: a slow one leaves the others idle while the loop waits;
    the hand-over is a small part of the wait, so adding workers is not ruled out."""
    v = diagnose(piped(fetch=0.001, cpu=0.001, idle=0.05, handover=0.001, wait=0.05), META)
    assert v.cls == "loader-starved"
    assert any("in_order=False" in r.action for r in v.recommendations)


def test_a_memmapped_dataset_counts_as_read_from_its_page_faults() -> None:
    """A memmap opens no file per sample and reads nothing through read(): its page faults
    count in read_bytes, and a slow device under them makes it storage-bound."""
    slow = {"vda": dev(util=40.0, r_await=25.0, aqu=0.5, r_s=100.0, rkb=6400.0)}
    recs = piped(fetch=0.2, cpu=0.002, files=0, worker_rchar=0.0, job_read=6400 * 1024.0)
    for r in recs:
        r["devices"] = slow
    meta = {"cpus": 8, "storage": [
        {"mount": "/", "fstype": "ext4", "device": "vda1", "kind": "block", "disks": ["vda"],
         "page_cache_visible": True, "opens": 0, "mapped": True}]}
    v = diagnose(recs, meta)
    assert v.cls == "storage-bound", v.evidence
    assert v.devices == ["vda"]  # the disk whose counters show it, not the partition
    assert "r_await 25.0 ms" in v.evidence[0]


def test_a_plain_iterable_is_not_told_to_raise_num_workers() -> None:
    """A generator wrapped with iolens.instrument() has no num_workers to raise."""
    recs = run_of(workers=0, wait=0.05, step=0.1)
    for r in recs[:1]:
        r["train"]["iterable_loader"] = True
    v = diagnose(recs, META)
    assert v.cls == "loader-starved"
    assert "not a torch DataLoader" in v.evidence[0]
    assert not any("num_workers from" in r.action for r in v.recommendations)
    assert "IterableDataset" in v.recommendations[0].action


def test_counts_agree_with_their_nouns() -> None:
    from iolens.core.words import plural

    assert [plural(1, "epoch"), plural(2, "epoch"), plural(0, "batch", "batches")] == [
        "1 epoch", "2 epochs", "0 batches"]
    assert plural(1.0, "DataLoader worker") == "1 DataLoader worker"
    v = diagnose(run_of(wait=0.05, step=0.1, workers=1, worker_cpu=10.0), META)
    assert v.cls == "loader-starved" and v.evidence[0].startswith(
        "1 DataLoader worker at 10% of a core, "), v.evidence
    # a worker too short-lived to be sampled is still counted from the loader's settings
    v = diagnose(run_of(wait=0.05, step=0.1, workers=0),
                 {**META, "loaders": [{"num_workers": 2}]})
    assert v.evidence[0].startswith("2 DataLoader workers asked for, none seen"), v.evidence


def test_the_hand_over_advice_knows_what_the_batches_hold() -> None:
    records = piped(30, fetch=0.001, cpu=0.001, idle=0.05, handover=0.045, wait=0.05)
    tensors = [{"num_workers": 2, "batch_types": "torch.Tensor"}]
    v = diagnose(records, {**META, "loaders": tensors})
    assert v.cls == "handover-bound"
    (hand,) = [r for r in v.recommendations if r.action.startswith("make each batch cheaper")]
    assert "return tensors" not in hand.action and "shared memory already" in hand.action
    arrays = [{"num_workers": 2, "batch_types": "list,numpy.ndarray"}]
    (hand,) = [r for r in diagnose(records, {**META, "loaders": arrays}).recommendations
               if r.action.startswith("make each batch cheaper")]
    assert "return tensors" in hand.action and "(the batches hold list, numpy.ndarray)" in (
        hand.action)


def test_a_batch_of_tensors_is_told_to_hand_over_fewer_not_fewer_bytes() -> None:
    """NOTE [a tensor's hand-over]: a batch of tensors is handed over at a cost a tensor,
    whatever their bytes."""
    records = piped(30, fetch=0.001, cpu=0.001, idle=0.05, handover=0.045, wait=0.05)

    def advice(**loader: Any) -> list[Any]:
        v = diagnose(records, {**META, "loaders": [
            {"num_workers": 2, "batch_types": "torch.Tensor", **loader}]})
        assert v.cls == "handover-bound", v.evidence
        return [r for r in v.recommendations + v.declined if "hand" in r.action]

    (one,) = advice(batch_tensors=16)
    assert one.action.startswith("hand each batch over as one tensor: its 16 tensors"), one
    assert one.change == {"handover": round(3 / 18, 3)} and one.prediction is not None
    (big,) = advice(batch_tensors=16, batch_bytes=16 << 20)  # 16 MiB: the bytes count too
    assert big.change == {"handover": round((3 * 0.15 + 14 * 0.3) / (18 * 0.15 + 14 * 0.3),
                                            3)}, big.change
    assert "bytes" not in one.action.split(";")[0].split("and their")[0], one.action
    # one tensor a batch already: nothing to change in the hand-over, and no figure
    (leave,) = advice(batch_tensors=1)
    assert leave.action.startswith("leave the hand-over as it is") and leave.change is None
    assert leave.prediction is None and "45.00 ms" in leave.action, leave.action
    # ... unless it is large: 8 MiB, whose bytes are the most of its hand-over
    (large,) = advice(batch_tensors=1, batch_bytes=8 << 20)
    assert large.action.startswith("make each batch cheaper to hand over: keep it small in "
                                   "bytes"), large.action
    assert large.change == {"handover": round((3 * 0.15 + 2 * 0.3) / (3 * 0.15 + 6 * 0.3),
                                              3)}, large.change
    # pinned: the pinning thread copies each byte, and fewer bytes are the lever again
    (pinned,) = advice(batch_tensors=16, pin_memory=True)
    assert pinned.action.startswith("make each batch cheaper") and (
        "pin_memory copies each byte" in pinned.action), pinned.action
    # a list of arrays, pickled whole (45 ms a batch here): as 4 tensors, (2 + 4) x 0.15 ms
    (pickled,) = advice(batch_types="numpy.ndarray", batch_leaves=4, batch_tensors=0,
                        batch_bytes=2 << 20)
    assert "return tensors" in pickled.action and "keep the batch small" not in (
        pickled.action), pickled.action
    assert pickled.change == {"handover": round(6 * 0.15 / 45, 3)}  # (2 MiB: no bytes' part)
    assert pickled.prediction is not None and any(
        "4 leaves as tensors, handed over in 0.90 ms" in b for b in pickled.prediction.basis
    ), pickled.prediction.basis



def test_samples_kept_apart_are_told_to_be_stacked_and_predicted_so() -> None:
    """NOTE [samples kept apart]: a batch the timing hook saw as its samples kept apart and
    alike (``batch_fields``) is told to let the default collate_fn stack them, and the
    hand-over is predicted for a tensor a field, not a tensor a leaf."""
    records = piped(30, fetch=0.001, cpu=0.001, idle=0.05, handover=0.045, wait=0.05)

    def pickled(**loader: Any) -> Any:
        v = diagnose(records, {**META, "loaders": [
            {"num_workers": 2, "batch_types": "numpy.ndarray", "batch_tensors": 0,
             "batch_bytes": 4 << 20, "batch_size": 8, **loader}]})
        (rec,) = [r for r in v.recommendations + v.declined if "return tensors" in r.action]
        return rec

    stacked = pickled(batch_leaves=8, batch_fields=1)  # 8 samples, an array each
    assert stacked.action.endswith(
        "let the default collate_fn stack them: a batch is its samples kept apart, 8 leaves "
        "alike in shape, 1 tensor a batch once stacked"), stacked.action
    one = (2 + 1) * 0.15 + 2 * 0.3  # ms: one tensor's parts, 2 MiB beyond the free 2
    assert stacked.change == {"handover": round(one / 45, 3)}, stacked.change
    assert "its 8 leaves stacked into 1 tensor, handed over in 1.05 ms" in (
        stacked.prediction.basis[0]), stacked.prediction.basis
    fields = pickled(batch_leaves=16, batch_fields=2)  # (an array and a label a sample)
    assert "2 tensors a batch once stacked" in fields.action, fields.action
    assert fields.change == {"handover": round(((2 + 2) * 0.15 + 0.6) / 45, 3)}
    for loader in ({"batch_leaves": 8}, {"batch_leaves": 8, "batch_fields": 0},
                   {"batch_leaves": 8, "batch_fields": "1"}):
        other = pickled(**loader)  # (not seen as samples kept apart: a tensor a leaf)
        assert "stack" not in other.action, (loader, other.action)
        assert other.change == {"handover": round((10 * 0.15 + 0.6) / 45, 3)}, (
            loader, other.change)
    # several loaders: the pickling loader's, not an evaluation loader's of tensors
    v = diagnose(records, {**META, "loaders": [
        {"num_workers": 2, "batch_types": "numpy.ndarray", "batch_tensors": 0,
         "batch_bytes": 4 << 20, "batch_leaves": 16, "batch_size": 8, "batch_fields": 2},
        {"num_workers": 2, "batch_types": "torch.Tensor", "batch_tensors": 32,
         "batch_leaves": 64, "batch_size": 32, "batch_fields": 2}]})
    (rec,) = [r for r in v.recommendations if "return tensors" in r.action]
    assert "16 leaves alike in shape, 2 tensors a batch" in rec.action, rec.action


def test_the_labs_milliseconds_follow_the_machines_pace() -> None:
    """NOTE [the machine's pace]: a run whose recorder timed its fixed Python work at twice
    the lab's time has the lab's hand-over of tensors (and their release) doubled; a pace
    outside rules.PACE_BOUNDS is held to them, and a run without one (or with a bad one)
    keeps the lab's figures."""
    records = piped(30, fetch=0.001, cpu=0.001, idle=0.05, handover=0.045, wait=0.05)
    loaders = [{"num_workers": 2, "batch_types": "numpy.ndarray", "batch_leaves": 4,
                "batch_tensors": 0, "batch_bytes": 4 << 20}]

    def pickled(**meta: Any) -> Any:
        v = diagnose(records, {**META, "loaders": loaders, **meta})
        (rec,) = [r for r in v.recommendations if "return tensors" in r.action]
        return v, rec

    lab = 6 * 0.15 + 2 * 0.3  # ms: (2 + 4) tensors' parts, 2 MiB beyond the free 2
    for meta, pace in (({}, None), ({"pace_s": "fast"}, None), ({"pace_s": -1.0}, None),
                       ({"pace_s": float("nan")}, None), ({"pace_s": True}, None),
                       ({"pace_s": rules.PACE_LAB_S}, 1.0),
                       ({"pace_s": 2 * rules.PACE_LAB_S}, 2.0),
                       ({"pace_s": 10 * rules.PACE_LAB_S}, rules.PACE_BOUNDS[1]),
                       ({"pace_s": rules.PACE_LAB_S / 10}, rules.PACE_BOUNDS[0])):
        v, rec = pickled(**meta)
        assert v.pace == pace, (meta, v.pace)
        scale = pace or 1.0
        assert rec.change == {"handover": round(lab * scale / 45, 3)}, (meta, rec.change)
        basis = rec.prediction.basis[0]
        assert f"handed over in {lab * scale:.2f} ms" in basis, basis
        assert f"freed by the loop in {4 * 0.1 * scale:.2f} ms" in basis, basis
        assert f"written by the workers in {4 * 1.1 * scale:.2f} ms" in basis, basis
        assert ("at this machine's pace" in basis) == (pace is not None and pace != 1.0), basis
    slow, fast = pickled(pace_s=2 * rules.PACE_LAB_S)[1], pickled()[1]
    assert slow.prediction.steps_per_s < fast.prediction.steps_per_s


def test_steps_marked_by_hand_give_their_rate_and_window_and_ask_for_the_wait() -> None:
    """iolens.step() marks and no DataLoader batch: the steps' figures, the window of the
    intervals that marked them, and how to time the data too."""
    records = [rec(i, batches=0) for i in range(12)]
    for i in range(3, 9):  # 00:03-00:09: 4 steps of 0.2 s a second
        t = records[i]["train"]
        t.update(step_source="marks", step={"count": 4, "sum_s": 0.8, "p50_s": 0.19 + i / 100})
    v = diagnose(records, META)
    assert v.cls == "steps-only" and v.severity == "unknown"
    assert v.figures["steps"] == 24 and v.figures["steps_per_s"] == 5.0
    assert v.figures["step_p50_s"] == pytest.approx(0.245)  # the median of 0.22-0.27
    assert v.evidence[0].startswith("24 steps timed between calls of iolens.step(), 5.00 "
                                    "steps/s, median step 245.0 ms"), v.evidence
    assert [(w.start, w.end, w.label) for w in v.windows] == [(3.0, 9.0, "steps-only")]
    assert v.recommendations[0].action.startswith("time the data too")


def test_a_run_that_ends_waiting_for_a_batch_is_hung() -> None:
    waiting = [{"pid": 10, "role": "main", "state": "S", "syscall": "poll"},
               {"pid": 11, "role": "worker", "state": "S", "wchan": "wait_for_partner",
                "syscall": "openat"}]
    records = run_of(n=5, wait=0.05, step=0.1) + [rec(i, batches=0) for i in range(5, 50)]
    for i, r in enumerate(records[35:]):
        r["train"]["waiting_s"] = 30.0 + i
        r["train"]["waiting"] = waiting
    v = diagnose(records, META)
    assert (v.cls, v.severity) == ("hung", "high")
    assert v.evidence[0].startswith("no batch came in the last 44 s recorded"), v.evidence
    assert "worker 11 (S, in openat, at wait_for_partner)" in v.evidence[0]
    assert v.recommendations[0].action.startswith("see where the workers wait")
    # The job stopped by a signal: its last intervals see a worker run its handler and the
    # main process gone. Each process is told as most of the hang saw it.
    stopped = [dict(p) for p in records[-1]["train"]["waiting"]]
    stopped[1].update(state="R", syscall="running", wchan="")
    for r in records[-2:]:
        r["train"]["waiting"] = stopped[1:]
    evidence = diagnose(records, META).evidence[0]
    assert evidence.endswith("main 10 (S, in poll), worker 11 (S, in openat, at "
                             "wait_for_partner)"), evidence
    assert any(f.cls == "hang" for f in v.findings)
    # no batch at all: the loop began an epoch and none came
    began = [rec(i, batches=0) for i in range(40)]
    began[3]["train"]["epochs_started"], began[3]["train"]["num_workers"] = 1, 2
    for r in began[34:]:
        r["train"]["waiting_s"], r["train"]["waiting"] = 31.0, waiting
    v = diagnose(began, {**META, "exit_code": 143})
    assert v.cls == "no-steps" and v.evidence[0].startswith("no batch came in the last 31 s")
    assert "began iterating a DataLoader (2 workers) in the interval from 00:03" in (
        v.evidence[1]) and "(exit code 143)" in v.evidence[1]
    # a pause that ended (evaluation, a checkpoint) is no hang
    records[-1]["train"].pop("waiting_s")
    assert diagnose(records, META).cls != "hung"


def test_a_close_call_is_not_told_of_a_run_classed_hung_after() -> None:
    """NOTE [a close call]: the caveat names the class the workers' timing gave; a run that
    then hung for longer than it trained is classed hung, and the caveat is not kept."""
    records = piped(5, fetch=0.1, cpu=0.045) + [rec(i, batches=0) for i in range(5, 50)]
    v = diagnose(records, FUSE_META)
    assert v.cls == "storage-bound" and (v.caveat or "").startswith("a close call"), v.caveat
    for i, r in enumerate(records[35:]):
        r["train"]["waiting_s"] = 30.0 + i
    v = diagnose(records, FUSE_META)
    assert v.cls == "hung" and v.caveat is None, (v.cls, v.caveat)


# -- an autotuned run: judged since its settings last changed ------------------------------

def test_an_autotuned_run_is_judged_on_its_view_since_the_settings_changed() -> None:
    """The view of the intervals since autotune's last change, taken from the whole run's,
    is the view read from their records alone (their devices, storage entries and ranks
    too, indexed among them), and the verdict over it is the one over those records."""
    from iolens.analysis.columns import RunView

    before = run_of(20, wait=0.09, step=0.1, devices=SLOW_LOOP,
                    job_read=112 * 64 * 1024 * 0.99)
    after = [rec(i, wait=0.001, step=0.1, devices={"vdb": dev(util=3), "vda": dev()})
             for i in range(20, 50)]
    records = before + after
    for r in records:
        r["t"] = 1_800_000_000.0 + r["elapsed_s"]
        r["train"]["ranks"] = {"0": {"pid": 7, "batches": 10, "data_wait_s": 0.1,
                                     "step_s": 1.0}}
    for r in records[15:25]:
        r["storage"] = {"/mnt/data": {"waiting": 2.0, "rx_bytes_s": 5.0}}
    since = records[19]["t"]
    kept = [i for i, r in enumerate(records) if r["t"] > since]
    assert RunView.of(records).take(kept) == RunView.of(records[20:])
    v = diagnose(RunView.of(records), {**META, "autotune": {"since_t": since}})
    alone = diagnose(records[20:], META)
    assert v.evidence[-1] == ("the verdict is of the run from 00:21 on, where autotune's "
                              "settings last changed: the epochs before ran other settings")
    assert v.evidence[:-1] == alone.evidence and v.to_dict()["figures"] == alone.to_dict()[
        "figures"]
    assert (v.cls, v.data_wait_share) == (alone.cls, alone.data_wait_share)
    assert v.cls == "compute-bound" and v.data_wait_share == pytest.approx(0.01)
    whole = diagnose(records, META)
    assert whole.data_wait_share != v.data_wait_share
    assert not any("autotune" in e for e in whole.evidence)


# -- what a device served, over the time the batches took ---------------------------------

def test_a_device_serves_over_the_time_its_batches_took_not_their_intervals_alone() -> None:
    """Steps of 0.5 s read each 0.25 s: every other interval ends no batch and is not
    timed, yet its seconds and its reads went to the next batch (NOTE [the time a span's
    batches took]). The samples a second and the bytes a sample are the run's own, the
    untimed intervals before the first timed one and a pause with no batch left out."""
    from iolens.analysis.columns import RunColumns, RunView, Span
    from iolens.analysis.verdict.storage import sample_bytes, served_per_s

    reading = {"loop0": dev(util=99, r_s=32, rkb=16 * 64 * 2)}  # 16 samples of 64 KiB / 0.5 s
    records = [rec(i, batches=i % 2, wait=0.45, step=0.5, secs=0.25, devices=reading)
               for i in range(40)]
    for i in range(20, 30):  # a pause of 2.5 s: no batch, nothing read
        records[i] = rec(i, batches=0, secs=0.25, devices={"loop0": dev()})
    records.insert(0, rec(-1, batches=0, secs=0.25, devices={"loop0": dev(util=99, rkb=9e4)}))
    view = RunView.of(records)
    timed = view.run.timed()
    cols = RunColumns(view.run, view.devices, timed, view.run.take(timed), view.stores,
                      view.ranks)
    span = Span(cols, range(len(timed)))
    covered = span.covered()
    assert len(timed) == 15 and len(covered) == 29  # each timed one and the one before it,
    assert 0 not in covered and not covered & set(range(21, 31))  # but the first's, and
    # the pause's (but its last, which the batch after it took)
    assert served_per_s(span, 16, covered) == pytest.approx(15 * 16 / (29 * 0.25))
    assert sample_bytes(span, "loop0", 16, covered) == pytest.approx(
        29 * 0.25 * 16 * 64 * 2 * 1024 / (15 * 16))  # 62 KiB: the first batch's half lost
    # over the timed intervals alone: 64 samples a second where 32 were served, and 32 KiB
    assert span.total("batches") * 16 / span.total("secs") == pytest.approx(64.0)
    assert sample_bytes(span, "loop0", 16, span.within()) == pytest.approx(32 * 1024)


def test_a_storage_bound_fetch_reads_over_the_time_its_batches_took() -> None:
    """Steps of 0.5 s end a batch in every other 0.25 s interval, and the workers read in
    each: the evidence's bytes a sample are what they read over the time the window's
    batches took (the pack's basis: 64 KiB, less the first batch's half), not over its
    timed intervals alone (32 KiB)."""
    out = []
    for i in range(60):
        r = rec(i, batches=i % 2 * 2, wait=0.45, step=0.5, secs=0.25,
                devices={"loop0": dev(util=99, r_s=64, rkb=64 * 64, r_await=30, aqu=3.0)},
                worker_rchar=64 * 65536.0, job_read=64 * 65536.0)
        if i % 2:
            r["train"]["pipeline"] = {
                "batches": 2, "samples": 32, "processes": 2, "in_process": False,
                "fetch_s": 1.0, "fetch_cpu_s": 0.01, "collate_s": 0.002, "idle_s": 0.0,
                "files": 32, "handover": {"count": 2, "sum_s": 0.001}}
        out.append(r)
    v = diagnose(out, META)
    assert v.cls == "storage-bound"
    fetch = next(e for e in v.evidence if "to fetch a sample" in e)
    assert "took 31.25 ms to fetch a sample" in fetch
    assert "reading 62.9 KiB in 1.00 files per sample" in fetch  # 59 of 60 intervals' reads


@pytest.mark.parametrize(("code", "how"), [(1, "failed"), (130, "was stopped"),
                                           (0, None), (None, None)])
def test_a_job_that_failed_or_was_stopped_has_its_verdict_caveated(code: int | None,
                                                                    how: str | None) -> None:
    """A job that raised, or was stopped, after some batches: the verdict is of what it
    did until then, and says so (the text's note, the JSON's caveat)."""
    v = diagnose(run_of(5, wait=0.09), {**META, "exit_code": code})
    assert v.cls != "no-steps"
    if how is None:
        assert v.caveat is None
    else:
        assert v.caveat == (f"the job {how} (exit code {code}) after 50 batches: the "
                            "verdict is of what it did until then")
        assert f"note: {v.caveat}" in verdict_lines(v.to_dict())


def test_bytes_a_device_read_are_the_datasets_only_where_it_is_on_one() -> None:
    """A fetch that opens no file and reads nothing through read(): what a device read for
    it is its dataset where the dataset is on a block device or mapped, else code (a
    worker importing a module the page cache let go)."""
    from iolens.analysis.pipeline import Pipeline
    from iolens.analysis.verdict.storage import reads_dataset

    def pipe(**kw: Any) -> Pipeline:
        return Pipeline(batches=10, samples=160, fetch_s=0.8, fetch_cpu_s=0.01,
                        collate_s=0.01, idle_s=0.0, files=0, handovers=10, handover_s=0.01,
                        read_bytes=0.0, disk_bytes=160 * 2048.0, in_process=False,
                        processes=1, **kw)

    assert not reads_dataset(pipe(on_disk=False))  # 2 KiB a sample, no dataset on a disk
    assert reads_dataset(pipe(on_disk=True))
    assert reads_dataset(pipe(on_disk=False, mapped=True))
