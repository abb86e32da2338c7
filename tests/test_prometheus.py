"""The Prometheus endpoint: the collector on fixture /proc, `iolens run --prometheus` and
`iolens exporter` scraped for real, a real Prometheus server and node_exporter beside it,
and the Grafana dashboard's queries against the names really served."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis.verdict import NO_STEPS, PRIMARY_CLASSES
from iolens.recorder.sampler import Recorder
from iolens.recorder.totals import BUCKETS_S, ExportState, Histogram, LiveTotals, RankState
from iolens.rundir import records
from iolens.sinks.prometheus import (
    Exporter,
    ExportLabels,
    IolensCollector,
    parse_listen,
)
from iolens.sources.procfs import CLK_TCK, CpuTimes
from tests.conftest import need
from tests.kernelfake import FakeDevice, FakeSnapshot, counters

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana" / "iolens-dashboard.json"
MS = 1_000_000

# -- helpers ---------------------------------------------------------------------------


@dataclass
class Scrape:
    """One parsed /metrics answer: family name -> type, and every sample."""

    types: dict[str, str] = field(default_factory=dict)
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def values(self, name: str, **labels: str) -> list[float]:
        return [v for n, lab, v in self.samples
                if n == name and all(lab.get(k) == w for k, w in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        found = self.values(name, **labels)
        assert len(found) == 1, (name, labels, found)
        return found[0]

    @property
    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


def parse(text: str) -> Scrape:
    out = Scrape()
    for fam in text_string_to_metric_families(text):
        out.types[fam.name] = fam.type
        out.samples += [(s.name, dict(s.labels), s.value) for s in fam.samples]
    return out


def scrape(url: str, timeout: float = 5) -> Scrape:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        assert resp.status == 200
        return parse(resp.read().decode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_scrape(url: str, proc: subprocess.Popen[bytes], want: str,
                deadline_s: float = 60) -> Scrape:
    """The first scrape that has the sample ``want``; fails when the server process dies."""
    deadline = time.monotonic() + deadline_s
    while True:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            got = scrape(url)
            if want in got.names:
                return got
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.monotonic() < deadline, f"no {want} at {url}"
        time.sleep(0.1)


def iolens_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "iolens", *args]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- units -------------------------------------------------------------------------------


def test_listen_addresses() -> None:
    assert parse_listen("9478") == ("127.0.0.1", 9478)
    assert parse_listen(":9478") == ("127.0.0.1", 9478)
    assert parse_listen("0.0.0.0:9") == ("0.0.0.0", 9)
    assert parse_listen("[::1]:9478") == ("::1", 9478)
    assert parse_listen("node1", default_port=9478) == ("node1", 9478)
    for bad in ("", "abc", "1:2:3", "70000", "[::1", "host:", "[::1]x"):
        with pytest.raises(ValueError, match=re.escape(repr(bad.strip()))):
            parse_listen(bad)


def test_histogram_buckets_are_cumulative_with_bounds_inclusive() -> None:
    h = Histogram((0.001, 0.01))
    h.observe_ns([MS // 2, MS, MS + 1, 20 * MS])
    st = h.state()
    assert st.cumulative == (2, 3, 4) and st.count == 4
    assert st.sum_s == pytest.approx(0.0225 + 1e-9)
    assert BUCKETS_S[0] == 0.001 and BUCKETS_S[-1] == 60.0


def _stat(pid: int, comm: str, ppid: int, ut: int, cut: int = 0) -> str:
    return (f"{pid} ({comm}) S {ppid} {pid} {ppid} 0 -1 4194560 2117 0 0 0 {ut} 0 {cut} 0 20 0 "
            "1 0 12345 103088128 3100 18446744073709551615 1 1 0 0 0 0 0 16781312 16386 0 0 0 "
            "17 1 0 0 9 0 0\n")


def _io(rchar: int, read_bytes: int, wchar: int = 0, write_bytes: int = 0) -> str:
    return (f"rchar: {rchar}\nwchar: {wchar}\nsyscr: 1\nsyscw: 1\nread_bytes: {read_bytes}\n"
            f"write_bytes: {write_bytes}\ncancelled_write_bytes: 0\n")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:  # same inode: the sampler keeps some files open
        fh.write(text)


def _collect(collector: IolensCollector) -> Scrape:
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    return parse(prometheus_client.generate_latest(registry).decode())


def test_collector_on_fixture_proc_gives_exact_values(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    sda = FakeDevice(8, 0, "sda", counters(
        rd=1000, rd_m=10, rd_s=20000, rd_t=500, wr=100, wr_m=5, wr_s=4096, wr_t=300,
        inflight=2, io_t=1234, rq_t=5678, dc=7, dc_m=1, dc_s=64, dc_t=9, fl=3, fl_t=4))
    sdb = FakeDevice(8, 16, "sdb", counters(rd=1, rd_s=8, io_t=3), nfields=11)  # a 4.x kernel
    _write(proc / "diskstats", FakeSnapshot("100.00", [sda, sdb]).diskstats_text())
    _write(proc / "uptime", "100.00 0.00\n")
    _write(proc / "stat", "cpu  100 5 50 800 40 3 2 1 0 0\n")
    _write(proc / "meminfo", "MemTotal: 4000 kB\nMemAvailable: 1000 kB\nCached: 2048 kB\n"
                             "Dirty: 8 kB\nWriteback: 0 kB\n")
    _write(proc / "100" / "stat", _stat(100, "python", 1, 100))
    _write(proc / "100" / "io", _io(5000, 1000))
    _write(proc / "100" / "environ", "PATH=/bin\0RANK=2\0")
    _write(proc / "101" / "stat", _stat(101, "pt_data_worker", 100, 50))
    _write(proc / "101" / "io", _io(8192, 4096))
    (tmp_path / "sys").mkdir()

    totals = LiveTotals(rank="3", interval=1.0, proc_root=str(proc))
    rec = Recorder(None, 100, 1.0, {"sda": "--device", "sdb": "--device", "sdc": "--device"},
                   proc_root=str(proc), sys_root=str(tmp_path / "sys"), discover=False,
                   totals=totals)
    labels = ExportLabels("node1", "resnet", "3")
    collector = IolensCollector(totals.latest, labels, {"cpus": 2})
    base = {"host": "node1", "job": "resnet"}

    first = _collect(collector)  # the baseline, before any interval
    assert first.value("iolens_disk_io_time_seconds_total", device="sda", **base) == 1.234
    assert first.value("iolens_samples_total", **base) == 0

    # One interval: the main process reads 1000 bytes more, the worker 4096.
    _write(proc / "100" / "stat", _stat(100, "python", 1, 150))
    _write(proc / "100" / "io", _io(6000, 2000))
    _write(proc / "101" / "stat", _stat(101, "pt_data_worker", 100, 80))
    _write(proc / "101" / "io", _io(16384, 8192))
    rec.sample()
    # The worker ends and the main process reaps it: its I/O and CPU move into the parent's
    # counters (NOTE [reaped children]); the worker's totals must stay where they were.
    for name in ("stat", "io"):
        (proc / "101" / name).unlink()
    (proc / "101").rmdir()
    _write(proc / "100" / "stat", _stat(100, "python", 1, 155, cut=80))
    _write(proc / "100" / "io", _io(6000 + 16384 + 100, 2000 + 8192 + 500))
    tag = 1 << records.TAG_SHIFT
    rec.train.feed(100, array("q", [
        records.EPOCH | tag, 0, 2,
        records.BATCH | tag, 0, MS // 2,  # wait 0.5 ms, step 0.5 ms
        records.BATCH | tag, MS, 2 * MS,  # wait 1 ms (on the bound), step 1.5 ms
        records.BATCH | tag, 3 * MS, 3003 * MS,  # wait 3 s, step 3.001 s
        records.BATCH | tag, 4000 * MS, 104000 * MS,  # wait 100 s (+Inf), step 100.997 s
    ]))
    rec.sample()
    s = _collect(collector)
    rec.close()

    sda_l = {"device": "sda", **base, "rank": "3"}
    assert s.value("iolens_disk_reads_completed_total", **sda_l) == 1000
    assert s.value("iolens_disk_reads_merged_total", **sda_l) == 10
    assert s.value("iolens_disk_read_bytes_total", **sda_l) == 20000 * 512
    assert s.value("iolens_disk_read_time_seconds_total", **sda_l) == 0.5
    assert s.value("iolens_disk_writes_completed_total", **sda_l) == 100
    assert s.value("iolens_disk_written_bytes_total", **sda_l) == 4096 * 512
    assert s.value("iolens_disk_write_time_seconds_total", **sda_l) == 0.3
    assert s.value("iolens_disk_io_time_seconds_total", **sda_l) == 1234 / 1000
    assert s.value("iolens_disk_io_time_weighted_seconds_total", **sda_l) == 5.678
    assert s.value("iolens_disk_discarded_sectors_total", **sda_l) == 64
    assert s.value("iolens_disk_discard_time_seconds_total", **sda_l) == 0.009
    assert s.value("iolens_disk_flush_requests_total", **sda_l) == 3
    assert s.value("iolens_disk_flush_requests_time_seconds_total", **sda_l) == 0.004
    assert s.value("iolens_disk_io_now", **sda_l) == 2
    assert s.value("iolens_disk_io_time_seconds_total", device="sdb") == 0.003
    assert s.values("iolens_disk_discards_completed_total", device="sdb") == []  # not reported
    assert s.values("iolens_disk_reads_completed_total", device="sdc") == []  # no such device

    main, worker = {"role": "main", **base}, {"role": "worker", **base}
    assert s.value("iolens_job_read_bytes_total", **main) == 2000 + 500
    assert s.value("iolens_job_read_bytes_total", **worker) == 8192  # survives the worker
    assert s.value("iolens_job_rchar_bytes_total", **worker) == 16384
    assert s.value("iolens_job_cpu_seconds_total", **main) == 155 / CLK_TCK
    assert s.value("iolens_job_cpu_seconds_total", **worker) == 80 / CLK_TCK
    assert s.value("iolens_job_processes", **main) == 1
    assert s.value("iolens_job_processes", **worker) == 0
    assert s.value("iolens_job_read_bytes_total", role="other") == 0

    assert s.value("iolens_cpu_seconds_total", mode="user") == 100 / CLK_TCK
    assert s.value("iolens_cpu_seconds_total", mode="iowait") == 40 / CLK_TCK
    assert s.value("iolens_memory_cached_bytes") == 2048 * 1024
    assert s.value("iolens_memory_dirty_bytes") == 8192
    assert s.value("iolens_samples_total") == 2

    r2 = {**base, "rank": "2"}  # the timing process's own RANK, from its environment
    buckets = {lab["le"]: v for n, lab, v in s.samples
               if n == "iolens_data_wait_seconds_bucket" and lab["rank"] == "2"}
    assert buckets["0.001"] == 2 and buckets["2.5"] == 2 and buckets["5.0"] == 3
    assert buckets["60.0"] == 3 and buckets["+Inf"] == 4
    assert s.value("iolens_data_wait_seconds_count", **r2) == 4
    assert s.value("iolens_data_wait_seconds_sum", **r2) == pytest.approx(103.0015)
    steps = {lab["le"]: v for n, lab, v in s.samples
             if n == "iolens_step_seconds_bucket" and lab["rank"] == "2"}
    assert steps["0.001"] == 1 and steps["0.0025"] == 2 and steps["5.0"] == 3
    assert steps["+Inf"] == 4
    assert s.value("iolens_step_seconds_sum", **r2) == pytest.approx(0.0005 + 0.0015 + 3.001
                                                                      + 100.997)
    assert s.value("iolens_steps_total", **r2) == 4
    assert s.value("iolens_epochs_total", **r2) == 1
    assert s.value("iolens_steps_total", rank="3") == 0  # the job's own rank, nothing timed
    verdict = [lab for n, lab, _ in s.samples if n == "iolens_verdict_info"]
    assert len(verdict) == 1 and verdict[0]["rank"] == "3"
    assert verdict[0]["class"] in (*PRIMARY_CLASSES, NO_STEPS)
    for name, _, _ in s.samples:
        assert name.startswith("iolens_")


def stage_record(seq: int, **pipe: Any) -> dict[str, Any]:
    """An interval record with its workers' stage sums (train.pipeline) and a FUSE mount."""
    p: dict[str, Any] = {
        "batches": 10, "samples": 40, "processes": 2, "in_process": False, "fetch_s": 0.4,
        "fetch_cpu_s": 0.02, "fetch_max_s": 0.08, "collate_s": 0.003, "idle_s": 0.02,
        "files": 40, "handover": {"count": 10, "sum_s": 0.017, "max_s": 0.003,
                                  "p50_s": 0.0015, "p95_s": 0.003}}
    p.update(pipe)
    return {"schema": 1, "seq": seq, "t": 1_800_000_000.0 + seq, "elapsed_s": seq + 1.0,
            "interval_s": 1.0, "train": {"batches": 10, "pipeline": p},
            "storage": {"/mnt/s3": {"waiting": 3 + seq, "daemon_cpu_pct": 5.0},
                        "/nfs/data": {"read_ops_s": 10.0}}}


PIPELINE_COUNTERS = ("fetch_seconds", "fetch_cpu_seconds", "collate_seconds", "idle_seconds",
                     "handover_seconds", "handovers", "batches", "samples", "files_opened")


def test_pipeline_counters_sum_the_records_stages() -> None:
    totals = LiveTotals(rank="1")
    collector = IolensCollector(totals.latest, ExportLabels("node1", "resnet", "1"))
    totals.publish(None, None, [], None)  # the baseline: every counter there, at zero
    first = _collect(collector)
    for name in PIPELINE_COUNTERS:
        assert first.value(f"iolens_pipeline_{name}_total", host="node1", rank="1") == 0
        assert first.types[f"iolens_pipeline_{name}"] == "counter"
    assert "iolens_fuse_requests_waiting" not in first.names

    totals.publish(stage_record(0), None, [], None)
    totals.publish({"seq": 1, "train": {"batches": 0}}, None, [], None)  # no batch timed
    totals.publish(stage_record(2, fetch_s=0.6, samples=30, files=0,
                                handover={"count": 4, "sum_s": 0.01}), None, [], None)
    # nothing a malformed record holds takes from a counter or breaks the scrape
    for bad in ({"batches": -5, "fetch_s": float("nan"), "collate_s": "1", "idle_s": True,
                 "samples": float("inf"), "handover": {"count": -1, "sum_s": -2.0}},
                "pipeline", None, [1]):
        totals.publish({"seq": 3, "train": {"pipeline": bad}, "storage": {"/x": None}},
                       None, [], None)
    totals.publish({"seq": 4, "train": "x", "storage": "fuse"}, None, [], None)
    totals.publish(stage_record(5), None, [], None)
    s = _collect(collector)
    base = {"host": "node1", "job": "resnet", "rank": "1"}

    def total(name: str) -> float:
        return s.value(f"iolens_pipeline_{name}_total", **base)

    assert total("fetch_seconds") == pytest.approx(0.4 + 0.6 + 0.4)
    assert total("fetch_cpu_seconds") == pytest.approx(0.06)
    assert total("collate_seconds") == pytest.approx(0.009)
    assert total("idle_seconds") == pytest.approx(0.06)
    assert total("handover_seconds") == pytest.approx(0.017 + 0.01 + 0.017)
    assert total("handovers") == 24
    assert total("batches") == 30 and total("samples") == 110 and total("files_opened") == 80
    # the gauge: the latest record's FUSE mounts (NFS mounts have no such figure)
    assert s.values("iolens_fuse_requests_waiting", mount="/mnt/s3", **base) == [8.0]
    assert s.values("iolens_fuse_requests_waiting", mount="/nfs/data") == []
    assert s.types["iolens_fuse_requests_waiting"] == "gauge"
    # the counters never go down, and a record without storage drops the gauge
    totals.publish({"seq": 6, "train": {"batches": 0}}, None, [], None)
    later = _collect(collector)
    for name in PIPELINE_COUNTERS:
        assert later.value(f"iolens_pipeline_{name}_total", **base) == total(name)
    assert "iolens_fuse_requests_waiting" not in later.names
    # the machine's exporter follows no training loop: no pipeline counters
    machine = LiveTotals(training=False)
    machine.publish(stage_record(0), None, [], None)
    m = _collect(IolensCollector(machine.latest, ExportLabels("n", "j")))
    assert not any(n.startswith("iolens_pipeline_") for n in m.names)
    assert m.value("iolens_fuse_requests_waiting", mount="/mnt/s3") == 3


def test_pipeline_counters_from_a_recorders_worker_timings(tmp_path: Path) -> None:
    """The stage records a DataLoader worker writes, through the recorder's aggregator and
    its interval record, reach the counters (NOTE [stage timing])."""
    proc = tmp_path / "proc"
    _write(proc / "diskstats", FakeSnapshot("100.00", []).diskstats_text())
    _write(proc / "uptime", "100.00 0.00\n")
    _write(proc / "stat", "cpu  100 5 50 800 40 3 2 1 0 0\n")
    _write(proc / "meminfo", "MemTotal: 4000 kB\nMemAvailable: 1000 kB\n")
    _write(proc / "100" / "stat", _stat(100, "python", 1, 100))
    _write(proc / "100" / "io", _io(5000, 1000))
    (tmp_path / "sys").mkdir()
    totals = LiveTotals(rank="0", interval=1.0, proc_root=str(proc))
    rec = Recorder(None, 100, 1.0, {}, proc_root=str(proc), sys_root=str(tmp_path / "sys"),
                   discover=False, totals=totals)
    collector = IolensCollector(totals.latest, ExportLabels("n", "j"), {"cpus": 2})
    tag = 1 << records.TAG_SHIFT

    def batch(idx: int, ready_ms: int) -> list[int]:
        # fetch 8 ms (2 ms on CPU), collate 1 ms, idle 3 ms, 4 samples from 4 files
        return [records.FETCH | tag, 8 * MS, 2 * MS, records.STAGE | tag, MS, 3 * MS,
                records.COUNT | tag, 4, 4, records.READY | tag, idx, ready_ms * MS]

    try:
        rec.train.feed(100, array("q", [records.EPOCH | tag, 0, 1,
                                        records.WORKER | tag, 101, 0]))
        rec.train.feed(101, array("q", batch(0, 20) + batch(1, 30)))
        # the loop asked for batch 0 at 15 ms and got it at 22 (hand-over from 20 ms: 2 ms),
        # for batch 1 at 40 ms and got it at 41 (1 ms)
        rec.train.feed(100, array("q", [records.BATCH | tag, 15 * MS, 22 * MS,
                                        records.HANDOVER | tag, 0, 15 * MS,
                                        records.BATCH | tag, 40 * MS, 41 * MS,
                                        records.HANDOVER | tag, 1, 40 * MS]))
        rec.sample()
        rec.train.feed(101, array("q", batch(2, 50)))
        rec.sample()
        s = _collect(collector)
    finally:
        rec.close()
    assert s.value("iolens_pipeline_batches_total") == 3
    assert s.value("iolens_pipeline_samples_total") == 12
    assert s.value("iolens_pipeline_files_opened_total") == 12
    assert s.value("iolens_pipeline_fetch_seconds_total") == pytest.approx(0.024)
    assert s.value("iolens_pipeline_fetch_cpu_seconds_total") == pytest.approx(0.006)
    assert s.value("iolens_pipeline_collate_seconds_total") == pytest.approx(0.003)
    assert s.value("iolens_pipeline_idle_seconds_total") == pytest.approx(0.009)
    assert s.value("iolens_pipeline_handovers_total") == 2
    assert s.value("iolens_pipeline_handover_seconds_total") == pytest.approx(0.003)


def gpu_state() -> ExportState:
    """A state with two GPUs and two ranks, as a machine with NVML would publish it."""
    h = Histogram()
    h.observe_ns([5 * MS, 50 * MS])
    return ExportState(
        samples=1, time=time.time(), devices=(), roles={}, cpu=CpuTimes(1, 0, 1, 10),
        mem={"dirty_bytes": 1, "writeback_bytes": 0},
        gpus=({"index": 0, "util_pct": 87.0, "mem_util_pct": 40.0, "mem_used_bytes": 3 << 30,
               "mem_total_bytes": 80 << 30, "job_pids": [7]},
              {"index": 1, "util_pct": 12.0, "mem_util_pct": 1.0, "mem_used_bytes": 1 << 30,
               "mem_total_bytes": 80 << 30}),
        ranks=tuple(RankState(str(r), h.state(), h.state(), 1) for r in range(2)),
        recent=(), training=True)


def test_gpu_gauges_in_base_units() -> None:
    st = gpu_state()
    s = _collect(IolensCollector(lambda: st, ExportLabels("n", "j")))
    assert s.value("iolens_gpu_utilization_ratio", gpu="0") == 0.87
    assert s.value("iolens_gpu_memory_used_bytes", gpu="1") == 1 << 30
    assert s.value("iolens_gpu_job_processes", gpu="0") == 1
    assert s.types["iolens_gpu_utilization_ratio"] == "gauge"


def test_in_process_exporter_serves_only_metrics_path() -> None:
    st = gpu_state()
    exporter = Exporter("127.0.0.1", 0, IolensCollector(lambda: st, ExportLabels("n", "j")))
    exporter.start()
    try:
        got = scrape(exporter.url)
        assert "iolens_gpu_utilization_ratio" in got.names
        base = exporter.url.removesuffix("/metrics")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "/other", timeout=5)
        assert err.value.code == 404
    finally:
        exporter.close()
        exporter.close()  # twice is fine


# -- `iolens run --prometheus` on a real training ------------------------------------------------

TRAIN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    from torch.utils.data import DataLoader, Dataset
    import iolens

    class Slow(Dataset):
        def __len__(self):
            return 48
        def __getitem__(self, i):
            time.sleep(0.01)
            return torch.randn(8), i % 2

    if __name__ == "__main__":
        go, trained, release = (Path(p) for p in sys.argv[1:4])
        while not go.exists():
            time.sleep(0.05)
        loader = DataLoader(Slow(), batch_size=8, num_workers=2)
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.3)
        iolens.step()  # hands over the timings still buffered (they go every few intervals)
        trained.write_text("ok")
        while not release.exists():
            time.sleep(0.05)
""")
BATCHES = 18  # 48 samples / 8 per batch, 3 epochs


@dataclass
class LiveRun:
    scrapes: list[Scrape]
    returncode: int
    stderr: str
    run_dir: Path
    job: str = "resnet-test"


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> LiveRun:
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("live")
    (tmp / "train.py").write_text(TRAIN)
    go, trained, release = tmp / "go", tmp / "trained", tmp / "release"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    err = open(tmp / "stderr", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        iolens_cmd("run", "--out", "run", "--interval", "0.2", "--prometheus",
                   f"127.0.0.1:{port}", "--job", "resnet-test", "--", sys.executable,
                   "train.py", str(go), str(trained), str(release)),
        cwd=tmp, stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "RANK": "5"})
    try:
        scrapes = [wait_scrape(url, proc, "iolens_samples_total")]
        go.write_text("go")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            time.sleep(0.25)
            got = scrape(url)
            scrapes.append(got)
            if trained.exists() and got.values("iolens_steps_total") == [BATCHES]:
                break
        time.sleep(0.5)
        scrapes.append(scrape(url))
        release.write_text("go")
        rc = proc.wait(timeout=60)
    finally:
        release.write_text("go")
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    return LiveRun(scrapes, rc, (tmp / "stderr").read_text(), tmp / "run")


def test_run_serves_every_kind_of_metric_with_labels(live_run: LiveRun) -> None:
    assert live_run.returncode == 0, live_run.stderr
    assert "Prometheus metrics at http://127.0.0.1:" in live_run.stderr
    last = live_run.scrapes[-1]
    types = last.types
    assert types["iolens_disk_reads_completed"] == "counter"
    assert types["iolens_disk_io_time_seconds"] == "counter"
    assert types["iolens_disk_io_now"] == "gauge"
    assert types["iolens_job_read_bytes"] == "counter"
    assert types["iolens_job_cpu_seconds"] == "counter"
    assert types["iolens_memory_dirty_bytes"] == "gauge"
    assert types["iolens_data_wait_seconds"] == "histogram"
    assert types["iolens_step_seconds"] == "histogram"
    assert types["iolens_steps"] == "counter"
    assert types["iolens_epochs"] == "counter"
    assert "iolens_verdict_info" in types
    host = socket.gethostname()
    meta = json.loads((live_run.run_dir / "meta.json").read_text())
    for name, labels, _ in last.samples:
        assert (labels["host"], labels["job"], labels["rank"]) == (host, "resnet-test", "5"), name
        if name.startswith("iolens_disk_"):
            assert labels["device"] in meta["devices"]
        if name.startswith("iolens_job_"):
            assert labels["role"] in ("main", "worker", "other")
    devices = {lab["device"] for n, lab, _ in last.samples if n.startswith("iolens_disk_")}
    assert devices and devices <= set(meta["devices"])
    verdict = [lab for n, lab, _ in last.samples if n == "iolens_verdict_info"]
    assert len(verdict) == 1
    assert verdict[0]["class"] in PRIMARY_CLASSES
    assert verdict[0]["severity"] in ("none", "moderate", "high")
    assert meta["outputs"]["prometheus"].startswith("http://127.0.0.1:")


def test_run_counters_grow_between_scrapes(live_run: LiveRun) -> None:
    scrapes = live_run.scrapes
    assert len(scrapes) >= 3
    first, last = scrapes[0], scrapes[-1]
    assert first.value("iolens_steps_total") == 0
    assert last.value("iolens_steps_total") == BATCHES
    assert last.value("iolens_data_wait_seconds_count") == BATCHES
    assert last.value("iolens_epochs_total") == 3
    assert last.value("iolens_samples_total") > first.value("iolens_samples_total")
    assert (last.value("iolens_job_cpu_seconds_total", role="main")
            > first.value("iolens_job_cpu_seconds_total", role="main"))
    assert last.value("iolens_job_rchar_bytes_total", role="worker") > 0
    cumulative = re.compile(r"_(total|count|sum|bucket)$")
    for before, after in itertools.pairwise(scrapes):
        old = {(n, tuple(sorted(lab.items()))): v for n, lab, v in before.samples
               if cumulative.search(n)}
        for n, lab, v in after.samples:
            key = (n, tuple(sorted(lab.items())))
            if key in old:
                assert v >= old[key], f"{n}{lab} went down from {old[key]} to {v}"


def test_run_histograms_are_cumulative_and_count_the_steps(live_run: LiveRun) -> None:
    for s in live_run.scrapes:
        for hist in ("iolens_data_wait_seconds", "iolens_step_seconds"):
            buckets = [(float(lab["le"]), v) for n, lab, v in s.samples
                       if n == f"{hist}_bucket"]
            assert [b for b, _ in buckets] == [*BUCKETS_S, float("inf")]
            counts = [v for _, v in buckets]
            assert counts == sorted(counts), f"{hist} buckets not cumulative: {counts}"
            assert counts[-1] == s.value(f"{hist}_count")
        assert s.value("iolens_step_seconds_count") == s.value("iolens_steps_total")


# -- `iolens exporter` ------------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import os, sys, time
    path, stop = sys.argv[1], sys.argv[2]
    end = time.time() + 60
    while not os.path.exists(stop) and time.time() < end:
        with open(path, "wb") as f:
            f.write(os.urandom(1 << 18))
            f.flush()
            os.fsync(f.fileno())
        time.sleep(0.05)
""")


def test_exporter_watches_a_process_tree(tmp_path: Path) -> None:
    (tmp_path / "writer.py").write_text(WRITER)
    stop_file = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "writer.py", "data.bin", str(stop_file)],
                              cwd=tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    exporter = subprocess.Popen(
        iolens_cmd("exporter", "--listen", str(port), "--interval", "0.2", "--pid",
                   str(writer.pid)), stderr=subprocess.PIPE)
    try:
        first = wait_scrape(url, exporter, "iolens_job_wchar_bytes_total")
        time.sleep(1.0)
        second = scrape(url)
        main = {"role": "main", "job": "writer", "rank": "0", "host": socket.gethostname()}
        assert (second.value("iolens_job_wchar_bytes_total", **main)
                > first.value("iolens_job_wchar_bytes_total", **main))
        assert second.value("iolens_job_processes", **main) == 1
        assert any(n == "iolens_disk_io_time_seconds_total" for n in second.names)
        assert "iolens_steps_total" not in second.names  # no training loop is followed
        assert "iolens_verdict_info" not in second.names
        stop_file.write_text("stop")
        writer.wait(timeout=30)
        assert exporter.wait(timeout=30) == 0  # the process ended, so does the exporter
        assert exporter.stderr is not None
        assert f"process {writer.pid} has exited" in exporter.stderr.read().decode()
    finally:
        stop_file.write_text("stop")
        stop(exporter)
        writer.wait(timeout=30)


def test_exporter_of_the_machine_stops_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(iolens_cmd("exporter", "--listen", f"127.0.0.1:{port}",
                                       "--interval", "0.2"), stderr=subprocess.PIPE)
    try:
        got = wait_scrape(f"http://127.0.0.1:{port}/metrics", proc, "iolens_samples_total")
        assert not any(n.startswith("iolens_job_") for n in got.names)
        assert got.value("iolens_build_info")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        stop(proc)


def test_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(iolens_cmd("exporter", "--listen", f"127.0.0.1:{port}"),
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 2
        assert len(out.stderr.strip().splitlines()) == 1
        assert "already in use" in out.stderr
        started = tmp_path / "started"
        run = subprocess.run(
            iolens_cmd("run", "--out", "r", "--prometheus", str(port), "--", sys.executable,
                       "-c", f"open({str(started)!r}, 'w')"),
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "already in use" in run.stderr and "not started" in run.stderr
    assert not started.exists() and not (tmp_path / "r").exists()


def test_missing_prometheus_client_names_the_extra(tmp_path: Path) -> None:
    block = ("import sys; sys.modules['prometheus_client'] = None; "
             "from iolens.cli import main; sys.exit(main(sys.argv[1:]))")
    exp = subprocess.run([sys.executable, "-c", block, "exporter", "--listen", "0"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert exp.returncode == 1 and "pip install 'iolens[prometheus]'" in exp.stderr
    run = subprocess.run([sys.executable, "-c", block, "run", "--out", "r", "--prometheus",
                          "0", "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 2 and "pip install 'iolens[prometheus]'" in run.stderr


# -- the Grafana dashboard ---------------------------------------------------------------------


def dashboard_queries() -> list[str]:
    dash = json.loads(GRAFANA.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", ()):
            out.append(target["expr"])
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            out.append(var["query"]["query"])
    return out


def test_dashboard_is_importable_as_is() -> None:
    dash = json.loads(GRAFANA.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for part in ("utilization", "await", "throughput", "data wait share per rank", "gpu",
                 "verdict"):
        assert part in titles
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"


def test_dashboard_uses_only_names_the_exporter_serves(live_run: LiveRun) -> None:
    served: set[str] = set()
    for s in live_run.scrapes:
        served |= s.names
    # GPUs: this machine has none, so the same collector serves a state that has some.
    st = gpu_state()
    exporter = Exporter("127.0.0.1", 0, IolensCollector(lambda: st, ExportLabels("n", "j")))
    exporter.start()
    try:
        served |= scrape(exporter.url).names
    finally:
        exporter.close()
    for expr in dashboard_queries():
        used = set(re.findall(r"\biolens_[a-zA-Z0-9_]+", expr))
        assert used, expr
        missing = used - served
        assert not missing, f"{expr!r} uses names no exporter serves: {missing}"


# -- a real Prometheus server, and node_exporter as the oracle of names ----------------------------


def _wait_http(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        assert proc.poll() is None, f"{url}: the server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.2)


def _query(base: str, expr: str) -> dict[str, Any]:
    q = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{base}/api/v1/query?{q}", timeout=10) as resp:
            body: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
    return body


def test_real_prometheus_scrapes_the_exporter(tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    need(binary is not None, "Prometheus is not installed (apt-get install prometheus)")
    assert binary is not None
    port, prom_port = free_port(), free_port()
    exporter = subprocess.Popen(iolens_cmd("exporter", "--listen", str(port), "--interval",
                                           "0.2", "--job", "promtest"),
                                stderr=subprocess.DEVNULL)
    (tmp_path / "prometheus.yml").write_text(textwrap.dedent(f"""
        global:
          scrape_interval: 1s
          evaluation_interval: 1s
        scrape_configs:
          - job_name: iolens
            honor_labels: true
            static_configs:
              - targets: ["127.0.0.1:{port}"]
    """))
    prom = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
         "--web.enable-lifecycle"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        _wait_http(f"{base}/-/ready", prom)
        deadline = time.monotonic() + 60
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not result:
            time.sleep(0.5)
            body = _query(base, "rate(iolens_disk_io_time_seconds_total[10s])")
            assert body["status"] == "success", body
            result = body["data"]["result"]
        assert result, "Prometheus never had two samples of an iolens counter"
        labels = result[0]["metric"]
        assert labels["job"] == "promtest" and labels["host"] == socket.gethostname()
        assert labels["device"]
        # Every query of the dashboard is valid PromQL (the variables as Grafana fills them).
        for expr in dashboard_queries():
            if expr.startswith("label_values("):
                continue
            filled = (expr.replace("$__rate_interval", "10s").replace("$host", ".*")
                      .replace("$job", ".*"))
            body = _query(base, filled)
            assert body["status"] == "success", (filled, body)
        body = _query(base, 'iolens_disk_io_time_seconds_total{job="promtest"}')
        assert body["data"]["result"]
    finally:
        stop(prom)
        stop(exporter)


def test_disk_names_match_node_exporter(tmp_path: Path) -> None:
    binary = shutil.which("prometheus-node-exporter")
    need(binary is not None,
         "node_exporter is not installed (apt-get install prometheus-node-exporter)")
    assert binary is not None
    node_port, port = free_port(), free_port()
    node = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{node_port}",
                             "--collector.disable-defaults", "--collector.diskstats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ours = subprocess.Popen(iolens_cmd("exporter", "--listen", str(port), "--interval", "0.2"),
                            stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{node_port}/metrics", node)
        mine = wait_scrape(f"http://127.0.0.1:{port}/metrics", ours,
                           "iolens_disk_io_time_seconds_total")
        theirs = scrape(f"http://127.0.0.1:{node_port}/metrics")
    finally:
        stop(node)
        stop(ours)
    node_devs = {lab.get("device") for n, lab, _ in theirs.samples
                 if n == "node_disk_io_time_seconds_total"}
    my_devs = {lab["device"] for n, lab, _ in mine.samples
               if n == "iolens_disk_io_time_seconds_total"}
    common = sorted(d for d in node_devs & my_devs if d)
    need(bool(common), "no disk that both node_exporter and iolens report here")
    dev = common[0]
    node_names = {n.removeprefix("node_") for n, lab, _ in theirs.samples
                  if n.startswith("node_disk_") and lab.get("device") == dev
                  and theirs.types.get(n.removesuffix("_total")) in ("counter", "gauge")
                  and not n.endswith("_info")}
    my_names = {n.removeprefix("iolens_") for n, lab, _ in mine.samples
                if n.startswith("iolens_disk_") and lab.get("device") == dev}
    assert node_names == my_names
    # Same counters read a moment apart: equal but for the I/O in between.
    for name in ("disk_reads_completed_total", "disk_read_bytes_total",
                 "disk_io_time_seconds_total"):
        a = theirs.value(f"node_{name}", device=dev)
        b = mine.value(f"iolens_{name}", device=dev)
        assert b == pytest.approx(a, rel=0.02, abs=5), name
