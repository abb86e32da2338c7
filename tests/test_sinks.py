"""Record sinks: the fan-out, CSV and TensorBoard, on a real training under `iolens run`."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from iolens.sinks.base import FanOut
from iolens.sinks.csvfile import CsvSink, header
from iolens.sinks.tensorboard import scalars
from tests.conftest import need
from tests.test_run import TRAIN, records


def iolens_run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iolens", "run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180, check=False)


RECORD: dict[str, Any] = {
    "schema": 1, "seq": 3, "t": 1796078535.428, "time": "2026-11-30T22:42:15.428+00:00",
    "elapsed_s": 0.8, "interval_s": 0.2,
    "devices": {"sda": {"r_s": 100.0, "rkB_s": 2048.0, "r_await": 12.5, "rareq_sz": 20.48,
                        "w_s": 1.0, "wkB_s": 4.0, "w_await": 0.5, "wareq_sz": 4.0,
                        "aqu_sz": 1.3, "util": 95.0}},
    "job": {"pids": 3, "read_bytes_s": 2097152.0, "write_bytes_s": 0.0, "rchar_s": 4194304.0,
            "wchar_s": 0.0, "cache_hit": 0.5, "cpu_pct": 120.0,
            "roles": {"worker": {"pids": 2, "cpu_pct": 80.0, "cache_hit": 0.25}}},
    "cpu": {"user": 40.0, "system": 10.0, "iowait": 30.0, "idle": 20.0, "steal": 0.0},
    "mem": {"cached_bytes": 10, "dirty_bytes": 2},
    "train": {"batches": 4, "epochs_started": 0, "data_wait_share": 0.75,
              "data_wait": {"count": 4, "sum_s": 0.3, "max_s": 0.1, "p50_s": 0.07, "p95_s": 0.1},
              "step": {"count": 4, "sum_s": 0.4, "max_s": 0.12, "p50_s": 0.1, "p95_s": 0.12}},
    "gpu": [{"index": 0, "util_pct": 35.0, "mem_util_pct": 5.0, "mem_used_bytes": 1 << 30}],
}


def test_scalars_of_a_record() -> None:
    s = scalars(RECORD)
    assert s["train/data_wait_share"] == 0.75
    assert s["train/step_p50_s"] == 0.1 and s["train/step_p95_s"] == 0.12
    assert s["train/batches_per_s"] == 20.0
    assert s["device/sda/util"] == 95.0 and s["device/sda/r_await"] == 12.5
    assert s["device/sda/rMB_s"] == 2.0
    assert s["job/read_MB_s"] == 2.0 and s["job/cache_hit"] == 0.5
    assert s["job/worker_cpu_pct"] == 80.0
    assert s["cpu/busy_pct"] == 50.0 and s["cpu/iowait_pct"] == 30.0
    assert s["gpu/0/util_pct"] == 35.0 and s["gpu/0/mem_used_MB"] == 1024.0
    idle = scalars({"train": {"batches": 0}, "devices": {}})
    assert not any(k.startswith("train/") for k in idle)


def test_mlflow_metrics_of_a_record() -> None:
    from iolens.sinks.tracker import metrics

    rec = {**RECORD, "devices": {**RECORD["devices"], "vda": {"util": 5.0, "r_await": 0.3}},
           "train": {**RECORD["train"], "pipeline": {
               "batches": 4, "samples": 64, "fetch_s": 0.64, "fetch_cpu_s": 0.16,
               "collate_s": 0.02, "handover": {"count": 4, "sum_s": 0.008}}}}
    m = metrics(rec)
    assert m["iolens.steps_per_s"] == 20.0 and m["iolens.data_wait_share"] == 0.75
    assert m["iolens.busiest_util"] == 95.0 and m["iolens.busiest_r_await"] == 12.5  # sda
    assert m["iolens.device.vda.util"] == 5.0 and m["iolens.read_MBps"] == 2.0
    assert m["iolens.fetch_ms"] == pytest.approx(10.0)
    assert m["iolens.fetch_blocked_share"] == pytest.approx(0.75)
    assert m["iolens.fetch_queue_share"] == 0.0
    assert m["iolens.collate_ms"] == pytest.approx(5.0)
    # workers that waited 0.32 s together in the 0.2 s interval for a core (160% of one):
    # that is not blocked off CPU
    queued = metrics({**rec, "job": {**rec.get("job", {}), "roles": {"worker": {
        "run_delay_pct": 160.0}}}})
    assert queued["iolens.fetch_queue_share"] == pytest.approx(0.5)
    assert queued["iolens.fetch_blocked_share"] == pytest.approx(0.25)
    assert m["iolens.handover_ms"] == pytest.approx(2.0)
    # an interval without batches or figures gives none of theirs, and nothing not a number
    idle = metrics({"interval_s": 1.0, "train": {"batches": 0}, "devices": {"sda": {
        "util": None}}, "job": {"read_bytes_s": "x"}})
    assert idle == {}


def test_csv_header_is_fixed_at_the_first_record(tmp_path: Path) -> None:
    notes: list[str] = []
    sink = CsvSink(str(tmp_path / "out.csv"), ["sda"], notes.append)
    sink.write(RECORD)
    found = {**RECORD["devices"], "loop0": RECORD["devices"]["sda"]}
    later = {**RECORD, "seq": 4, "devices": found}
    sink.write(later)
    sink.write({**later, "seq": 5})
    sink.close()
    with open(tmp_path / "out.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == header(["sda"], [0])
    assert not any(c.startswith("loop0.") for c in rows[0])
    assert len(notes) == 1 and "loop0" in notes[0] and "--path" in notes[0]
    first = dict(zip(rows[0], rows[1], strict=True))
    assert first["sda.util"] == "95.0" and first["job.worker.cpu_pct"] == "80.0"
    assert first["job.main.cpu_pct"] == "" and first["gpu0.util_pct"] == "35.0"
    assert first["train.step_p95_s"] == "0.12" and first["t"] == "1796078535.428"
    assert [r[4] for r in rows[1:]] == ["3", "4", "5"]


class _Broken:
    def __init__(self) -> None:
        self.closed = 0

    def write(self, record: Mapping[str, Any]) -> None:
        raise OSError(28, "No space left on device", "/full/out.csv")

    def close(self) -> None:
        self.closed += 1
        raise RuntimeError("close failed too")


class _Keep:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.closed = False

    def write(self, record: Mapping[str, Any]) -> None:
        self.seen.append(record["seq"])

    def close(self) -> None:
        self.closed = True


def test_fan_out_drops_a_failing_sink_and_feeds_the_others() -> None:
    notes: list[str] = []
    warned: list[str] = []
    fan = FanOut(notes, warned.append)
    broken, keep = _Broken(), _Keep()
    fan.add("--csv /full/out.csv", broken)
    fan.add("--tensorboard tb", keep)
    for seq in range(3):
        fan({"seq": seq})
    assert keep.seen == [0, 1, 2]
    assert broken.closed == 1 and fan.names == ["--tensorboard tb"]
    assert notes == warned == ["--csv /full/out.csv stopped: No space left on device "
                               "(/full/out.csv); the run goes on without it"]
    fan.close()
    assert keep.closed and fan.names == []


# -- a real training with --csv and --tensorboard --------------------------------------------------


@pytest.fixture(scope="module")
def sink_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("sinks")
    (tmp / "train.py").write_text(TRAIN)
    out = iolens_run(tmp, "--out", "run", "--interval", "0.2", "--csv", "out.csv",
                     "--tensorboard", "tb", "--", sys.executable, "train.py", "2")
    return tmp, out


def test_run_writes_a_csv_row_per_record(sink_run: tuple[Path, Any]) -> None:
    tmp, out = sink_run
    assert out.returncode == 0, out.stderr
    recs = records(tmp / "run")
    with open(tmp / "out.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(recs)  # the last, partial interval too
    meta = json.loads((tmp / "run" / "meta.json").read_text())
    for dev in meta["devices"]:
        assert f"{dev}.util" in rows[0]
    for row, rec in zip(rows, recs, strict=True):
        assert int(row["seq"]) == rec["seq"] and float(row["t"]) == rec["t"]
        # Both clocks of the record: RFC 3339 and Unix seconds, the same moment.
        assert abs(datetime.fromisoformat(row["time"]).timestamp() - float(row["t"])) < 0.002
    assert sum(int(r["train.batches"]) for r in rows) == 12
    assert meta["outputs"]["csv"] == str(tmp / "out.csv")
    assert not [n for n in meta["notes"] if "--csv" in n]


def test_run_writes_tensorboard_scalars(sink_run: tuple[Path, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )

    tmp, out = sink_run
    assert out.returncode == 0, out.stderr
    acc = EventAccumulator(str(tmp / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    meta = json.loads((tmp / "run" / "meta.json").read_text())
    dev = next(iter(meta["devices"]))
    for tag in ("train/data_wait_share", "train/step_p50_s", "train/step_p95_s",
                f"device/{dev}/util", f"device/{dev}/r_await", f"device/{dev}/rMB_s",
                "job/read_MB_s", "job/cpu_pct", "cpu/busy_pct"):
        assert tag in tags, (tag, sorted(tags))
    recs = records(tmp / "run")
    util = acc.Scalars(f"device/{dev}/util")
    assert [e.step for e in util] == [r["seq"] for r in recs]
    assert [e.value for e in util] == pytest.approx([r["devices"][dev]["util"] for r in recs])
    share = acc.Scalars("train/data_wait_share")
    assert share and all(0.0 <= e.value <= 1.0 for e in share)


def test_bad_sink_paths_are_usage_errors(tmp_path: Path) -> None:
    started = tmp_path / "started"
    job = ["--", sys.executable, "-c", f"open({str(started)!r}, 'w')"]
    (tmp_path / "file").write_text("")
    for args, text in ((["--csv", str(tmp_path / "no" / "such" / "dir.csv")], "--csv"),
                       (["--csv", str(tmp_path)], "Is a directory"),
                       (["--tensorboard", str(tmp_path / "file" / "tb")], "--tensorboard")):
        out = iolens_run(tmp_path, "--out", "r", *args, *job)
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and text in out.stderr
        assert "not started" in out.stderr
    assert not started.exists() and not (tmp_path / "r").exists()


def test_full_disk_stops_the_sinks_not_the_job(tmp_path: Path) -> None:
    need(os.geteuid() == 0, "needs root to mount a tiny filesystem")
    small, full = tmp_path / "small", tmp_path / "small2"
    mounted = []
    try:
        for fs in (small, full):
            fs.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(fs)],
                           check=True)
            mounted.append(fs)
        (small / "filler").write_bytes(b"x" * 8192)  # leaves the CSV one 4 KiB page
        (full / "filler").write_bytes(b"x" * 8192)  # and TensorBoard one page too
        out = iolens_run(tmp_path, "--out", "run", "--interval", "0.1", "--csv",
                         str(small / "out.csv"), "--tensorboard", str(full / "tb"), "--",
                         sys.executable, "-c", "import time; time.sleep(2.5); print('done')")
        assert out.returncode == 0, out.stderr
        assert "done" in out.stdout
        assert "warning: --csv" in out.stderr and "No space left on device" in out.stderr
        assert "Traceback" not in out.stderr  # the event writer's thread stays quiet
        meta = json.loads((tmp_path / "run" / "meta.json").read_text())
        assert meta["exit_code"] == 0
        noted = [n for n in meta["notes"] if n.startswith(f"--csv {small / 'out.csv'} stopped")]
        assert len(noted) == 1 and "No space left on device" in noted[0]
        tb = [n for n in meta["notes"] if n.startswith(f"--tensorboard {full / 'tb'}")]
        assert len(tb) == 1 and "No space left on device" in tb[0]
        assert len(records(tmp_path / "run")) >= 15  # the primary record went on
        data = (small / "out.csv").read_text()
        assert data.endswith("\n")  # no torn row: a short write is cut back
        rows = list(csv.reader(data.splitlines()))
        assert len(rows) >= 2 and all(len(r) == len(rows[0]) for r in rows)
    finally:
        for fs in mounted:
            subprocess.run(["umount", "-l", str(fs)], check=False)
