"""`iolens report`: the JSON object's contract, the text report, damaged runs, a real run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.test_verdict import SLOW_LOOP, rec


def iolens(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iolens", *args], capture_output=True,
                          text=True, timeout=300, check=False, cwd=cwd)


def write_run(folder: Path, records: list[dict[str, Any]], meta: dict[str, Any] | None = None,
              tail: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (folder / "records.jsonl").write_text(text)
    if meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta))
    return folder


META = {"command": ["python", "train.py"], "host": "box", "cpus": 8, "interval_s": 1.0,
        "exit_code": 0, "devices": {"loop0": "the job reads /mnt/data/x",
                                    "vda": "serves the current directory"},
        "gpu": {"available": False, "reason": "nvidia-ml-py is not installed", "names": []}}


def slow_run(tmp_path: Path) -> Path:
    records = [rec(i, wait=0.09, devices=SLOW_LOOP, job_read=112 * 64 * 1024) for i in range(40)]
    return write_run(tmp_path / "run", records, META)


def test_json_report_has_the_documented_fields(tmp_path: Path) -> None:
    out = iolens("report", str(slow_run(tmp_path)), "--format", "json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    v = r["verdict"]
    assert (v["class"], v["severity"], v["devices"]) == ("storage-bound", "high", ["loop0"])
    assert v["data_wait_share"] == pytest.approx(0.9)
    assert v["evidence"] and v["recommendations"][0]["expected_gain"]
    assert isinstance(r["findings"], list)
    assert all({"class", "evidence"} <= set(f) for f in r["findings"])
    assert r["devices"]["loop0"]["util_pct"] == 97.0
    assert r["devices"]["loop0"]["why"] == "the job reads /mnt/data/x"
    assert r["devices"]["loop0"]["busy_share"] == 1.0
    assert r["processes"]["worker"]["pids_max"] == 2
    assert r["training"]["batches"] == 400
    assert r["training"]["distribution_source"].startswith("per-interval")
    assert r["training"]["data_wait"]["mean_s"] == pytest.approx(0.09)
    assert r["gpus"] == {"available": False, "reason": "nvidia-ml-py is not installed",
                         "gpus": []}
    assert r["run"]["command"] == ["python", "train.py"] and r["run"]["intervals"] == 40


def test_the_json_is_the_standard_encoders_text(tmp_path: Path) -> None:
    """NOTE [report JSON]: `iolens report --format json` writes the text the standard
    encoder writes, indented by 2 and ASCII only (a run directory and a command with
    characters beyond ASCII: escaped as it escapes them), and a figure that is not finite
    as null."""
    from iolens.cli._batch import json_text

    run = slow_run(tmp_path / "ünï 🚀")
    meta = {**META, "command": ["python", "trâin.py", "--tag", "🚀\x7f"]}
    (run / "meta.json").write_text(json.dumps(meta))
    out = iolens("report", str(run), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert out.stdout.isascii() and "\\ud83d\\ude80\\u007f" in out.stdout
    report = json.loads(out.stdout)
    assert report["run"]["command"][1:] == ["trâin.py", "--tag", "🚀\x7f"]

    def figures_alike(text: str) -> str:  # (1e-06 and 1e-6, 1.5e-05 and 0.000015: alike)
        return re.sub(r"-?\d[\d.]*(?:[eE][-+]?\d+)?", lambda m: repr(float(m.group())), text)

    assert figures_alike(out.stdout) == figures_alike(json.dumps(report, indent=2) + "\n")
    odd = {"a": [1.5, float("nan"), float("inf")], 3: {"µs": 1e-07}, "big": 2**70}
    assert json.loads(json_text(odd)) == {"a": [1.5, None, None], "3": {"µs": 1e-07},
                                          "big": 2**70}
    assert json.loads(json_text({"a": float("nan")})) == {"a": None}


def test_the_gpu_and_cpu_tables_average_the_intervals_that_have_them(tmp_path: Path) -> None:
    """Each GPU's %util is its mean over the intervals NVML answered (an entry without it,
    NVML failing, is left out), its memory the most seen; the CPU shares are means over the
    intervals that recorded them."""
    records = [rec(i, wait=0.09, devices=SLOW_LOOP, job_read=112 * 64 * 1024)
               for i in range(12)]
    for i, r in enumerate(records):
        r["gpu"] = [{"index": 1, "util_pct": 10.0 * i, "mem_used_bytes": 1000 + i,
                     "mem_total_bytes": 8000},
                    {"index": 0, "util_pct": None if i % 3 else 30.0}]
        r["cpu"] = {"user": 20.0 + i, "system": 5.0, "iowait": 1.0, "idle": 74.0 - i}
    del records[4]["cpu"]  # an interval without the machine's CPU
    meta = {**META, "gpu": {"available": True, "reason": None, "names": ["A", "B"]}}
    out = iolens("report", str(write_run(tmp_path / "run", records, meta)), "--format", "json")
    assert out.returncode == 0, out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    assert gpus["available"] is True and [g["index"] for g in gpus["gpus"]] == [0, 1]
    assert gpus["gpus"][0] == {"index": 0, "name": "A", "util_pct": 30.0,
                               "util_max_pct": 30.0, "mem_used_max_bytes": 0,
                               "mem_total_bytes": 0}
    assert gpus["gpus"][1]["name"] == "B"
    assert gpus["gpus"][1]["util_pct"] == 55.0  # (0 + 10 + ... + 110) / 12
    assert gpus["gpus"][1]["util_max_pct"] == 110.0
    assert gpus["gpus"][1]["mem_used_max_bytes"] == 1011
    cpu = json.loads(out.stdout)["cpu"]
    users = [20.0 + i for i in range(12) if i != 4]
    assert cpu["user"] == pytest.approx(sum(users) / 11, abs=0.01)
    assert cpu["system"] == 5.0 and cpu["steal"] == 0.0


def test_text_report_shows_the_verdict_and_escapes_run_strings(tmp_path: Path) -> None:
    records = [rec(i, wait=0.09, devices={"[red]x[/red]": SLOW_LOOP["loop0"]},
                   job_read=112 * 64 * 1024) for i in range(30)]
    meta = {**META, "command": ["python", "[bold]train.py"]}
    run = write_run(tmp_path / "run", records, meta)
    out = iolens("report", str(run))
    assert out.returncode == 0, out.stderr
    assert "storage-bound" in out.stdout and "What to do" in out.stdout
    assert "[red]x[/red]" in out.stdout and "[bold]train.py" in out.stdout
    assert "\x1b[" not in out.stdout  # no colour codes into a pipe


def test_report_to_a_file(tmp_path: Path) -> None:
    run = slow_run(tmp_path)
    target = tmp_path / "r.json"
    out = iolens("report", str(run), "--format", "json", "-o", str(target))
    assert out.returncode == 0 and out.stdout == ""
    assert json.loads(target.read_text())["verdict"]["class"] == "storage-bound"
    bad = iolens("report", str(run), "-o", str(tmp_path / "no" / "such" / "dir" / "r.txt"))
    assert bad.returncode == 1 and "cannot write" in bad.stderr


def test_damaged_run_is_read_as_far_as_valid(tmp_path: Path) -> None:
    records = [rec(i, wait=0.002) for i in range(10)]
    run = write_run(tmp_path / "run", records, None, tail="garbage\n{\"seq\": 11, \"tor")
    out = iolens("report", str(run), "--format", "json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["verdict"]["class"] == "compute-bound"
    notes = " ".join(r["notes"])
    assert "meta.json is missing" in notes and "2 line(s)" in notes


def test_bad_input_exits_2(tmp_path: Path) -> None:
    assert iolens("report", str(tmp_path / "nope")).returncode == 2
    empty = iolens("report", str(tmp_path))
    assert empty.returncode == 2 and "not a run directory" in empty.stderr
    assert iolens("report", str(tmp_path), "--format", "yaml").returncode == 2


def test_empty_run_gets_its_own_verdict(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [], {**META, "instrumented": False})
    r = json.loads(iolens("report", str(run), "--format", "json").stdout)
    assert r["verdict"]["class"] == "no-steps" and "--no-instrument" in r["verdict"]["evidence"][0]


def test_report_of_a_real_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import time, torch
        from torch.utils.data import DataLoader, Dataset
        class Slow(Dataset):
            def __len__(self): return 48
            def __getitem__(self, i):
                time.sleep(0.01)  # waits, using no CPU: more workers would help
                return torch.zeros(4)
        for epoch in range(2):
            for x in DataLoader(Slow(), batch_size=8, num_workers=1):
                pass
    """))
    out = iolens("run", "--interval", "0.2", "--out", "run", "--no-live", "--", sys.executable,
                 str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "iolens: verdict: loader-starved" in out.stderr
    assert "iolens: full report: iolens report run\n" in out.stderr
    r = json.loads(iolens("report", str(tmp_path / "run"), "--format", "json").stdout)
    assert r["verdict"]["class"] == "loader-starved" and r["verdict"]["severity"] == "high"
    assert r["training"]["distribution_source"] == "every batch"
    assert r["training"]["data_wait"]["count"] == 12
    assert r["training"]["step"]["p50_s"] >= r["training"]["data_wait"]["p50_s"]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["summary"]["verdict"]["class"] == "loader-starved"
    assert os.path.isdir(tmp_path / "run" / "timing")


def test_report_reads_timing_left_in_the_spare_folder(tmp_path: Path) -> None:
    """A recorder killed after the job's timing moved to the spare folder: the report
    reads it there, says so, and leaves the folder alone once the run has ended."""
    from iolens.rundir import records as trecords
    from iolens.training._hooks import TimingWriter

    ms = 1_000_000
    spare = tmp_path / "spare"
    run = write_run(tmp_path / "run", [rec(i, wait=0.09) for i in range(4)],
                    {k: v for k, v in META.items() if k != "exit_code"}
                    | {"timing_spare": str(spare)})
    w = TimingWriter(str(run / "timing"), spare=str(spare))
    for i in range(3):  # three batches in the run, then the run directory fails it
        w.buf.extend((trecords.BATCH, 100 * i * ms, (100 * i + 90) * ms))
    w.flush()
    w.moved = "the disk filled up"  # as flush() does on a failed write
    w.directory = str(spare)
    os.close(w._fd)  # type: ignore[arg-type]
    w._fd = None
    for i in range(3, 5):
        w.buf.extend((trecords.BATCH, 100 * i * ms, (100 * i + 90) * ms))
    w.close()
    assert (spare / f"{w.pid}.bin").stat().st_size == 2 * trecords.RECORD_BYTES

    r = json.loads(iolens("report", str(run), "--format", "json").stdout)
    assert r["training"]["distribution_source"] == "every batch"
    assert r["training"]["data_wait"]["count"] == 5
    assert any(f"read from {spare}" in n for n in r["notes"]), r["notes"]
    # Once the run has ended, the recorder moved what there was: the folder is not read.
    meta = json.loads((run / "meta.json").read_text())
    (run / "meta.json").write_text(json.dumps({**meta, "end": "2026-01-01T00:00:00Z"}))
    r = json.loads(iolens("report", str(run), "--format", "json").stdout)
    assert r["training"]["data_wait"]["count"] == 3
    assert not any("read from" in n for n in r["notes"])


@pytest.mark.parametrize("width", [80, 160])
def test_the_text_report_reads_well_at_80_and_160_columns(tmp_path: Path, width: int) -> None:
    """No line past the width, no figure cut short (an ellipsis), no word broken over two
    lines, and an item's wrapped lines start under its text, not at the margin."""
    from tests.test_datasources import _network_run

    records, meta = _network_run(conns=[3] * 30, rx=[8e6] * 30, server_disk=True)
    meta = {**META, **meta, "devices": {
        "loop0": "serves the dataset through http://127.0.0.1:8000: its server reads "
                 "/srv/shards/a-rather-long-folder-name/shard-000000.tar",
        "vda": "serves the current directory (/home/user/project)"}}
    run = write_run(tmp_path / "run", records, meta)
    out = subprocess.run([sys.executable, "-m", "iolens", "report", str(run)],
                         capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "COLUMNS": str(width)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(x) for x in lines) <= width, max(lines, key=len)
    assert "…" not in out.stdout
    # every word of the evidence and the advice is whole on some line
    report = json.loads(iolens("report", str(run), "--format", "json").stdout)
    texts = report["verdict"]["evidence"] + [r["action"] for r in
                                             report["verdict"]["recommendations"]]
    words = {w for t in texts for w in t.split()}
    shown = {w for x in lines for w in x.replace("│", " ").split()}
    assert words <= shown, sorted(words - shown)[:10]
    # a wrapped evidence item goes on under its text: "  - " then text, then its
    # continuation indented by as much
    panel = [x.strip("│").rstrip() for x in lines if x.startswith("│")]
    first = next(i for i, x in enumerate(panel) if x.startswith("   - the fetch blocks"))
    if width == 80:
        assert panel[first + 1].startswith("     ") and panel[first + 1][5] != " ", panel[
            first:first + 3]
