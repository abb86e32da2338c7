"""`iolens iostat` as a user runs it: arguments, errors, exit codes, output forms."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernelfake import FakeDevice, FakeSnapshot, counters, write_snapshot_dir

SDA0 = FakeDevice(8, 0, "sda", counters(rd=100, rd_s=800, rd_t=50, io_t=40, rq_t=60))
SDA1 = FakeDevice(8, 0, "sda", counters(rd=300, rd_s=2400, rd_t=250, io_t=140, rq_t=360))


def iolens(*args: str, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {"PATH": os.environ["PATH"], "LC_ALL": "C", **(env or {})}
    return subprocess.run([sys.executable, "-m", "iolens", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, check=False)


def proc_dir(tmp_path: Path, snap: FakeSnapshot) -> Path:
    return write_snapshot_dir(snap, tmp_path / "proc")


def test_help_teaches_with_examples() -> None:
    out = iolens("iostat", "--help")
    assert out.returncode == 0
    assert "examples:" in out.stdout and "--replay" in out.stdout and "exit codes" in out.stdout
    top = iolens("--help")
    assert top.returncode == 0 and "iostat" in top.stdout


def test_unknown_command_and_version() -> None:
    bad = iolens("frobnicate")
    assert bad.returncode == 2 and "unknown command 'frobnicate'" in bad.stderr
    assert iolens("--version").stdout.startswith("iolens ")


def test_unknown_device_is_a_usage_error_listing_devices(tmp_path: Path) -> None:
    proc = proc_dir(tmp_path, FakeSnapshot("10.00", [SDA0]))
    out = iolens("iostat", "--proc-root", str(proc), "--sys-root", str(tmp_path), "nvme9n9")
    assert out.returncode == 2
    assert "unknown device 'nvme9n9'" in out.stderr and "sda" in out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("operands", [["1", "2", "3"], ["0", "3"], ["1", "0"], ["1", "2.5"]])
def test_bad_interval_or_count_is_a_usage_error(operands: list[str]) -> None:
    out = iolens("iostat", *operands)
    assert out.returncode == 2 and "error:" in out.stderr and "Traceback" not in out.stderr


def test_missing_diskstats_is_one_clear_sentence(tmp_path: Path) -> None:
    out = iolens("iostat", "--proc-root", str(tmp_path), "--sys-root", str(tmp_path))
    assert out.returncode == 1
    assert "cannot read" in out.stderr and "does not expose disk statistics" in out.stderr
    assert "still work" in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_falls_back_to_sysfs_when_diskstats_is_hidden(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "uptime").write_text("20.00 1.00\n")
    sda = tmp_path / "sys" / "block" / "sda"
    sda.mkdir(parents=True)
    (sda / "stat").write_text(SDA1.stat_text())
    out = iolens("iostat", "--proc-root", str(tmp_path / "proc"), "--sys-root",
                 str(tmp_path / "sys"))
    assert out.returncode == 0, out.stderr
    assert "reading" in out.stderr and "block/*/stat instead" in out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("sda"))
    assert line.split()[1] == "15.00"  # 300 reads over 20 s


def test_malformed_lines_are_counted_not_fatal(tmp_path: Path) -> None:
    snap = FakeSnapshot("10.00", [SDA0], ["garbage", "8 1 sda1 1 2 3 4"])
    proc = proc_dir(tmp_path, snap)
    out = iolens("iostat", "--proc-root", str(proc), "--sys-root", str(tmp_path))
    assert out.returncode == 0
    assert "skipped 1 malformed line(s) and 1 old-format partition line(s)" in out.stderr
    assert any(x.startswith("sda ") for x in out.stdout.splitlines())


def test_live_sampling_of_a_proc_root(tmp_path: Path) -> None:
    proc = proc_dir(tmp_path, FakeSnapshot("10.00", [SDA0]))
    out = iolens("iostat", "--proc-root", str(proc), "--sys-root", str(tmp_path), "-y",
                 "0.2", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("Device ") == 3
    # Nothing changed between samples: every interval report is all zeros.
    rows = [x for x in out.stdout.splitlines() if x.startswith("sda")]
    assert len(rows) == 3 and all(set(r.split()[1:]) == {"0.00"} for r in rows)


def test_json_lines_use_iostat_keys(tmp_path: Path) -> None:
    dirs = [str(write_snapshot_dir(FakeSnapshot(u, [d]), tmp_path / n))
            for u, d, n in (("10.00", SDA0, "a"), ("12.00", SDA1, "b"))]
    out = iolens("iostat", "--json", "-y", "-t", "--replay", *dirs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert re.fullmatch(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d", report["timestamp"])
    (sda,) = report["disk"]
    assert list(sda) == [
        "disk_device", "r/s", "w/s", "d/s", "f/s", "rkB/s", "wkB/s", "dkB/s", "rrqm/s",
        "wrqm/s", "drqm/s", "rrqm", "wrqm", "drqm", "r_await", "w_await", "d_await",
        "f_await", "rareq-sz", "wareq-sz", "dareq-sz", "aqu-sz", "util"]
    assert (sda["r/s"], sda["rkB/s"], sda["r_await"], sda["util"]) == (100.0, 400.0, 1.0, 5.0)
    mb = json.loads(iolens("iostat", "--json", "-m", "-y", "--replay", *dirs).stdout)
    assert mb["disk"][0]["rMB/s"] == 0.39 and "rkB/s" not in mb["disk"][0]


def test_iso_timestamps(tmp_path: Path) -> None:
    d = str(write_snapshot_dir(FakeSnapshot("10.00", [SDA0]), tmp_path / "a"))
    out = iolens("iostat", "-t", "--replay", d, env={"S_TIME_FORMAT": "ISO"})
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}$", out.stdout, re.M)


def test_replay_errors_are_usage_errors(tmp_path: Path) -> None:
    a = str(write_snapshot_dir(FakeSnapshot("20.00", [SDA1]), tmp_path / "a"))
    b = str(write_snapshot_dir(FakeSnapshot("10.00", [SDA0]), tmp_path / "b"))
    swapped = iolens("iostat", "--replay", a, b)
    assert swapped.returncode == 2 and "backwards" in swapped.stderr
    missing = iolens("iostat", "--replay", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "holds `diskstats` and `uptime`" in missing.stderr
    (tmp_path / "b" / "uptime").write_text("soon\n")
    garbled = iolens("iostat", "--replay", a, b)
    assert garbled.returncode == 2 and "not an uptime" in garbled.stderr


def test_path_on_memory_filesystem_is_explained(tmp_path: Path) -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    out = iolens("iostat", "--path", "/dev/shm/iolens-not-yet")
    assert out.returncode == 2 and "no block device (tmpfs" in out.stderr


def test_path_selects_the_serving_disk() -> None:
    out = iolens("iostat", "--path", str(Path(__file__).parent))
    assert out.returncode == 0, out.stderr
    watching = re.search(r"watching (\S+)", out.stderr)
    assert watching is not None
    rows = [x.split()[0] for x in out.stdout.splitlines()[3:] if x.strip()]
    assert rows == watching.group(1).split(",")


def test_closed_pipe_exits_quietly() -> None:
    proc = subprocess.run(f"{sys.executable} -m iolens iostat 0.1 | head -n 1", shell=True,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.stdout.startswith("Linux") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("operand", ["-5", "1.", ".5", "1e3"])
def test_malformed_numbers_are_not_taken_for_devices(operand: str) -> None:
    out = iolens("iostat", "--", operand) if operand.startswith("-") else iolens("iostat", operand)
    assert out.returncode == 2
    assert "not a valid interval or count" in out.stderr


def test_interval_longer_than_a_day_is_refused() -> None:
    out = iolens("iostat", "100000000000000000000", "2")
    assert out.returncode == 2
    assert "longer than a day" in out.stderr
    assert "Traceback" not in out.stderr


def test_mistyped_roots_and_empty_path() -> None:
    out = iolens("iostat", "--proc-root", "/hots/proc")
    assert out.returncode == 2
    assert "--proc-root /hots/proc: no such folder" in out.stderr
    empty = iolens("iostat", "--path", "")
    assert empty.returncode == 2
    assert "empty path" in empty.stderr


def test_named_device_that_vanishes_is_skipped_while_absent(tmp_path: Path) -> None:
    sdb = FakeDevice(8, 16, "sdb", counters(rd=10, rd_s=80))
    snaps = [FakeSnapshot("10.00", [SDA0, sdb]), FakeSnapshot("11.00", [SDA1]),
             FakeSnapshot("12.00", [SDA1, sdb])]
    dirs = [str(write_snapshot_dir(s, tmp_path / f"s{i}")) for i, s in enumerate(snaps)]
    out = iolens("iostat", "sdb,sda", "--replay", *dirs)
    assert out.returncode == 0, out.stderr
    blocks = out.stdout.split("Device")[1:]
    assert ["sdb" in b for b in blocks] == [True, False, True]
    assert all("sda" in b for b in blocks)


def test_uptime_going_backwards_live_is_skipped_not_fatal(tmp_path: Path) -> None:
    proc = proc_dir(tmp_path, FakeSnapshot("500.00", [SDA0]))
    env = {"PATH": os.environ["PATH"], "LC_ALL": "C"}
    p = subprocess.Popen([sys.executable, "-m", "iolens", "iostat", "--proc-root", str(proc),
                          "--sys-root", str(tmp_path), "0.6", "2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    first = []
    for line in p.stdout:  # the first report is out: its sample is taken
        first.append(line)
        if line.startswith("sda"):
            break
    with open(proc / "uptime", "r+") as fh:  # then the clock goes back
        fh.write("100.00 0.00\n")
    rest, err = p.communicate(timeout=60)
    out = subprocess.CompletedProcess(p.args, p.returncode, "".join(first) + rest, err)
    assert out.returncode == 0, out.stderr
    assert "uptime clock went backwards" in out.stderr
    assert out.stdout.count("Device ") == 2
