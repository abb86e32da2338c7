"""The live view: rendering records (pure), LiveView on a real pseudo-terminal, `iolens top`."""

from __future__ import annotations

import copy
import io
import os
import pty
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.screen import Screen

from iolens.live import render as render_mod
from iolens.live.history import Header, History
from iolens.live.render import render, render_text, sparkline
from iolens.live.view import MIN_REDRAW_S, LiveView
from iolens.recorder.sampler import Recorder

ENTER_ALT = b"\x1b[?1049h"
LEAVE_ALT = b"\x1b[?1049l"
SHOW_CURSOR = b"\x1b[?25h"


def record(seq: int = 0, *, util: float = 42.0, gpu: bool = True,
           train: bool = True) -> dict[str, Any]:
    """An interval record shaped as Recorder.sample() makes it, with round figures."""
    rec: dict[str, Any] = {
        "schema": 1, "seq": seq, "t": 1_800_000_000.0 + seq, "time": "2027-01-15T08:00:00Z",
        "elapsed_s": 3725.0 + seq, "interval_s": 1.0,
        "devices": {
            "nvme0n1": {"r_s": 812.0, "rkB_s": 102400.0, "rrqm_s": 0.0, "r_await": 12.5,
                        "rareq_sz": 126.1, "w_s": 3.0, "wkB_s": 2048.0, "wrqm_s": 0.0,
                        "w_await": 0.75, "wareq_sz": 682.7, "d_s": 0.0, "f_s": 0.0,
                        "aqu_sz": 10.15, "util": util},
            "sda": {"r_s": 0.0, "rkB_s": 0.0, "rrqm_s": 0.0, "r_await": 0.0, "rareq_sz": 0.0,
                    "w_s": 1.5, "wkB_s": 6.0, "wrqm_s": 0.0, "w_await": 2.0, "wareq_sz": 4.0,
                    "d_s": 0.0, "f_s": 0.0, "aqu_sz": 0.0, "util": 0.3},
        },
        "job": {
            "pids": 5, "cpu_pct": 420.0, "read_bytes_s": 95 * 2**20, "write_bytes_s": 2**20,
            "rchar_s": 200 * 2**20, "wchar_s": 2**20, "cache_hit": 0.525,
            "states": {"R": 2, "D": 3},
            "roles": {
                "main": {"pids": 1, "cpu_pct": 97.0, "read_bytes_s": 0.0, "write_bytes_s": 2**20,
                         "rchar_s": 10.0, "wchar_s": 0.0, "cache_hit": 0.9},
                "worker": {"pids": 4, "cpu_pct": 323.0, "read_bytes_s": 95 * 2**20,
                           "write_bytes_s": 0.0, "rchar_s": 760 * 2**20, "wchar_s": 0.0,
                           "cache_hit": 0.875},
            },
        },
        "cpu": {"user": 61.2, "system": 9.4, "iowait": 21.7, "idle": 7.7, "steal": 0.0},
        "mem": {"cached_bytes": 12 * 2**30, "dirty_bytes": 64 * 2**20,
                "writeback_bytes": 2 * 2**20, "available_bytes": 40 * 2**30},
        "train": {"batches": 0, "epochs_started": 0,
                  "data_wait": {"count": 0, "sum_s": 0.0, "max_s": 0.0, "p50_s": 0.0,
                                "p95_s": 0.0},
                  "step": {"count": 0, "sum_s": 0.0, "max_s": 0.0, "p50_s": 0.0, "p95_s": 0.0},
                  "step_source": None, "data_wait_share": None},
    }
    if train:
        rec["train"] = {
            "batches": 25, "epochs_started": 1 if seq == 0 else 0,
            "data_wait": {"count": 25, "sum_s": 0.5, "max_s": 0.09, "p50_s": 0.012,
                          "p95_s": 0.081},
            "step": {"count": 25, "sum_s": 1.0, "max_s": 0.12, "p50_s": 0.038, "p95_s": 0.11},
            "step_source": "dataloader", "data_wait_share": 0.5,
        }
        if seq == 0:
            rec["train"]["epoch_start_wait"] = {"count": 1, "sum_s": 0.25, "max_s": 0.25,
                                                "p50_s": 0.25, "p95_s": 0.25}
    if gpu:
        rec["gpu"] = [{"index": 0, "util_pct": 38.0, "mem_util_pct": 20.0,
                       "mem_used_bytes": 10 * 2**30, "mem_total_bytes": 80 * 2**30,
                       "pids": [999, 4242], "proc_mem_bytes": [2**30, 3 * 2**30],
                       "job_pids": [4242]},
                      {"index": 1, "error": "GPU is lost"}]
    return rec


WATCH = {"nvme0n1": "serves --path /data (/data)", "sda": "--device"}
HEADER = Header(title="iolens run", command="python train.py --epochs 3", pid=4242,
                run_dir="iolens-runs/demo", footer="Ctrl-C goes to the job")


def text_of(renderable: Any, width: int, height: int | None = None) -> str:
    """``renderable`` as plain text; with ``height``, drawn full screen as LiveView draws it."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, height=height or 25, color_system=None,
                      force_terminal=False, legacy_windows=False)
    console.print(renderable if height is None else Screen(renderable))
    return buf.getvalue()


def screen_of(records: list[dict[str, Any]], watch: dict[str, str], width: int,
              height: int) -> str:
    """The view as the full screen shows it: told the height, then cropped or padded to it."""
    return text_of(render(records, watch, HEADER, height=height), width, height)


def lines_fit(text: str, width: int) -> bool:
    return all(len(line.rstrip()) <= width for line in text.splitlines())


# -- pure helpers -----------------------------------------------------------------


def test_sparkline_scales_clamps_and_marks_gaps() -> None:
    assert sparkline([0, 50, 100], 3, top=100) == "▁▅█"
    assert sparkline([None, 100.0, float("nan")], 3) == " █ "
    assert sparkline([150, -5], 2, top=100) == "█▁"  # clamped to 0..top
    assert sparkline([100], 5) == "    █"  # right-aligned: the newest value on the right
    assert sparkline(list(range(100)), 10, top=99) == sparkline(list(range(90, 100)), 10,
                                                                top=99)
    assert sparkline([0, 100], 2, plain=True) == "_#"
    assert sparkline([5.0], 1, top=0) == "█"  # a zero scale does not divide by zero
    assert sparkline([1.0], 0) == ""


def test_history_is_bounded_but_totals_cover_every_record() -> None:
    h = History(length=3)
    assert h.latest is None and h.wait_share is None and h.window_wait_share() is None
    for i in range(5):
        h.add(record(i))
    assert len(h) == 3 and h.count == 5
    assert [r["seq"] for r in h] == [2, 3, 4]
    assert h.batches == 125 and h.epochs == 1
    assert h.wait_share == pytest.approx(0.5) and h.window_wait_share() == pytest.approx(0.5)
    h.add({"train": "not a dict"})  # a malformed record counts but adds nothing
    assert h.count == 6 and h.batches == 125


# -- the rendered view ------------------------------------------------------------


def test_every_panel_shows_its_figures() -> None:
    hist = History(records=[record(0, util=20.0), record(1, util=95.0)])
    text = text_of(render(hist, WATCH, HEADER), 180)
    assert lines_fit(text, 180)
    first = text.splitlines()[0]
    assert "iolens run" in first and "pid 4242" in first and "python train.py" in first
    assert "every 1 s" in first and "up 01:02:06" in first
    assert time.strftime("%H:%M:%S", time.localtime(1_800_000_001)) in first  # record's time
    assert text.splitlines()[1].startswith("verdict now: storage-bound (data wait 50%, high)")
    assert text.splitlines()[2] == "recording to iolens-runs/demo"
    # Devices: nvme0n1 at 100 MiB/s read, 2 MiB/s written, its %util history and why.
    nvme = next(line for line in text.splitlines() if line.startswith("nvme0n1"))
    assert nvme.split()[1:9] == ["100.0", "2.0", "812", "3.0", "12.50", "0.75", "10.15",
                                 "95.0"]
    assert "▂█" in nvme and "serves --path /data" in nvme
    sda = next(line for line in text.splitlines() if line.startswith("sda "))
    assert sda.split()[1:9] == ["0.0", "0.0", "0.0", "1.5", "0.00", "2.00", "0.00", "0.3"]
    # Job: disk and syscall reads, the workers' page-cache hit, CPU by role, pids, D state.
    assert "disk read  95.0 MB/s" in text and "read()     200.0 MB/s" in text
    assert "cache hit  87.5% (workers)" in text
    assert "main 97%, workers 323%" in text
    assert "pids       1 main, 4 workers" in text and "in D state 3 (waiting on I/O)" in text
    # Training: steps/s, data-wait share now and recent, percentiles, batches and epochs.
    assert "steps/s      25.0" in text
    assert "data wait    50.0% (high)" in text
    assert "wait now     50.0%" in text and "wait total   50.0%" in text
    assert "wait p50/p95 12.0 / 81.0 ms" in text and "step p50/p95 38.0 / 110 ms" in text
    assert "batches      50" in text and "epochs       1" in text
    # CPU and memory.
    assert "user / sys 61.2% / 9.4%" in text and "iowait     21.7%" in text
    assert "page cache 12.0 GiB" in text and "dirty / wb 64 MiB / 2 MiB" in text
    # GPUs: one measured, one failing.
    assert "GPU0     38%" in text and "memory 10.0 / 80.0 GiB" in text
    assert "job    1 pid, 3.0 GiB" in text  # the job's share of the GPU's memory
    assert "GPU1     GPU is lost" in text
    assert text.rstrip().endswith("Ctrl-C goes to the job")


def test_epoch_start_wait_is_shown_for_the_interval_that_had_one() -> None:
    text = text_of(render([record(0)], WATCH, HEADER), 180)
    assert "first batch waited 250 ms" in text


def test_nothing_yet_renders_placeholders() -> None:
    text = text_of(render([], {}, Header()), 120)
    assert "whole machine" in text and "waiting for the first interval" in text
    assert "devices: none watched" in text
    assert "no process watched" in text
    assert "no DataLoader timing here" in text
    assert "iolens run -- CMD" in text


def test_a_watched_device_without_figures_yet_shows_dashes() -> None:
    text = text_of(render([], {"vda": "serves the current directory"}, HEADER), 120)
    vda = next(line for line in text.splitlines() if line.startswith("vda"))
    assert vda.split()[1:9] == ["—"] * 8
    assert "no DataLoader batch timed yet" in text  # a run directory, no batch yet
    job = text_of(render([], {}, Header(pid=7)), 120)
    assert "waiting for the first interval" in job


def test_empty_and_malformed_records_never_crash() -> None:
    bad: list[dict[str, Any]] = [
        {},
        {"devices": None, "job": [], "cpu": "x", "mem": 3, "train": None, "gpu": "nvml"},
        {"devices": {"sda": {"util": "high", "rkB_s": None, "r_await": float("nan")}},
         "job": {"pids": 2, "roles": {"worker": {"pids": "two", "cache_hit": None}},
                 "states": None, "io_readable": False},
         "train": {"batches": 3, "step_source": "dataloader", "data_wait": {"sum_s": "?"},
                   "step": None, "data_wait_share": float("inf")},
         "gpu": [None, {"index": 0}], "interval_s": 0, "elapsed_s": -5},
    ]
    for width in (30, 80, 200):
        text = text_of(render(bad, {"sda": "--device"}, Header(pid=1)), width)
        assert "sda" in text
    text = text_of(render(bad[:2], {}, Header(pid=1)), 120)
    assert "process 1 not found (exited?)" in text
    assert "no CPU figures" in text
    assert "devices: none watched" in text
    text = text_of(render(bad[:2], {"sda": "--device"}, Header(pid=1)), 120)
    assert "no device figures in this interval" in text


def test_without_gpu_the_reason_is_shown() -> None:
    hist = [record(gpu=False)]
    reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    text = text_of(render(hist, WATCH, Header(gpu_reason=reason)), 120)
    assert reason in text
    assert "no GPU figures (NVML not in use)" in text_of(render(hist, WATCH, Header()), 200)
    none_found = record()
    none_found["gpu"] = []
    assert "NVML found no GPU" in text_of(render([none_found], WATCH, Header()), 200)
    unknown = record()
    unknown["gpu"][0]["proc_mem_bytes"] = [None, None]  # NVML did not say
    assert "job    1 pid, memory —" in text_of(render([unknown], WATCH, Header()), 80)


def test_without_training_figures_the_panel_says_why() -> None:
    hist = [record(train=False)]
    text = text_of(render(hist, WATCH, HEADER), 160)
    assert "no DataLoader batch timed yet" in text
    assert "steps/s" not in text


def test_long_device_names_are_cut_and_lines_fit() -> None:
    long_name = "nvme0n1-" + "x" * 50
    rec = record()
    rec["devices"] = {long_name: rec["devices"]["nvme0n1"]}
    for width in (60, 80, 120):
        text = text_of(render([rec], {long_name: "--device " + "y" * 80}, HEADER), width)
        assert lines_fit(text, width)
        row = next(line for line in text.splitlines() if line.startswith("nvme0n1-"))
        assert "…" in row and long_name not in row
        assert "12.50" in row  # the figures survive the cut


def pipeline_record(seq: int = 0) -> dict[str, Any]:
    """record() with its workers' stage sums (25 batches of 4 samples) and a FUSE mount."""
    rec = record(seq)
    rec["train"]["pipeline"] = {
        "batches": 25, "samples": 100, "processes": 4, "in_process": False,
        "fetch_s": 0.53, "fetch_cpu_s": 0.0212, "fetch_max_s": 0.05, "collate_s": 0.0075,
        "idle_s": 0.0225, "files": 100,
        "handover": {"count": 25, "sum_s": 0.0425, "max_s": 0.004, "p50_s": 0.0017,
                     "p95_s": 0.003}}
    rec["storage"] = {"/mnt/s3": {"waiting": 7, "daemon_cpu_pct": 3.0},
                      "/nfs/data": {"read_ops_s": 120.0}}
    return rec


def test_the_pipeline_line_shows_the_latest_intervals_stages() -> None:
    text = text_of(render([record(0), pipeline_record(1)], WATCH, HEADER), 180)
    assert lines_fit(text, 180)
    line = next(x for x in text.splitlines() if x.startswith("pipeline:"))
    assert line == ("pipeline: fetch 5.3 ms/sample (4% CPU, 96% blocked), collate 0.3 ms, "
                    "hand-over 1.7 ms/batch, workers idle 4%, FUSE /mnt/s3: 7 requests waiting")
    assert text.splitlines()[2] == line  # under the verdict
    # FUSE and NFS reads never reach read_bytes: no cache hit from them
    assert "cache hit  — (not seen on FUSE/NFS)" in text and "87.5%" not in text
    # only the latest interval counts: one without stage figures has no line
    plain = text_of(render([pipeline_record(0), record(1)], WATCH, HEADER), 180)
    assert "pipeline:" not in plain and "cache hit  87.5% (workers)" in plain
    narrow = text_of(render([pipeline_record()], WATCH, HEADER), 60)
    assert lines_fit(narrow, 60)
    assert any(x.startswith("pipeline: fetch 5.3 ms/sample") for x in narrow.splitlines())


def test_the_pipeline_line_of_a_loader_without_workers_and_of_bad_figures() -> None:
    rec = pipeline_record()
    del rec["storage"]
    rec["train"]["pipeline"].update(in_process=True, processes=1)
    line = next(x for x in text_of(render([rec], WATCH, HEADER), 200).splitlines()
                if x.startswith("pipeline:"))
    assert line.endswith("hand-over 1.7 ms/batch, in the training process (num_workers=0)")
    assert "idle" not in line
    only_handover = record()
    only_handover["train"]["pipeline"] = {"batches": 0, "handover": {"count": 2, "sum_s": 0.01}}
    assert "pipeline: hand-over 5.0 ms/batch\n" in text_of(
        render([only_handover], WATCH, HEADER), 200)
    bad: Any
    for bad in ({"batches": "25", "samples": None, "fetch_s": float("nan"), "handover": []},
                {"batches": float("inf"), "fetch_s": 1.0, "samples": 0, "collate_s": "x",
                 "idle_s": -1.0, "handover": {"count": True, "sum_s": "1"}},
                [], "pipeline", None):
        rec = record()
        rec["train"]["batches"] = 3  # the line alone: too few batches for the verdict
        rec["train"]["pipeline"] = bad
        rec["storage"] = {"/mnt/x": {"waiting": "many"}, "/mnt/y": None, 3: [1]}
        for width in (30, 120):
            text = text_of(render([rec], WATCH, HEADER), width)
            assert "nan" not in text and "inf" not in text and lines_fit(text, width)
    rec = record()
    rec["storage"] = "fuse"
    assert "pipeline:" not in text_of(render([rec], WATCH, HEADER), 120)


def test_the_verdict_waits_for_enough_batches() -> None:
    few = record()
    few["train"]["batches"] = 5
    text = text_of(render([few], WATCH, HEADER), 120)
    assert "verdict: waiting for 20 timed batches in the last 1 intervals (5 so far)" in text
    idle = record()
    idle["train"] = {"batches": 0}
    assert "verdict" not in text_of(render([idle], WATCH, HEADER), 120)


def test_many_devices_on_a_small_screen_keep_the_busiest() -> None:
    devices = {f"sd{chr(97 + i // 26)}{chr(97 + i % 26)}": {"util": float(i), "rkB_s": 1024.0}
               for i in range(60)}
    rec = record()
    rec["devices"] = devices
    watch = dict.fromkeys(devices, "did I/O since boot")
    text = screen_of([rec], watch, 160, 40)
    assert len(text.splitlines()) == 40
    assert "Ctrl-C goes to the job" in text  # everything below the table still fits
    assert "more" in text
    shown = [line.split()[0] for line in text.splitlines() if line.startswith("sd")]
    assert shown[-1] == "sdch" and "sdaa" not in shown  # the busiest (util 59) kept, idle cut
    hidden = int(next(line for line in text.splitlines() if "more" in line).split()[0][1:])
    assert hidden + len(shown) == 60
    full = text_of(render([rec], watch, HEADER), 160)  # no height: every device
    assert sum(line.startswith("sd") for line in full.splitlines()) == 60


@pytest.mark.parametrize("width", [40, 60, 80, 100, 139, 140, 220])
def test_every_width_fits(width: int) -> None:
    text = text_of(render([record(0), record(1)], WATCH, HEADER), width)
    assert lines_fit(text, width)
    nvme = next(line for line in text.splitlines() if line.startswith("nvme0n1"))
    assert "100.0" in nvme and "12.50" in nvme and "42.0" in nvme  # MB/s, r_await, %util


@pytest.mark.parametrize(("width", "height"), [(20, 5), (30, 10), (80, 12), (200, 3)])
def test_a_tiny_screen_still_renders(width: int, height: int) -> None:
    rec = record()
    rec["devices"] = {f"vd{chr(97 + i)}": rec["devices"]["sda"] for i in range(20)}
    text = screen_of([rec], dict.fromkeys(rec["devices"], "x"), width, height)
    lines = text.splitlines()  # cropped or padded to the screen
    assert len(lines) == height and lines[0].startswith("iolens"[:width])


def test_render_text_is_plain_and_trimmed() -> None:
    text = render_text([record()], WATCH, HEADER, width=100)
    assert "\x1b" not in text
    assert all(line == line.rstrip() for line in text.splitlines())
    assert "nvme0n1" in text and "cache hit" in text


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_render_text_for_a_non_utf8_output_keeps_to_ascii(encoding: str) -> None:
    long_name = "nvme0n1-" + "x" * 50
    recs = [record(0), record(1)]
    recs[1]["devices"][long_name] = recs[1]["devices"]["sda"]
    text = render_text(recs, {**WATCH, long_name: "--device"}, HEADER, width=80,
                       encoding=encoding)
    text.encode("ascii")  # raises if anything is not ASCII
    assert "nvme0n1" in text and "cache hit" in text and "+--" in text


def test_top_under_a_latin1_locale_prints_ascii() -> None:
    out = subprocess.run([sys.executable, "-m", "iolens", "top", "--once", "--interval", "0.1"],
                         capture_output=True, check=False, timeout=60,
                         env={**os.environ, "PYTHONIOENCODING": "latin-1"})
    assert out.returncode == 0, out.stderr
    out.stdout.decode("ascii")
    assert b"whole machine" in out.stdout


def test_a_real_recorder_record_renders() -> None:
    recorder = Recorder(None, os.getpid(), 0.1, {}, discover=False)
    try:
        hist = History()
        for _ in range(2):
            time.sleep(0.1)
            hist.add(recorder.sample())
        text = render_text(hist, recorder.watch, Header(pid=os.getpid(), command="pytest",
                                                        gpu_reason=recorder.gpu.reason),
                           width=120)
    finally:
        recorder.close()
    assert f"pid {os.getpid()}" in text and "1 main" in text
    assert "user / sys" in text


# -- LiveView on a real pseudo-terminal ----------------------------------------------


@pytest.fixture
def terminal() -> Iterator[tuple[int, io.TextIOWrapper]]:
    """A pseudo-terminal: the master fd to read what was drawn, the slave as a text stream."""
    master, slave = pty.openpty()
    stream = open(slave, "w", encoding="utf-8", closefd=True)  # noqa: SIM115 - closed below
    try:
        yield master, stream
    finally:
        stream.close()
        os.close(master)


def drain(fd: int, timeout: float = 0.5) -> bytes:
    out = b""
    while select.select([fd], [], [], timeout)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        timeout = 0.05
    return out


def test_live_view_draws_full_screen_and_restores(
        terminal: tuple[int, io.TextIOWrapper]) -> None:
    master, stream = terminal
    view = LiveView(WATCH, HEADER, file=stream)
    assert view.start() and view.active
    for i in range(2):
        time.sleep(MIN_REDRAW_S)
        view.update(record(i))
    drawn = drain(master)
    view.stop()
    view.stop()  # twice is harmless
    after = drain(master)
    assert view.error is None and not view.active
    assert ENTER_ALT in drawn and b"nvme0n1" in drawn and b"cache hit" in drawn
    assert LEAVE_ALT in after and SHOW_CURSOR in after
    assert len(view.history) == 2


def test_live_view_fits_the_terminal_it_draws_on(
        terminal: tuple[int, io.TextIOWrapper]) -> None:
    master, stream = terminal
    set_window(stream.fileno(), rows=32, cols=100)
    rec = record()
    rec["devices"] = {f"vd{chr(97 + i)}": {"util": float(i)} for i in range(26)}
    view = LiveView(dict.fromkeys(rec["devices"], "x"), HEADER, file=stream)
    assert view.start()
    time.sleep(MIN_REDRAW_S)
    view.update(rec)
    view.stop()
    frame = drain(master).split(b"\x1b[H")[-1]  # the last frame drawn from the top left
    lines = frame.split(b"\r\n")
    assert len(lines) == 32
    assert b"more" in frame and b"vdz" in frame and b"vda " not in frame  # the busiest kept
    assert b"Ctrl-C goes to the job" in frame
    text = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line.decode()) for line in lines]
    assert all(len(line) <= 100 for line in text)


def set_window(fd: int, *, rows: int, cols: int) -> None:
    """Give a pseudo-terminal a window size, as a real terminal has."""
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_live_view_draws_at_most_every_min_redraw(
        terminal: tuple[int, io.TextIOWrapper]) -> None:
    master, stream = terminal
    view = LiveView(WATCH, HEADER, file=stream)
    assert view.start()
    assert drain(master).count(b"iolens run") == 1
    for i in range(5):  # faster than anyone reads: kept, not drawn
        view.update(record(i))
    assert b"iolens run" not in drain(master, 0.05)
    time.sleep(MIN_REDRAW_S)
    view.update(record(5))
    assert drain(master).count(b"iolens run") == 1
    view.stop()
    assert len(view.history) == 6 and view.error is None


def test_live_view_follows_a_real_recorder_loop(
        terminal: tuple[int, io.TextIOWrapper], reader: subprocess.Popen[str]) -> None:
    """The way `iolens run` drives it: Recorder.loop(wait, on_record=view.update)."""
    master, stream = terminal
    recorder = Recorder(None, reader.pid, 0.2, {"vda": "test"}, discover=False)
    header = Header(title="iolens run", pid=reader.pid, command="reader",
                    gpu_reason=recorder.gpu.reason, notes=recorder.notes)
    view = LiveView(recorder.watch, header, file=stream)
    seen: list[dict[str, Any]] = []

    def on_record(rec: dict[str, Any]) -> None:
        seen.append(rec)
        view.update(rec)

    def wait(timeout: float) -> bool:
        time.sleep(timeout)
        return len(seen) >= 3

    try:
        assert view.start()
        recorder.loop(wait, on_record=on_record)
    finally:
        view.stop()
        recorder.close()
    out = drain(master)
    assert view.error is None and len(view.history) == 3
    assert out.startswith(ENTER_ALT) and out.count(f"pid {reader.pid}".encode()) >= 3
    assert b"1 main" in out and b"cache hit" in out
    assert out.rstrip().endswith(LEAVE_ALT)


def test_live_view_swallows_a_renderer_error(terminal: tuple[int, io.TextIOWrapper],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    master, stream = terminal
    view = LiveView(WATCH, HEADER, file=stream)
    assert view.start()
    drain(master)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("renderer bug")

    monkeypatch.setattr(render_mod, "render", broken)
    time.sleep(MIN_REDRAW_S)
    view.update(record())  # must not raise
    assert not view.active
    assert view.error is not None and "renderer bug" in view.error
    assert LEAVE_ALT in drain(master)  # the terminal is given back
    view.update(record())  # still harmless once disabled
    assert not view.start()  # a failed view stays off


def test_live_view_ignores_what_is_not_a_record(terminal: tuple[int, io.TextIOWrapper]) -> None:
    _, stream = terminal
    view = LiveView(WATCH, HEADER, file=stream)
    assert view.start()
    time.sleep(MIN_REDRAW_S)
    view.update(None)  # type: ignore[arg-type]
    view.update({"devices": "garbage", "seq": "x"})
    view.stop()
    assert view.error is None and len(view.history) == 1


def test_live_view_needs_a_terminal() -> None:
    view = LiveView(WATCH, HEADER, file=io.StringIO())
    assert not view.start() and view.error == "not a terminal"
    view.update(record())  # keeps the history, draws nothing, never raises
    view.stop()
    assert len(view.history) == 1


def test_importing_the_view_does_not_import_rich() -> None:
    code = ("import sys, iolens, iolens.cli, iolens.live, iolens.live.view, iolens.live.top, "
            "iolens.live.history; print('rich' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- `iolens top` as a real command ------------------------------------------------


def iolens_top(*args: str, timeout: float = 60,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iolens", "top", *args], capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})})


def test_top_prints_plain_snapshots_when_piped() -> None:
    out = iolens_top("--count", "2", "--interval", "0.2", env={"COLUMNS": "130"})
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout
    headers = [line for line in out.stdout.splitlines() if line.startswith("iolens top")]
    assert len(headers) == 2 and all("whole machine" in h for h in headers)
    assert out.stdout.count("Device") == 2 and "CPU & memory" in out.stdout
    assert "no process watched" in out.stdout
    assert lines_fit(out.stdout, 130)


def test_top_stops_quietly_when_its_reader_goes_away() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "iolens", "top", "--interval", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"iolens top")
    proc.stdout.close()  # as `| head -1` does
    try:
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 141
    assert proc.stderr.read() == b""
    proc.stderr.close()


def test_top_watches_the_disks_that_did_io_like_iostat() -> None:
    from iolens.core.devselect import select_devices
    from iolens.sources.counters import DiskSnapshot
    from iolens.sources.disk import DiskSampler

    sampler = DiskSampler()
    snap = sampler.snapshot()
    expected = select_devices(snap, DiskSnapshot.zero(), sampler.topology(snap))
    sampler.close()
    out = iolens_top("--once", "--interval", "0.1", env={"COLUMNS": "160"})
    assert out.returncode == 0, out.stderr
    rows = [line.split()[0] for line in out.stdout.splitlines()
            if "did I/O since boot" in line]
    assert rows == expected


def test_top_device_shows_only_that_device() -> None:
    from iolens.sources.disk import DiskSampler

    sampler = DiskSampler()
    name = sorted(sampler.snapshot().devices)[0]
    sampler.close()
    out = iolens_top("--device", name, "--once", "--interval", "0.1", env={"COLUMNS": "160"})
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.endswith("--device")]
    assert [r.split()[0] for r in rows] == [name]
    assert "did I/O since boot" not in out.stdout


READER = textwrap.dedent("""
    import sys, time
    path = sys.argv[1]
    print("ready", flush=True)
    while True:
        with open(path, "rb") as fh:
            while fh.read(1 << 20):
                pass
        time.sleep(0.005)
""")


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A real process that keeps reading a 4 MiB file."""
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(4 * 2**20))
    proc = subprocess.Popen([sys.executable, "-c", READER, str(data)], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc
    proc.kill()
    proc.wait()


def test_top_pid_shows_the_process_and_its_reads(reader: subprocess.Popen[str],
                                                 tmp_path: Path) -> None:
    out = iolens_top("--pid", str(reader.pid), "--count", "2", "--interval", "0.3",
                     "--path", str(tmp_path), env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    snaps = out.stdout.split("iolens top")[1:]
    assert len(snaps) == 2
    last = snaps[-1]
    assert f"pid {reader.pid}" in last and "data.bin" not in last.splitlines()[0]
    assert "-c" in last.splitlines()[0]  # its command line
    assert "1 main" in last
    read_line = next(line for line in last.splitlines() if "read()" in line)
    assert float(read_line.split("read()")[1].split()[0]) > 1.0  # MB/s through read()
    hit_line = next(line for line in last.splitlines() if "cache hit" in line)
    assert "% (job)" in hit_line
    assert f"serves --path {tmp_path}" in last or "serves process" in last


def test_top_stops_when_the_process_ends() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.8)"])
    try:
        out = iolens_top("--pid", str(child.pid), "--interval", "0.2", timeout=30)
    finally:
        child.wait()
    assert out.returncode == 0, out.stderr
    assert f"process {child.pid} has exited" in out.stderr
    assert "iolens top" in out.stdout


def test_top_unknown_pid_is_a_usage_error() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    out = iolens_top("--pid", str(pid_max + 1), "--count", "1")
    assert out.returncode == 2
    assert f"--pid {pid_max + 1}: no such process" in out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize(("args", "message"), [
    (["--interval", "0.01"], "--interval must be between 0.05 and 60 seconds, not 0.01"),
    (["--interval", "61"], "--interval must be between 0.05 and 60 seconds, not 61"),
    (["--interval", "nan"], "--interval must be between 0.05 and 60 seconds"),
    (["--interval", "fast"], "invalid float value"),
    (["--count", "0"], "--count must be a positive whole number"),
    (["--pid", "0"], "no such process"),
    (["--device", "nvme77n1"], "unknown device 'nvme77n1'"),
    (["--proc-root", "/nonexistent"], "--proc-root /nonexistent: no such folder"),
    (["--path", "/proc"], "--path /proc: "),  # no disk serves it
])
def test_top_bad_options_exit_2(args: list[str], message: str) -> None:
    out = iolens_top("--count", "1", *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert out.stdout == ""


def test_top_is_listed_in_the_help() -> None:
    out = subprocess.run([sys.executable, "-m", "iolens", "--help"], capture_output=True,
                         text=True, check=False)
    assert "top" in out.stdout and "live view" in out.stdout
    helped = iolens_top("--help")
    assert helped.returncode == 0 and "--pid PID" in helped.stdout


# -- `iolens top` on a real pseudo-terminal ---------------------------------------------


def top_on_pty(*args: str, stop: signal.Signals | None = None,
               timeout: float = 30) -> tuple[int, bytes]:
    """Run `iolens top ARGS` with a pseudo-terminal as its stdin, stdout and stderr.

    With ``stop``, that signal is sent once the view has been drawn. Returns
    the exit code and every byte written to the terminal.
    """
    master, slave = pty.openpty()
    set_window(slave, rows=40, cols=140)
    proc = subprocess.Popen([sys.executable, "-m", "iolens", "top", *args], stdin=slave,
                            stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    sent = False
    try:
        while time.monotonic() < deadline:
            if stop is not None and not sent and out.count(b"Ctrl-C to quit") >= 2:
                proc.send_signal(stop)
                sent = True
            ready = select.select([master], [], [], 0.2)[0]
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every slave descriptor is closed
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, out


def test_top_on_a_terminal_draws_the_alternate_screen_and_restores_it() -> None:
    code, out = top_on_pty("--count", "2", "--interval", "0.2")
    assert code == 0, out[-2000:]
    assert out.startswith(ENTER_ALT)
    assert out.count(b"iolens top") >= 3  # before the first interval, then two refreshes
    assert b"whole machine" in out and b"Ctrl-C to quit" in out
    tail = out[out.rindex(b"Ctrl-C to quit"):]
    assert LEAVE_ALT in tail and SHOW_CURSOR in tail


@pytest.mark.parametrize(("stop", "expected"), [(signal.SIGINT, 0),
                                                (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_top_on_a_terminal_restores_it_when_stopped(stop: signal.Signals,
                                                    expected: int) -> None:
    code, out = top_on_pty("--interval", "0.2", stop=stop)
    assert code == expected, out[-2000:]
    assert ENTER_ALT in out
    tail = out[out.rindex(b"Ctrl-C to quit"):]
    assert LEAVE_ALT in tail and SHOW_CURSOR in tail
    assert b"Traceback" not in out


def test_top_once_on_a_terminal_prints_one_plain_snapshot() -> None:
    code, out = top_on_pty("--once", "--interval", "0.1")
    assert code == 0, out[-2000:]
    assert ENTER_ALT not in out and b"\x1b[" not in out
    assert out.count(b"whole machine") == 1 and b"CPU & memory" in out


def test_records_are_not_changed_by_rendering() -> None:
    rec = record()
    before = copy.deepcopy(rec)
    render_text([rec], WATCH, HEADER)
    assert rec == before


# -- the live view of `iolens run` --------------------------------------------------------


def run_on_pty(tmp_path: Path, *opts: str, job_stdout_to_file: bool = False,
               timeout: float = 60) -> tuple[int, bytes]:
    """`iolens run OPTS -- python -c sleep` with a pty as its terminal; returns code and bytes.

    With ``job_stdout_to_file`` stdout (and so the job's stdout) goes to a file,
    as in `iolens run -- python train.py > train.log`.
    """
    master, slave = pty.openpty()
    set_window(slave, rows=40, cols=140)
    log = open(tmp_path / "job.log", "w") if job_stdout_to_file else None  # noqa: SIM115
    cmd = [sys.executable, "-m", "iolens", "run", "--interval", "0.2", "--out",
           str(tmp_path / f"run{len(list(tmp_path.iterdir()))}"), *opts, "--", sys.executable,
           "-c", "import time; print('job says hi', flush=True); time.sleep(1.5)"]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=log if log else slave, stderr=slave,
                            close_fds=True)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 0.2)[0]:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        if log:
            log.close()
    return code, out


ALT_ON, ALT_OFF = b"\x1b[?1049h", b"\x1b[?1049l"


def test_run_draws_no_view_over_the_jobs_own_output(tmp_path: Path) -> None:
    code, out = run_on_pty(tmp_path)
    assert code == 0
    assert ALT_ON not in out and b"job says hi" in out and b"iolens: verdict:" in out


def test_run_draws_the_view_when_the_jobs_output_goes_elsewhere(tmp_path: Path) -> None:
    code, out = run_on_pty(tmp_path, job_stdout_to_file=True)
    assert code == 0
    assert ALT_ON in out and ALT_OFF in out
    assert out.rindex(ALT_OFF) < out.index(b"iolens: run directory")  # final lines stay
    assert b"iolens run" in out  # the view's header
    assert (tmp_path / "job.log").read_text() == "job says hi\n"


def test_run_live_and_no_live_force_the_choice(tmp_path: Path) -> None:
    code, out = run_on_pty(tmp_path, "--live")
    assert code == 0 and ALT_ON in out and out.rindex(ALT_OFF) < out.index(b"run directory")
    code, out = run_on_pty(tmp_path, "--no-live", job_stdout_to_file=True)
    assert code == 0 and ALT_ON not in out and b"iolens: verdict:" in out


def test_a_loop_with_no_batch_for_a_while_says_so() -> None:
    rec = record(0)
    rec["train"]["waiting_s"] = 42.0
    text = text_of(render([rec], WATCH, HEADER), 180)
    assert re.search(r"no batch +for 42 s \(in next\(\)\)", text), text
