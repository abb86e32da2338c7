"""Long runs read as time buckets: the same verdict and figures, extremes kept, in parallel."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis import longrun
from iolens.analysis.longrun import bucket_seconds, fold_records
from iolens.analysis.rundata import load_run
from iolens.analysis.verdict import diagnose
from iolens.recorder.summary import summarize
from iolens.report.build import build_report
from iolens.rundir.rollup import Bucket
from tests.test_verdict import META, SLOW_LOOP, dev, rec


def write(folder: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "records.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records) + tail)
    (folder / "meta.json").write_text(json.dumps({**META, "interval_s": 1.0}))
    return folder


def slow_run(n: int) -> list[dict[str, Any]]:
    out = [rec(i, wait=0.09, devices=copy.deepcopy(SLOW_LOOP), job_read=112 * 64 * 1024,
               worker_rchar=112 * 64 * 1024 * 1.1) for i in range(n)]
    out[123]["devices"]["loop0"]["util"] = 100.0  # one spike among 97s
    out[321]["devices"]["vda"]["r_await"] = 250.0
    return out


def test_a_bucket_keeps_sums_means_and_extremes() -> None:
    b = Bucket()
    for i in range(10):
        b.add(rec(i, wait=0.01 * (i + 1), step=0.1,
                  devices={"sda": dev(util=10.0 * i, r_s=100, rkb=6400, r_await=1.0 + i)}))
    r = b.record()
    assert r["merged"] == 10 and r["interval_s"] == 10.0 and r["elapsed_s"] == 10.0
    sda = r["devices"]["sda"]
    assert sda["util"] == pytest.approx(45.0)
    assert (sda["util_min"], sda["util_max"]) == (0.0, 90.0)
    assert sda["r_await"] == pytest.approx(5.5)  # weighted by reads, all equal here
    assert sda["r_await_max"] == 10.0
    tr = r["train"]
    assert tr["batches"] == 100 and tr["step_source"] == "dataloader"
    assert tr["data_wait"]["sum_s"] == pytest.approx(sum(0.01 * (i + 1) * 10 for i in range(10)))
    assert tr["data_wait"]["max_s"] == pytest.approx(0.1)
    assert tr["data_wait_share"] == pytest.approx(0.55 / 1.0)
    assert r["job"]["roles"]["worker"]["pids"] == 2


def test_buckets_merge_as_if_folded_at_once() -> None:
    records = slow_run(400)
    whole = Bucket()
    for r in records:
        whole.add(r)
    a, b = Bucket(), Bucket()
    for r in records[:170]:
        a.add(r)
    for r in records[170:]:
        b.add(r)
    b.merge(a)  # the later half first: order of merging does not matter
    assert close(b.record(), whole.record())


def test_a_long_run_reads_as_buckets_with_the_same_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = slow_run(2000)
    run = write(tmp_path / "run", records, tail="not json\n")
    detailed = load_run(str(run), max_records=None)
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 100)
    long = load_run(str(run), max_records=500)
    assert long.bucket_s == bucket_seconds(2000, 1.0) == 30.0  # 20 s, in whole 30 s slots
    assert len(long.records) == 67 and long.records[0]["merged"] == 29  # 1-29 s
    assert len(detailed.records) == 2000
    assert long.notes[0].startswith("a long run: its 2001 intervals are read as")
    assert "1 line(s) of records.jsonl were not valid records" in long.notes[1]
    v1, v2 = diagnose(detailed.records, detailed.meta), diagnose(long.records, long.meta)
    assert (v1.cls, v1.devices) == (v2.cls, v2.devices) == ("storage-bound", ["loop0"])
    assert v1.data_wait_share == pytest.approx(v2.data_wait_share or 0)
    r1, r2 = build_report(detailed), build_report(long)
    assert r1["training"]["batches"] == r2["training"]["batches"] == 20_000
    assert r2["devices"]["loop0"]["util_pct"] == pytest.approx(r1["devices"]["loop0"]["util_pct"])


def test_coarse_buckets_keep_the_spikes(tmp_path: Path) -> None:
    run = write(tmp_path / "run", slow_run(2000))
    folded = fold_records(str(run / "records.jsonl"), 100.0, jobs=1)
    assert len(folded.buckets) == 21  # 0-99, 100-199, ..., and the last record at 2000 s
    spike = folded.buckets[1].record()  # holds the interval that ended at 124 s
    assert spike["devices"]["loop0"]["util_max"] == 100.0
    assert spike["devices"]["loop0"]["util"] < 98
    assert folded.buckets[3].record()["devices"]["vda"]["r_await_max"] == 250.0


def test_parallel_folding_gives_the_same_buckets(tmp_path: Path) -> None:
    run = write(tmp_path / "run", slow_run(3000))
    path = str(run / "records.jsonl")
    one = fold_records(path, 60.0, jobs=1)
    two = fold_records(path, 60.0, jobs=2)
    assert one.lines == two.lines == 3000
    assert sorted(one.buckets) == sorted(two.buckets)
    for k in one.buckets:  # the same up to the order of floating-point additions
        assert close(one.buckets[k].record(), two.buckets[k].record()), k


def close(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def test_a_bucket_sums_the_stage_figures_and_the_verdict_keeps_them() -> None:
    """A long run's buckets carry train.pipeline summed, so its verdict still decides from
    inside the pipeline (here: idle workers whose wait is the hand-over)."""
    from tests.test_verdict import piped

    records = piped(200, fetch=0.001, cpu=0.001, idle=0.05, handover=0.045, wait=0.05)
    a, b = Bucket(), Bucket()
    for r in records[:120]:
        a.add(r)
    for r in records[120:]:
        b.add(r)
    b.merge(a)
    p = b.record()["train"]["pipeline"]
    assert (p["batches"], p["samples"], p["files"]) == (2000, 16000, 16000)
    assert p["handover"]["count"] == 2000
    assert p["handover"]["sum_s"] == pytest.approx(2000 * 0.045)
    assert p["idle_s"] == pytest.approx(2000 * 0.05) and p["in_process"] is False
    buckets = []
    for i in range(0, 200, 20):
        bk = Bucket()
        for r in records[i:i + 20]:
            bk.add(r)
        buckets.append(bk.record())
    assert diagnose(buckets, META).cls == diagnose(records, META).cls == "handover-bound"


def test_a_bucket_keeps_the_storage_figures() -> None:
    """A network store's bytes and a local server's reads, and a FUSE mount's queue, reach a
    long run's buckets as time-weighted means: the bytes per sample and the verdict's
    helper reads rest on them."""
    records = []
    for i in range(10):
        r = rec(i, secs=0.5 if i % 2 else 1.0)
        r["storage"] = {"127.0.0.1:80": {"connections": i % 3, "rx_bytes_s": 1e6 * i,
                                         "server_read_bytes_s": 2e6},
                        "/mnt/s3": {"waiting": 4.0}}
        records.append(r)
    a, b = Bucket(), Bucket()
    for r in records[:4]:
        a.add(r)
    for r in records[4:]:
        b.add(r)
    b.merge(a)
    st = b.record()["storage"]
    secs = sum(r["interval_s"] for r in records)
    rx = sum(1e6 * i * r["interval_s"] for i, r in enumerate(records))
    assert st["127.0.0.1:80"]["rx_bytes_s"] == pytest.approx(rx / secs)
    assert st["127.0.0.1:80"]["server_read_bytes_s"] == pytest.approx(2e6)
    assert st["/mnt/s3"] == {"waiting": pytest.approx(4.0)}


def test_a_long_run_that_ends_hung_keeps_its_hang_in_buckets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last bucket carries the last interval's wait for a batch and where each process
    waited: a week-long run that hung at its end is read as one."""
    records = slow_run(2000)
    waiting = [{"pid": 11, "role": "worker", "state": "S", "wchan": "wait_for_partner"}]
    for i, r in enumerate(records[-300:]):
        r["train"]["batches"] = 0
        r["train"]["waiting_s"], r["train"]["waiting"] = 31.0 + i, waiting
    run = write(tmp_path / "run", records)
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 100)
    long = load_run(str(run), max_records=500)
    assert long.bucket_s == 30.0 and long.records[-1]["train"]["waiting_s"] == 330.0
    for recs in (load_run(str(run), max_records=None).records, long.records):
        (hang,) = [f for f in diagnose(recs, long.meta).findings if f.cls == "hang"]
        assert hang.evidence[0].startswith("no batch came in the last 330 s recorded")
        assert "worker 11 (S, at wait_for_partner)" in hang.evidence[0]


# -- rollups (NOTE [rollups] in iolens/rundir/rollup.py) ----------------------------------

def varied_run(n: int) -> list[dict[str, Any]]:
    """slow_run's intervals with every part a bucket folds: GPUs, storage, ranks, the stages,
    memory, pauses and epochs, changing over time."""
    out = slow_run(n)
    for i, r in enumerate(out):
        tr = r["train"]
        tr["pipeline"] = {"batches": 10, "samples": 160, "fetch_s": 0.5 + i % 7 / 10,
                          "fetch_cpu_s": 0.1, "collate_s": 0.01, "idle_s": 0.2, "files": 160,
                          "in_process": False, "processes": 2 + i % 3,
                          "handover": {"count": 10, "sum_s": 0.004}}
        tr["ranks"] = {"0": {"pid": 7, "batches": 10, "data_wait_s": 0.9, "step_s": 1.0},
                       "1": {"pid": 8, "batches": 10, "data_wait_s": 0.5 + i % 5 / 10,
                             "step_s": 1.0}}
        tr["world_size"] = 2
        if i % 97 == 0:
            tr["epochs_started"], tr["num_workers"] = 1, 2
            tr["epoch_start_wait"] = {"count": 1, "sum_s": 2.0, "max_s": 2.0, "p50_s": 2.0,
                                      "p95_s": 2.0}
        if i % 61 == 0:
            tr["pause_wait"] = {"count": 1, "sum_s": 0.1, "max_s": 0.1, "p50_s": 0.1,
                                "p95_s": 0.1}
            tr["pause_step"] = {"count": 1, "sum_s": 3.0, "max_s": 3.0, "p50_s": 3.0,
                                "p95_s": 3.0}
        r["gpu"] = [{"index": 0, "util_pct": float(i % 100), "mem_util_pct": 20.0,
                     "mem_used_bytes": 1 << 30 + i % 3, "mem_total_bytes": 80 << 30}]
        r["storage"] = {"fuse:/mnt/data": {"read_bytes_s": 1e6 + i, "ops_s": 50.0}}
        r["mem"] = {"available_bytes": (64 << 30) - i, "dirty_bytes": i}
        if i >= 150:  # the processes in state D by role, kept from then on
            r["job"]["roles"]["worker"]["blocked"] = i % 3
            r["job"]["roles"]["main"]["blocked"] = 0
    return out


def recorded(folder: Path, records: list[dict[str, Any]], *, close: bool = True) -> Path:
    """The run as the recorder writes it: records and rollups through RunDir."""
    from iolens.rundir import RunDir

    run = RunDir(str(folder))
    for r in records:
        assert run.append(r)
    if close:
        run.close()
    (folder / "meta.json").write_text(json.dumps({**META, "interval_s": 1.0}))
    return folder


def without_rollups(run: Path, to: Path) -> Path:
    to.mkdir()
    for name in ("records.jsonl", "meta.json"):
        (to / name).write_bytes((run / name).read_bytes())
    return to


def same_run(a: Any, b: Any) -> None:
    assert a.bucket_s == b.bucket_s and a.notes == b.notes
    assert len(a.records) == len(b.records)
    for x, y in zip(a.records, b.records, strict=True):
        assert close(x, y), (x, y)


def read_from(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of records.jsonl from which each later fold of its records begins."""
    starts: list[int] = []
    fold = longrun.fold_records

    def spy(path: str, bucket_s: float, jobs: int | None = None, *, start: int = 0) -> Any:
        starts.append(start)
        return fold(path, bucket_s, jobs, start=start)

    monkeypatch.setattr(longrun, "fold_records", spy)
    return starts


def test_the_recorders_rollups_give_the_buckets_of_its_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record through RunDir: rollups of each slot length beside them, covering the
    whole file; a long run read from them is the one read from its records."""
    from iolens.rundir.rollup import ROLLUP_LEVELS, read_rollups

    run = recorded(tmp_path / "run", varied_run(2000))
    size = (run / "records.jsonl").stat().st_size
    for slot_s in ROLLUP_LEVELS:
        rolled = read_rollups(str(run), str(run / "records.jsonl"), slot_s)
        assert rolled is not None and (rolled.records, rolled.to) == (2000, size)
        assert len(rolled.slots) == 2000 // slot_s + 1  # 1-9 s, 10-19 s, ..., 2000 s
    rolled = read_rollups(str(run), str(run / "records.jsonl"), 30.0)
    assert rolled is not None
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)  # natural 34 s: 60 s, 30 s slots
    starts = read_from(monkeypatch)
    long = load_run(str(run), max_records=500)
    assert starts == [rolled.to]  # no record read: the rollups hold them all
    assert long.bucket_s == 60.0 and len(long.records) == 34
    plain = load_run(str(without_rollups(run, tmp_path / "plain")), max_records=500)
    same_run(long, plain)
    r = long.records[10]  # 600-659 s
    assert r["merged"] == 60 and r["train"]["ranks"]["1"]["batches"] == 600
    gpu = r["gpu"][0]  # intervals 599-658: 99%, then 0-58%
    assert (gpu["util_pct_min"], gpu["util_pct_max"]) == (0.0, 99.0) and "pipeline" in r["train"]


def test_a_long_run_ends_reading_its_rollups_not_every_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [a long run's end]: the summary and the verdict at the end of `iolens run` read
    a long run as its report does, from the rollups, and the verdict is the report's; a
    run with records the run directory could not take reads them all, one by one."""
    from iolens.job import run as job_run

    run = recorded(tmp_path / "run", slow_run(2000))
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)
    monkeypatch.setattr(job_run, "LONG_RUN_RECORDS", 500)
    starts = read_from(monkeypatch)
    records, view = job_run._finished_records(str(run), [])
    assert starts == [(run / "records.jsonl").stat().st_size]  # no record read one by one
    assert view is not None and len(records) == 34 and records[10]["merged"] == 60
    assert summarize(records)["batches"] == 20_000
    report = build_report(load_run(str(run), max_records=500))
    assert diagnose(view, {}).to_dict()["class"] == report["verdict"]["class"]
    records, view = job_run._finished_records(str(run), [rec(2000)])  # one not saved
    assert view is None and len(records) == 2001 and "merged" not in records[0]
    monkeypatch.setattr(job_run, "LONG_RUN_RECORDS", 50_000)  # a run of 2000: as it was
    records, view = job_run._finished_records(str(run), [])
    assert view is None and len(records) == 2000


def test_a_bucket_read_back_from_its_rollup_line_is_the_bucket_written(
        tmp_path: Path) -> None:
    """Bucket.from_state sets each field itself (NOTE [hot path]): every field of every
    bucket of a varied run, and each bucket's record, are the same after the round trip
    through a rollup line's JSON. A field added to Bucket and not read back fails here."""
    from dataclasses import fields

    from iolens.rundir.rollup import ROLLUP_LEVELS, read_rollups

    run = recorded(tmp_path / "run", varied_run(700))
    for slot_s in ROLLUP_LEVELS[:2]:
        buckets = fold_records(str(run / "records.jsonl"), slot_s, jobs=1).buckets
        rolled = read_rollups(str(run), str(run / "records.jsonl"), slot_s)
        assert rolled is not None and len(rolled.slots) == len(buckets)
        for slot, back in rolled.slots:
            written = buckets[slot]
            for f in fields(Bucket):
                a, b = getattr(written, f.name), getattr(back, f.name)
                if f.name.endswith("_ext"):
                    a = {k: (e.lo, e.hi) for k, e in a.items()}
                    b = {k: (e.lo, e.hi) for k, e in b.items()}
                assert a == b, f.name
            assert back.record() == written.record()
        assert any(b.gpu and b.store and b.ranks and b.pipe[0] for _, b in rolled.slots)


def test_a_slot_read_as_its_record_is_its_bucket_as_a_record(tmp_path: Path) -> None:
    """NOTE [a slot's record]: each rollup line holds its bucket's record beside its state;
    read as records, every line of every slot length gives the record its state makes,
    and the state's JSON cut out of it makes that record again."""
    from iolens.rundir.rollup import ROLLUP_LEVELS, loads, read_rollups

    run = recorded(tmp_path / "run", varied_run(700))
    for slot_s in ROLLUP_LEVELS:
        states = read_rollups(str(run), str(run / "records.jsonl"), slot_s)
        made = read_rollups(str(run), str(run / "records.jsonl"), slot_s, made=True)
        assert states is not None and made is not None and not made.slots
        assert (made.to, made.records, made.seq) == (states.to, states.records, states.seq)
        assert [slot for slot, _, _ in made.made] == [slot for slot, _ in states.slots]
        for (_, got, state), (_, b) in zip(made.made, states.slots, strict=True):
            assert got == b.record()
            assert Bucket.from_state(loads()(state)).record() == got


def test_only_the_first_slots_lines_hold_their_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [a slot's record]: the lines past MADE_SLOTS hold the state alone, and read as
    records they are made records from it; a report's buckets are one slot each only
    where the run spans at most TARGET_BUCKETS slots, which the records cover."""
    from iolens.rundir import rollup as rollup_mod

    assert longrun.TARGET_BUCKETS <= rollup_mod.MADE_SLOTS
    monkeypatch.setattr(rollup_mod, "MADE_SLOTS", 20)
    run = recorded(tmp_path / "run", varied_run(700))
    lines = (run / "rollups-10s.jsonl").read_bytes().splitlines()
    assert [b',"record":{' in line for line in lines] == [k < 20 for k in range(len(lines))]
    states = rollup_mod.read_rollups(str(run), str(run / "records.jsonl"), 10.0)
    made = rollup_mod.read_rollups(str(run), str(run / "records.jsonl"), 10.0, made=True)
    assert states is not None and made is not None and len(made.made) == len(lines) == 71
    assert [rec for _, rec, _ in made.made] == [b.record() for _, b in states.slots]


def test_records_past_the_rollups_in_their_last_slot_are_merged_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run recorded again into the same directory (the recorder appends, and writes no
    rollups for what it appends): its first records past the rollups fall in the last slot
    they hold, which is then merged from its state; every other bucket is its record."""
    from iolens.rundir import RunDir
    from iolens.rundir import rollup as rollup_mod

    records = varied_run(2000)
    run = recorded(tmp_path / "run", records[:1990])  # the last line: 1980-1989 s
    again = RunDir(str(run))
    for r in records[1990:]:
        assert again.append(r)
    again.close()
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 67)  # natural 30 s: one 30 s slot each
    states = 0
    from_state = rollup_mod.Bucket.from_state

    def counted(cls: type[Bucket], d: Any) -> Bucket:
        nonlocal states
        states += 1
        return from_state(d)

    monkeypatch.setattr(rollup_mod.Bucket, "from_state", classmethod(counted))
    long = load_run(str(run), max_records=500)
    assert long.bucket_s == 30.0 and len(long.records) == 67 and states == 1
    assert long.records[-1]["merged"] == 21  # 1980-2000 s: 11 from the rollups, 10 after
    same_run(long, load_run(str(without_rollups(run, tmp_path / "plain")), max_records=500))


def test_a_slot_that_comes_again_is_merged_from_its_states(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rollups folded from a directory recorded into twice, its time begun anew (as the
    report rebuilds them): each slot has two lines, and a bucket of one slot is both, merged
    from their states, not the later line's record alone."""
    records = varied_run(2000)
    again = copy.deepcopy(records)
    for r in again:
        r["seq"] += 2000
    run = recorded(tmp_path / "run", records + again)
    lines = (run / "rollups-30s.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 * 67
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 67)  # natural 30 s: one 30 s slot each
    long = load_run(str(run), max_records=500)
    assert long.bucket_s == 30.0 and len(long.records) == 67
    assert long.records[10]["merged"] == 60 and long.records[0]["merged"] == 2 * 29
    same_run(long, load_run(str(without_rollups(run, tmp_path / "plain")), max_records=500))


def test_a_rollup_line_whose_record_or_state_is_not_a_buckets_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line edited and its CRC made anew (no damage on the way makes one): a record
    without the figures every report indexes ends what is read of the rollups there, and
    a state that is not a bucket's, where it must be merged, has the run read from its
    records; either way the report is the one its records make."""
    import zlib

    from iolens.rundir.rollup import read_rollups

    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 67)
    records = varied_run(2000)

    def edited(name: str, k: int, old: bytes, new: bytes) -> Path:
        run = recorded(tmp_path / name, records)
        path = run / "rollups-30s.jsonl"
        lines = path.read_bytes().splitlines(keepends=True)
        body = lines[k][:lines[k].rindex(b',"check":')]
        assert old in body
        body = body.replace(old, new, 1)
        lines[k] = body + b',"check":%d}\n' % zlib.crc32(body)
        path.write_bytes(b"".join(lines))
        return run

    plain = load_run(str(without_rollups(recorded(tmp_path / "run", records),
                                         tmp_path / "plain")), max_records=500)
    run = edited("record", 20, b'"elapsed_s":', b'"elapsed":')  # (the record's: the state
    for made in (True, False):                                  # has none)
        rolled = read_rollups(str(run), str(run / "records.jsonl"), 30.0, made=made)
        assert rolled is not None and rolled.records == (599 if made else 2000), made
    same_run(load_run(str(run), max_records=500), plain)
    run = edited("state", 20, b'"bucket":{"n":30,', b'"bucket":{"n":-3,')  # (its length kept)
    rolled = read_rollups(str(run), str(run / "records.jsonl"), 30.0, made=True)
    assert rolled is not None and rolled.records == 2000  # (its record is a bucket's)
    starts = read_from(monkeypatch)
    states = rolled.made[20][2]
    rolled.made.insert(21, (20, rolled.made[20][1], states))  # the slot again: merged
    folded = longrun.fold_run(str(run / "records.jsonl"), 30.0, rolled=rolled)
    assert starts == [rolled.to, 0] and sum(b.n for b in folded.buckets.values()) == 2000
    same_run(load_run(str(run), max_records=500), plain)


def test_a_buckets_processes_in_state_d_are_its_records_by_role(tmp_path: Path) -> None:
    """NOTE [blocked by role]: a bucket sums its intervals' process samples and those in
    state D, by role, over the records that kept them only (the first 150 did not), so
    that a long run's fetching processes read D as the records say."""
    from iolens.analysis.columns.stage import StageColumns
    from iolens.rundir.rollup import ROLLUP_LEVELS

    records = varied_run(400)
    run = recorded(tmp_path / "run", records)
    want = StageColumns.of(records)
    assert sum(want.worker_samples) == 250 * 2
    assert sum(want.worker_blocked) == sum(i % 3 for i in range(150, 400))
    for slot_s in ROLLUP_LEVELS[:2]:
        buckets = fold_records(str(run / "records.jsonl"), slot_s, jobs=1).buckets
        got = StageColumns.of([b.record() for b in buckets.values()])
        for name in ("worker_samples", "worker_blocked", "main_samples", "main_blocked"):
            assert sum(getattr(got, name)) == sum(getattr(want, name)), name
        first = next(iter(buckets.values())).record()["job"]["roles"]["worker"]
        assert "blocked" not in first  # none of its intervals kept it: not a 0


@pytest.mark.parametrize("target", [60, 67], ids=["two-slots-a-bucket", "one-slot-a-bucket"])
def test_rollups_that_do_not_match_the_records_are_used_as_far_as_they_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: int) -> None:
    """A run still recording, a damaged rollup line, the recorder's rollups stopped by a
    failed write, records.jsonl cut short or its last line changed: each long run reads as
    its records say, the rollups used up to where they match them and no further, whether
    its buckets are merged from the slots' states (60 s buckets of 30 s slots) or read as
    the slots' records (30 s buckets: NOTE [a slot's record])."""
    from iolens.rundir.rollup import read_rollups

    monkeypatch.setattr(longrun, "TARGET_BUCKETS", target)
    records = varied_run(2000)
    k = 0

    def check(run: Path, used: int | None) -> None:
        nonlocal k
        k += 1
        rolled = read_rollups(str(run), str(run / "records.jsonl"), 30.0, made=target == 67)
        assert (rolled.records if rolled else None) == used, run.name
        plain = without_rollups(run, tmp_path / f"plain{k}")
        same_run(load_run(str(run), max_records=500), load_run(str(plain), max_records=500))

    live = recorded(tmp_path / "live", records, close=False)  # the last slot not written
    check(live, 1979)  # the last slot, 1980-2000 s, is not written yet
    damaged = recorded(tmp_path / "damaged", records)
    lines = (damaged / "rollups-30s.jsonl").read_bytes().splitlines(keepends=True)
    lines[50] = lines[50].replace(b'"n":30', b'"n":"30"')
    (damaged / "rollups-30s.jsonl").write_bytes(b"".join(lines))
    check(damaged, 29 + 49 * 30)  # 1-29 s, then the 49 slots of 30 before the 51st line
    from iolens.rundir import RunDir

    (tmp_path / "stopped").mkdir()
    rd = RunDir(str(tmp_path / "stopped"))
    for i, r in enumerate(records):
        if i == 1000:
            assert rd._rsize
            for fd in rd._rsize:
                os.close(fd)  # the next rollup write fails (at 1010 s): the records go on
        assert rd.append(r)
    rd.close()
    (tmp_path / "stopped" / "meta.json").write_text(json.dumps({**META, "interval_s": 1.0}))
    check(tmp_path / "stopped", 989)  # the 30 s slots before 990 s
    cut = recorded(tmp_path / "cut", records)
    data = (cut / "records.jsonl").read_bytes()
    (cut / "records.jsonl").write_bytes(data[:len(data) // 2])  # (a torn last line)
    rolled = read_rollups(str(cut), str(cut / "records.jsonl"), 30.0)
    assert rolled is not None and 900 < rolled.records < 1000
    check(cut, rolled.records)
    changed = recorded(tmp_path / "changed", records)
    data = (changed / "records.jsonl").read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    (changed / "records.jsonl").write_bytes(
        data[:last] + data[last:].replace(b'"util":97}', b'"util":12}', 1))
    edited = (changed / "records.jsonl").read_bytes()
    assert len(edited) == len(data) and edited != data
    check(changed, None)


def test_iolens_run_leaves_rollups_that_hold_the_whole_run(tmp_path: Path) -> None:
    """As a user runs it: the recorder's rollups end where records.jsonl ends."""
    from iolens.rundir.rollup import read_rollups

    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "iolens", "run", "--interval", "0.2", "--out",
                    str(run), "--no-live", "--", sys.executable, "-c",
                    "import time; time.sleep(2.5)"],
                   check=True, timeout=120, capture_output=True)
    lines = (run / "records.jsonl").read_bytes().splitlines()
    rolled = read_rollups(str(run), str(run / "records.jsonl"), 10.0)
    assert rolled is not None and len(lines) >= 10
    assert (rolled.records, rolled.to) == (len(lines), (run / "records.jsonl").stat().st_size)


def test_long_buckets_are_whole_rollup_slots_and_read_few_lines() -> None:
    """A bucket is whole slots of the longest rollup level it can be, so that a report
    reads at most 2 rollup lines a bucket, about 16,700 in all (NOTE [rollups])."""
    from iolens.analysis.longrun import rollup_slot

    day = 86400.0
    for span, interval, bucket, slot in [
            (7 * day, 1.0, 100.0, 100.0),     # natural 61 s: 6,048 buckets, as many lines
            (50_400, 1.0, 10.0, 10.0),        # 14 hours: natural 6 s
            (3 * day, 1.0, 30.0, 30.0),       # natural 26 s
            (5 * day, 1.0, 60.0, 30.0),       # natural 44 s: 7,200 buckets, 14,400 lines
            (90 * day, 1.0, 1000.0, 1000.0),  # natural 778 s
            (40_000, 1.0, 4.0, 0.0),          # natural 4 s: read from the records
            (7 * day, 0.7, 60.9, 0.0)]:       # 0.7 s divides no slot: the records
        assert bucket_seconds(span, interval) == pytest.approx(bucket), (span, interval)
        assert rollup_slot(bucket_seconds(span, interval)) == slot, (span, interval)
        if slot:
            assert bucket / slot <= 2 and span / slot <= 1.67 * longrun.TARGET_BUCKETS


def test_damaged_rollups_never_fail_the_report(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes changed anywhere in a rollup line (a bad disk, a hand edit): the rollups are
    used up to the line before it at most, and the run reads as its records say."""
    import random

    from iolens.rundir.rollup import read_rollups

    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)
    run = recorded(tmp_path / "run", varied_run(2000))
    plain = load_run(str(without_rollups(run, tmp_path / "plain")), max_records=500)
    good = (run / "rollups-30s.jsonl").read_bytes()
    lines = good.splitlines(keepends=True)
    rng = random.Random(7)
    for _ in range(40):
        k = rng.randrange(len(lines))
        line = bytearray(lines[k])
        for _ in range(rng.randint(1, 4)):
            line[rng.randrange(len(line) - 1)] = rng.choice(b'0123456789.,:-"{}[]ntufe ')
        (run / "rollups-30s.jsonl").write_bytes(b"".join([*lines[:k], bytes(line),
                                                          *lines[k + 1:]]))
        rolled = read_rollups(str(run), str(run / "records.jsonl"), 30.0)
        assert rolled is None or len(rolled.slots) <= k or bytes(line) == lines[k]
        same_run(load_run(str(run), max_records=500), plain)


# -- rollups rebuilt (NOTE [rollups rebuilt] in iolens/analysis/rebuild.py) --------------

def ended(run: Path) -> Path:
    """The run marked finished in its meta.json, as `iolens run` leaves it."""
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "end": "2026-12-04T18:00:00+00:00"}))
    return run


def test_rollups_rebuilt_from_the_records_are_the_recorders_byte_for_byte(
        tmp_path: Path) -> None:
    """Every slot length, folded in 1 to 4 processes whose byte ranges end where every
    slot length's slot changes (each 3,000 s): the files the recorder wrote, to the byte."""
    from iolens.analysis.rebuild import rebuild_rollups
    from iolens.rundir.rollup import ROLLUP_LEVELS, read_rollups, rollups_file

    run = recorded(tmp_path / "run", varied_run(7000))
    records = str(run / "records.jsonl")
    for jobs in (1, 2, 3, 4):
        rebuilt = rebuild_rollups(records, 100.0, jobs)
        assert rebuilt is not None
        for slot_s in ROLLUP_LEVELS:
            assert b"".join(rebuilt.lines[slot_s]) == (run / rollups_file(slot_s)).read_bytes()
        rolled = read_rollups(str(run), records, 100.0)
        assert rolled is not None
        assert (rebuilt.rolled.records, rebuilt.rolled.to) == (rolled.records, rolled.to)
        assert [s for s, _ in rebuilt.rolled.slots] == [s for s, _ in rolled.slots]
        assert [b.state() for _, b in rebuilt.rolled.slots] == [
            b.state() for _, b in rolled.slots]


def test_a_finished_long_run_without_rollups_is_read_through_rollups_rebuilt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read with rebuild=True: the same run as from its records; once the rollups are
    written, the next read folds no record; a run not finished is not rebuilt."""
    from iolens.rundir import replace_rollups

    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)
    run = recorded(tmp_path / "run", varied_run(2000))
    plain = load_run(str(without_rollups(run, tmp_path / "plain")), max_records=500)
    assert load_run(str(tmp_path / "plain"), max_records=500, rebuild=True).rollups is None
    bare = ended(without_rollups(run, tmp_path / "bare"))
    first = load_run(str(bare), max_records=500, rebuild=True)
    same_run(first, plain)
    assert first.rollups is not None
    replace_rollups(str(bare), first.rollups)
    assert sorted(p.name for p in bare.iterdir()) == sorted(p.name for p in run.iterdir())
    starts = read_from(monkeypatch)
    again = load_run(str(bare), max_records=500, rebuild=True)
    assert again.rollups is None and starts == [(bare / "records.jsonl").stat().st_size]
    same_run(again, plain)
    monkeypatch.undo()
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)
    # rollups that hold only the run's start (their writes failed): rebuilt whole
    full = (run / "rollups-30s.jsonl").read_bytes()
    lines = full.splitlines(keepends=True)
    (bare / "rollups-30s.jsonl").write_bytes(b"".join(lines[:len(lines) // 3]))
    short = load_run(str(bare), max_records=500, rebuild=True)
    assert short.rollups is not None and b"".join(short.rollups[30.0]) == full
    same_run(short, plain)
    # ... but not where they end at a line that is not a record: they would end there again
    damaged = ended(without_rollups(run, tmp_path / "damaged"))
    data = (run / "records.jsonl").read_bytes()
    cut = json.loads(lines[20])["to"]  # where the 21st 30 s slot ends
    (damaged / "records.jsonl").write_bytes(data[:cut] + b"{not json}\n" + data[cut:])
    for slot_s in (10, 30, 100, 300, 1000):
        kept = [ln for ln in (run / f"rollups-{slot_s}s.jsonl").read_bytes().splitlines(
            keepends=True) if json.loads(ln)["to"] <= cut]
        (damaged / f"rollups-{slot_s}s.jsonl").write_bytes(b"".join(kept))
    from iolens.analysis import rebuild

    def refused(*_: Any) -> None:
        raise AssertionError("rebuilt where the rollups end at a line that is not a record")

    monkeypatch.setattr(rebuild, "rebuild_rollups", refused)
    assert load_run(str(damaged), max_records=500, rebuild=True).rollups is None


def test_rollups_rebuilt_stop_at_the_first_line_that_is_not_a_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged line: the rollups end before it, the records after it are read as those
    past a run's rollups, and the run (its note of the line skipped too) is the one read
    from its records."""
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)
    records = varied_run(2000)
    lines = [json.dumps(r) + "\n" for r in records]
    lines.insert(1234, '{"schema": 1, "seq": "torn\n')
    for name in ("damaged", "plain"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "records.jsonl").write_text("".join(lines))
        (tmp_path / name / "meta.json").write_text(json.dumps({**META, "interval_s": 1.0}))
    ended(tmp_path / "damaged")
    got = load_run(str(tmp_path / "damaged"), max_records=500, rebuild=True)
    assert got.rollups is not None
    last = json.loads(got.rollups[10.0][-1])
    assert last["to"] == len("".join(lines[:1234]).encode())
    assert any("not JSON" in n for n in got.notes), got.notes
    same_run(got, load_run(str(tmp_path / "plain"), max_records=500))


def test_iolens_report_writes_the_rollups_a_finished_long_run_lacks(tmp_path: Path) -> None:
    """As a user runs it: a long run recorded without rollups (60,000 intervals) reports,
    writes them and says so; the next report reads them and says the same. A run directory
    that cannot take them still gets its report."""
    run = ended(write(tmp_path / "run", varied_run(60_000)))

    def report(*extra: str) -> tuple[str, str]:
        out = subprocess.run([sys.executable, "-m", "iolens", "report", str(run), "--format",
                              "json", *extra], capture_output=True, text=True, timeout=300,
                             check=True)
        return out.stdout, out.stderr

    blocked = run / "rollups-10s.jsonl"
    blocked.mkdir()  # (a directory where a file goes: root writes anywhere else)
    kept, said = report()
    assert "could not be written" in said and not (run / "rollups-30s.jsonl").exists()
    blocked.rmdir()
    first, said = report()
    assert "its rollups are missing: folding its records (about " in said, said
    assert "wrote the rollups of" in said, said
    assert first == kept
    second, said = report()
    assert second == first and "rollups" not in said, said
    from iolens.rundir.rollup import ROLLUP_VERSION

    now, older = b'{"rollup":%d,' % ROLLUP_VERSION, b'{"rollup":%d,' % (ROLLUP_VERSION - 1)
    for path in run.glob("rollups-*.jsonl"):  # as an older iolens wrote them, whole
        lines = []
        for line in path.read_bytes().splitlines():
            assert line.startswith(now), line[:40]
            body = line[:line.rindex(b',"check":')].replace(now, older)
            lines.append(body + b',"check":%d}\n' % zlib.crc32(body))
        path.write_bytes(b"".join(lines))
    third, said = report()
    assert "its rollups are of another iolens or damaged: folding its records" in said, said
    assert third == first
    run_info = json.loads(third)["run"]
    assert run_info["intervals"] == 60_000 and run_info["buckets"] * run_info["bucket_s"] >= 60_000


def test_iolens_compare_writes_the_rollups_two_finished_long_runs_lack(tmp_path: Path) -> None:
    """As a user runs it: `iolens compare` of two long runs recorded without rollups
    rebuilds and writes each one's, and says so; the next compare reads them, silently, to
    the same result."""
    base = ended(write(tmp_path / "base", varied_run(60_000)))
    new = tmp_path / "new"
    shutil.copytree(base, new)

    def compare() -> tuple[str, str]:
        out = subprocess.run([sys.executable, "-m", "iolens", "compare", str(base), str(new),
                              "--format", "json"], capture_output=True, text=True,
                             timeout=300, check=True)
        return out.stdout, out.stderr

    first, said = compare()
    for run in (base, new):
        assert f"iolens compare: wrote the rollups of {run} (" in said, said
        assert (run / "rollups-10s.jsonl").exists() and (run / "rollups-1000s.jsonl").exists()
    second, said = compare()
    assert second == first and "rollups" not in said, said
    assert json.loads(first)["metrics"], first


def test_a_rebuild_that_fails_leaves_the_report_read_from_the_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from iolens.analysis import rebuild

    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)
    run = recorded(tmp_path / "run", varied_run(2000))
    plain = load_run(str(without_rollups(run, tmp_path / "plain")), max_records=500)

    def broken(*_: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(rebuild, "rebuild_rollups", broken)
    got = load_run(str(ended(without_rollups(run, tmp_path / "bare"))), max_records=500,
                   rebuild=True)
    assert got.rollups is None
    assert got.notes[-1].startswith("its rollups could not be rebuilt ("), got.notes
    got.notes.pop()
    same_run(got, plain)


@pytest.mark.parametrize("copied", [40, 1500, None])
def test_a_line_the_rollups_hold_written_again_after_them_is_read_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copied: int | None) -> None:
    """A record's line copied past the rollups' end, far from its first (NOTE [duplicates
    across ranges]): the run reads as from its records alone, the copy skipped once. (Only
    the line just before the rollups' end was checked: a copy of an earlier one was folded
    twice.) Without a copy, the rollups are read and only the records after them."""
    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)
    records = varied_run(2000)
    run = recorded(tmp_path / "run", records[:1800])
    with open(run / "records.jsonl", "a") as fh:
        for r in records[1800:]:
            fh.write(json.dumps(r) + "\n")
        if copied is not None:  # (the last line: the run's length is still its latest's)
            fh.write(json.dumps(records[copied]) + "\n")
    assert longrun.estimate_records(str(run / "records.jsonl"))[1] == records[-1]["elapsed_s"]
    plain = load_run(str(without_rollups(run, tmp_path / "plain")), max_records=500)
    assert any("duplicate" in n for n in plain.notes) is (copied is not None), plain.notes
    starts = read_from(monkeypatch)
    got = load_run(str(run), max_records=500)
    same_run(got, plain)
    assert starts[0] > 0, "the rollups were not read"
    assert starts[1:] == ([0] if copied is not None else []), starts


def test_rollups_rebuilt_from_damaged_records_read_as_the_records_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines torn, blank, written twice, not JSON or with a bad figure, anywhere: the run
    read through the rollups rebuilt (up to the first) and the records after them is the
    run read from its records, notes and all. (A line written twice right after the
    rollups' end was folded twice: the records after them did not know its first.)"""
    import random

    monkeypatch.setattr(longrun, "TARGET_BUCKETS", 60)
    base = [json.dumps(r) + "\n" for r in varied_run(2000)]
    rng = random.Random(3)
    for trial in range(12):
        lines = list(base)
        for _ in range(rng.randint(1, 3)):
            k = rng.randrange(len(lines))
            kind = rng.choice(["torn", "blank", "twice", "not JSON", "bad figure"])
            if kind == "torn":
                lines[k] = lines[k][: len(lines[k]) // 2] + "\n"
            elif kind == "blank":
                lines.insert(k, "\n")
            elif kind == "twice":
                lines.insert(k, lines[k])
            elif kind == "not JSON":
                lines.insert(k, "hello world\n")
            else:
                r = json.loads(lines[k])
                r["devices"]["vda"]["util"] = -1.0
                lines[k] = json.dumps(r) + "\n"
        if rng.random() < 0.3:
            lines[-1] = lines[-1].rstrip("\n")
        runs = []
        for name in ("ended", "recording"):
            d = write(tmp_path / f"{trial}-{name}", [])
            (d / "records.jsonl").write_text("".join(lines))
            runs.append(ended(d) if name == "ended" else d)
        got = load_run(str(runs[0]), max_records=500, rebuild=True)
        assert got.rollups is not None, trial
        same_run(got, load_run(str(runs[1]), max_records=500))


@pytest.mark.parametrize("far", [True, False])
def test_a_line_written_again_far_from_its_first_is_read_once_however_many_processes(
        tmp_path: Path, far: bool) -> None:
    """A record's line copied into another process's byte range (NOTE [duplicates across
    ranges]): the fold in 2 and 3 processes, and the rollups rebuilt in as many, read it
    once, as the fold in one process does. Without the copy, the ranges' seqs lie apart and
    the fold stays parallel."""
    from iolens.analysis import rebuild

    lines = [json.dumps(r) + "\n" for r in varied_run(9000)]  # (three 3000 s spans to rebuild)
    if far:
        lines.insert(8000, lines[40])  # (in the last range of 2 or 3)
    run = write(tmp_path / "run", [])
    path = run / "records.jsonl"
    path.write_text("".join(lines))
    one = fold_records(str(path), 30.0, jobs=1)
    assert one.skipped.counts == ({"duplicate": 1} if far else {}), one.skipped.counts
    for jobs in (2, 3):
        got = fold_records(str(path), 30.0, jobs=jobs)
        assert got.skipped.counts == one.skipped.counts
        assert got.lines == one.lines
        # (counts: a bucket across two ranges is merged, its sums added in another order)
        assert {k: (b.n, b.batches) for k, b in got.buckets.items()} == {
            k: (b.n, b.batches) for k, b in one.buckets.items()}
    apart = [longrun._fold_range(str(path), a, z, 30.0).seqs for a, z in
             ((0, path.stat().st_size // 2), (path.stat().st_size // 2, path.stat().st_size))]
    assert longrun.apart(apart) is not far
    serial = rebuild.rebuild_rollups(str(path), 30.0, jobs=1)
    assert serial is not None
    for jobs in (2, 3):
        got_r = rebuild.rebuild_rollups(str(path), 30.0, jobs=jobs)
        assert got_r is not None and got_r.lines == serial.lines, jobs

