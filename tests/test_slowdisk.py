"""The demo's slow disk: it is built and removed without leftovers, and a training on it under
`iolens run` is recorded as storage-bound, with the loop device saturated by the job's reads."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from iolens.demo.slowdisk import SlowDisk, SlowDiskUnavailable, missing_requirements, reap_stale
from iolens.sources.devmap import read_mountinfo
from tests.conftest import need

MiB = 1 << 20


def need_slow_disk() -> None:
    need(os.geteuid() == 0, "needs root to attach loop devices, mount and make blkio cgroups")
    missing = missing_requirements()
    need(not missing, "cannot make a slow disk here: needs " + "; ".join(missing))


@dataclass(frozen=True)
class Made:
    """What a slow disk made, by name, to look for after it is gone."""

    workdir: str
    backing_file: str
    loop_name: str
    mount_point: str
    cgroup: str

    @classmethod
    def of(cls, disk: SlowDisk) -> Made:
        return cls(disk.workdir, disk.backing_file, disk.loop_name, disk.mount_point, disk.cgroup)


def leftovers(made: Made) -> list[str]:
    """Whatever of ``made`` still exists."""
    left = []
    if os.path.exists(made.cgroup):
        left.append(f"cgroup {made.cgroup}")
    if any(e.mount_point == made.mount_point for e in read_mountinfo() or []):
        left.append(f"mount {made.mount_point}")
    bound = Path(f"/sys/block/{made.loop_name}/loop/backing_file")
    if bound.exists() and bound.read_text().strip().startswith(made.backing_file):
        left.append(f"{made.loop_name} on {made.backing_file}")
    if os.path.exists(made.workdir):
        left.append(f"folder {made.workdir}")
    return left


def wait_for_no_leftovers(made: Made, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := leftovers(made)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def blkio_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "blkio" in controllers.split(","):
            return path
    return ""


@pytest.mark.parametrize("direct_io", [True, False])
def test_setup_and_teardown_leave_nothing_behind(direct_io: bool) -> None:
    need_slow_disk()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    before = blkio_cgroup(sleeper.pid)
    try:
        with SlowDisk(64 * MiB, read_bps=8 * MiB, read_iops=500, direct_io=direct_io) as disk:
            made = Made.of(disk)  # everything exists while it is open
            assert set(leftovers(made)) == {f"cgroup {made.cgroup}", f"mount {made.mount_point}",
                                            f"{made.loop_name} on {made.backing_file}",
                                            f"folder {made.workdir}"}
            assert re.fullmatch(r"loop\d+", disk.loop_name)
            assert disk.direct_io is direct_io
            assert Path(f"/sys/block/{disk.loop_name}/loop/dio").read_text().strip() == \
                str(int(direct_io))
            assert os.path.basename(disk.cgroup) == f"iolens-slowdisk-{os.getpid()}"
            (Path(disk.mount_point) / "sample.bin").write_bytes(b"x" * 4096)
            # The throttle sits on the disk that holds the backing file, not on the loop device.
            devnums = set(disk.backing_disks.values())
            assert devnums and all(re.fullmatch(r"\d+:\d+", d) for d in devnums)
            bps = Path(disk.cgroup, "blkio.throttle.read_bps_device").read_text().split("\n")
            iops = Path(disk.cgroup, "blkio.throttle.read_iops_device").read_text().split("\n")
            assert {f"{d} {8 * MiB}" for d in devnums} <= set(bps)
            assert {f"{d} 500" for d in devnums} <= set(iops)
            disk.join(sleeper.pid)
            assert blkio_cgroup(sleeper.pid) == "/" + os.path.basename(disk.cgroup)
            assert blkio_cgroup(os.getpid()) != blkio_cgroup(sleeper.pid)  # only who joins
            assert disk.loop_name in disk.describe() and "8 MiB/s" in disk.describe()
        assert leftovers(made) == []
        assert blkio_cgroup(sleeper.pid) == before  # back where it was
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_limit_above_the_device_is_set_on_the_loop_device_itself() -> None:
    need_slow_disk()
    with SlowDisk(32 * MiB, read_bps=4 * MiB, above=True) as disk:
        made = Made.of(disk)
        loop = Path(f"/sys/block/{disk.loop_name}/dev").read_text().strip()
        bps = Path(disk.cgroup, "blkio.throttle.read_bps_device").read_text().split("\n")
        assert f"{loop} {4 * MiB}" in bps
        assert not {f"{d} {4 * MiB}" for d in disk.backing_disks.values()} & set(bps)
        assert "on the loop device itself" in disk.describe()
    assert leftovers(made) == []


def test_an_error_in_the_body_still_removes_everything() -> None:
    need_slow_disk()
    made: list[Made] = []
    holders: list[subprocess.Popen[bytes]] = []

    def failing_training() -> None:
        with SlowDisk(32 * MiB, read_bps=4 * MiB) as disk:
            made.append(Made.of(disk))
            data = Path(disk.mount_point) / "held.bin"
            data.write_bytes(b"y" * 8192)
            # A joined process that still holds a file open there when the body fails.
            holders.append(subprocess.Popen(
                [sys.executable, "-c", f"f = open({str(data)!r}, 'rb'); print('open', "
                                       "flush=True); import time; time.sleep(60)"],
                stdout=subprocess.PIPE))
            out = holders[0].stdout
            assert out is not None and out.readline() == b"open\n"
            disk.join(holders[0].pid)
            raise RuntimeError("training failed")

    try:
        with pytest.raises(RuntimeError, match="training failed"):
            failing_training()
        # Cgroup, mount and folder are gone at once; the loop device lets go of its
        # backing file when the last file open on it is closed.
        assert [x for x in leftovers(made[0]) if not x.startswith(made[0].loop_name)] == []
        assert blkio_cgroup(holders[0].pid) != "/" + os.path.basename(made[0].cgroup)
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert wait_for_no_leftovers(made[0]) == []


OWNER = textwrap.dedent("""
    import json, os, sys, time
    from iolens.demo.slowdisk import SlowDisk
    with SlowDisk(32 << 20, read_bps=4 << 20) as disk:
        disk.join(os.getpid())
        print(json.dumps([disk.workdir, disk.backing_file, disk.loop_name, disk.mount_point,
                          disk.cgroup]), flush=True)
        time.sleep(60)
""")


def start_owner(tmp_path: Path) -> tuple[subprocess.Popen[str], Made]:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    made = Made(*json.loads(proc.stdout.readline()))
    assert len(leftovers(made)) == 4
    return proc, made


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_interrupted_process_cleans_up(tmp_path: Path, signum: int) -> None:
    need_slow_disk()
    proc, made = start_owner(tmp_path)
    proc.send_signal(signum)
    rc = proc.wait(timeout=30)
    # Ctrl-C ends Python by SIGINT once the cleanup ran; SIGTERM and SIGHUP as 128+N.
    assert rc == (-signum if signum == signal.SIGINT else 128 + signum)
    assert leftovers(made) == []


def test_leftovers_of_a_killed_process_are_reaped(tmp_path: Path) -> None:
    need_slow_disk()
    proc, made = start_owner(tmp_path)
    proc.kill()  # no chance to clean up
    proc.wait()
    assert len(leftovers(made)) == 4
    removed = reap_stale()
    assert made.cgroup in removed and made.workdir in removed
    assert leftovers(made) == []


def test_bad_limits() -> None:
    with pytest.raises(ValueError, match="give read_bps, read_iops or write_bps"):
        SlowDisk(64 * MiB)
    with pytest.raises(ValueError, match="positive"):
        SlowDisk(64 * MiB, read_bps=0)
    with pytest.raises(ValueError, match="write_bps must be positive"):
        SlowDisk(64 * MiB, write_bps=-1)


def test_without_root_the_demo_says_what_is_missing_and_exits_2(tmp_path: Path) -> None:
    as_user: list[str] = []
    uid = os.geteuid()
    if uid == 0:  # root runs it as the user nobody
        uid = 65534
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        probe = subprocess.run([*as_user, "true"], capture_output=True, check=False)
        need(probe.returncode == 0, "setpriv cannot switch to the user nobody here")
    out = subprocess.run([*as_user, sys.executable, "-m", "iolens.demo", "--slow-disk"],
                         capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"demo: --slow-disk needs root (running as uid {uid})")
    assert "the plain demo" in lines[0] and out.stdout == ""


def test_slow_disk_unavailable_names_what_is_missing() -> None:
    exc = SlowDiskUnavailable(["root (running as uid 1000)", "loop devices"])
    assert str(exc) == "cannot make a slow disk: needs root (running as uid 1000); loop devices"


# ---- the real thing: a storage-bound training, recorded --------------------------------------

FILES, FILE_KIB, EPOCHS = 800, 64, 2


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


def test_training_on_a_slow_disk_is_recorded_as_storage_bound(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    need_slow_disk()
    out = subprocess.run(
        [sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out", str(tmp_path / "run"),
         "--", sys.executable, "-m", "iolens.demo", "--slow-disk", "--slow-mbps", "8",
         "--files", str(FILES), "--file-kib", str(FILE_KIB), "--epochs", str(EPOCHS),
         "--workers", "4"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr
    m = re.search(r"demo: slow disk: /dev/(loop\d+) \(\d+ MiB ext4 on (\S+), ", out.stdout)
    assert m, out.stdout
    loop, backing = m.group(1), m.group(2)
    assert f"epoch {EPOCHS}/{EPOCHS}: {FILES} samples" in out.stdout
    assert "slow disk removed" in out.stdout

    run = tmp_path / "run"
    meta = json.loads((run / "meta.json").read_text())
    recs = records(run)
    # The recorder found the loop device from the job's own files: the dataset the demo
    # writes there first (its folders, at the first open), or the files it has open.
    assert meta["devices"][loop].startswith(("the job writes files in",
                                             "serves the dataset", "the job reads or writes"))
    assert any(s["device"] == loop for s in meta["storage"]), meta["storage"]
    on_loop = [r for r in recs if loop in r["devices"]]
    training = [r for r in on_loop[:-1] if r["job"]["roles"].get("worker", {}).get("pids")]
    assert len(training) >= 5, f"{loop} recorded in {len(on_loop)} of {len(recs)} intervals"
    util = statistics.median(r["devices"][loop]["util"] for r in training)
    r_await = statistics.median(r["devices"][loop]["r_await"] for r in training)
    assert util >= 70.0, f"median %util of {loop} {util:.1f}"
    assert r_await >= 10.0, f"median r_await of {loop} {r_await:.1f} ms"

    # The job's DataLoader workers make up the loop device's reads...
    def total(rs: list[dict[str, Any]], read_s: Any) -> float:
        return sum(float(read_s(r)) * float(r["interval_s"]) for r in rs)

    loop_bytes = total(on_loop, lambda r: r["devices"][loop]["rkB_s"] * 1024)
    worker_bytes = total(on_loop, lambda r: r["job"]["roles"].get("worker", {})
                         .get("read_bytes_s", 0))
    assert loop_bytes > 10 * MiB
    assert worker_bytes >= 0.8 * loop_bytes, (worker_bytes, loop_bytes)
    # ...and read the whole dataset from the disk in every epoch (the page cache emptied).
    all_worker_bytes = total(recs, lambda r: r["job"]["roles"].get("worker", {})
                             .get("read_bytes_s", 0))
    assert all_worker_bytes >= 0.8 * EPOCHS * FILES * FILE_KIB * 1024

    # The training loop waited for its data most of the time.
    summary = meta["summary"]
    assert summary["batches"] == EPOCHS * FILES // 32
    assert summary["data_wait_share"] >= 0.2 and summary["severity"] == "high"
    assert summary["devices"][0]["device"] == loop, summary["devices"]  # the busiest
    # The verdict names the cause and the device, and the report says the same.
    assert summary["verdict"]["class"] == "storage-bound", summary["verdict"]
    assert summary["verdict"]["devices"] == [loop]
    assert "iolens: verdict: storage-bound" in out.stderr
    report = subprocess.run([sys.executable, "-m", "iolens", "report", str(run), "--format",
                             "json"], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(report.stdout)["verdict"]["class"] == "storage-bound"

    # Nothing of the slow disk is left.
    bound = Path(f"/sys/block/{loop}/loop/backing_file")
    assert not (bound.exists() and bound.read_text().strip().startswith(backing))
    assert not os.path.exists(os.path.dirname(backing))
    assert not any(e.mount_point.startswith(os.path.dirname(backing))
                   for e in read_mountinfo() or [])
    assert not Path("/sys/fs/cgroup/blkio", f"iolens-slowdisk-{meta['root_pid']}").exists()
