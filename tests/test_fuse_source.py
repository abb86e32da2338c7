"""FUSE mounts: subtype, connection, the kernel's waiting count, the daemon and its counters.

Unit tests run on fake /sys and /proc trees. The lab tests mount a real
folder through rclone, throttled to a few HTTP requests per second
(tests/fuselab.py); they need root, rclone and fuse3, skip elsewhere with
the reason, and fail instead under IOLENS_REQUIRE_ALL=1 (CI).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from iolens.sources.devmap import MountEntry, read_mountinfo
from iolens.sources.fuse import (
    REMOTE_FUSE,
    FuseDaemonSample,
    daemon_rates,
    find_daemon,
    fuse_connection,
    fuse_subtype,
    fuse_tool,
    read_daemon_sample,
    read_waiting,
)
from tests.conftest import need
from tests.fuselab import FUSECTL, FuseLab, fuse_lab_skip_reason, slow_fuse

RecordProperty = Callable[[str, object], None]


def _mount(fstype: str, devnum: tuple[int, int] = (0, 57), source: str = "remote:bucket",
           mount_point: str = "/mnt/data") -> MountEntry:
    return MountEntry(devnum, "/", mount_point, fstype, source, "rw")


# -- subtype and connection --------------------------------------------------

@pytest.mark.parametrize(("fstype", "expected"), [
    ("fuse.rclone", "rclone"),
    ("fuse.s3fs", "s3fs"),
    ("fuse.mountpoint-s3", "mountpoint-s3"),
    ("fuseblk.ntfs-3g", "ntfs-3g"),
    ("fuse", ""),
    ("fuseblk", ""),
    ("ext4", None),
    ("fusectl", None),
    ("nfs4", None),
    ("", None),
])
def test_fuse_subtype(fstype: str, expected: str | None) -> None:
    assert fuse_subtype(fstype) == expected


def test_remote_fuse_kinds() -> None:
    for tool in ("rclone", "s3fs", "gcsfuse", "mountpoint-s3", "blobfuse2", "blobfuse",
                 "sshfs", "goofys", "juicefs"):
        assert REMOTE_FUSE[tool], tool
    assert REMOTE_FUSE["s3fs"] == "object store"
    assert REMOTE_FUSE["sshfs"] == "ssh"


def test_fuse_tool_from_subtype_or_source() -> None:
    assert fuse_tool(_mount("fuse.gcsfuse", source="my-bucket")) == "gcsfuse"
    assert fuse_tool(_mount("fuse", source="mountpoint-s3")) == "mountpoint-s3"
    assert fuse_tool(_mount("fuse", source="/dev/sdb1")) == ""
    assert fuse_tool(_mount("fuse", source="host:/x")) == ""
    assert fuse_tool(_mount("ext4", source="/dev/sda1")) is None


def test_fuse_connection_is_the_kernel_device_number() -> None:
    assert fuse_connection(_mount("fuse.rclone", (0, 57))) == 57
    assert fuse_connection(_mount("fuse", (0, 1234))) == 1234
    # fuseblk: the block device's number in the kernel's encoding, (major << 20) | minor
    assert fuse_connection(_mount("fuseblk", (8, 17), source="/dev/sdb1")) == (8 << 20) | 17
    assert fuse_connection(_mount("virtiofs", (0, 44), source="myfs")) == 44
    assert fuse_connection(_mount("ext4", (8, 1), source="/dev/sda1")) is None


# -- waiting --------------------------------------------------------------------

def _waiting_file(sys_root: Path, conn: int, text: str) -> None:
    d = sys_root / "fs" / "fuse" / "connections" / str(conn)
    d.mkdir(parents=True)
    (d / "waiting").write_text(text)


def test_read_waiting(tmp_path: Path) -> None:
    _waiting_file(tmp_path, 57, "3\n")
    _waiting_file(tmp_path, 58, "0\n")
    _waiting_file(tmp_path, 59, "lots\n")
    _waiting_file(tmp_path, 60, "-1\n")
    _waiting_file(tmp_path, 61, "")
    assert read_waiting(57, str(tmp_path)) == 3
    assert read_waiting(58, str(tmp_path)) == 0
    for conn in (59, 60, 61, 62):
        assert read_waiting(conn, str(tmp_path)) is None, conn
    assert read_waiting(57, str(tmp_path / "nowhere")) is None


# -- the daemon -----------------------------------------------------------------

def _proc(root: Path, pid: int, fds: dict[str, str], cmdline: list[str],
          cwd: str = "/") -> None:
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    for fd, target in fds.items():
        os.symlink(target, d / "fd" / fd)  # readlink gives the target; it need not exist
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in cmdline))
    os.symlink(cwd, d / "cwd")


def test_find_daemon_single_holder(tmp_path: Path) -> None:
    _proc(tmp_path, 1, {"0": "/dev/null"}, ["/sbin/init"])
    _proc(tmp_path, 700, {"0": "/dev/null", "7": "/dev/fuse"}, ["s3fs", "bucket", "/mnt/s3"])
    _proc(tmp_path, 900, {"3": "socket:[1234]"}, ["python", "train.py"])
    (tmp_path / "self").mkdir()  # non-numeric entries are passed over
    assert find_daemon("/mnt/s3", str(tmp_path)) == 700


def test_find_daemon_prefers_the_one_naming_the_mount(tmp_path: Path) -> None:
    _proc(tmp_path, 700, {"7": "/dev/fuse"}, ["sshfs", "host:/", "/mnt/ssh"])
    _proc(tmp_path, 800, {"5": "/dev/fuse"}, ["rclone", "mount", "s3:b", "/mnt/bucket"])
    _proc(tmp_path, 810, {"9": "/dev/fuse"}, ["gcsfuse", "b", "data"], cwd="/mnt")
    assert find_daemon("/mnt/bucket", str(tmp_path)) == 800
    assert find_daemon("/mnt/ssh", str(tmp_path)) == 700
    # a relative mount point is resolved against the daemon's working folder
    assert find_daemon("/mnt/data", str(tmp_path)) == 810
    # several holders and none names it: no guess
    assert find_daemon("/mnt/other", str(tmp_path)) is None


def test_find_daemon_none(tmp_path: Path) -> None:
    _proc(tmp_path, 1, {"0": "/dev/null"}, ["/sbin/init"])
    assert find_daemon("/mnt/x", str(tmp_path)) is None
    assert find_daemon("/mnt/x", str(tmp_path / "missing")) is None


def test_find_daemon_skips_unreadable_processes(tmp_path: Path) -> None:
    _proc(tmp_path, 700, {"7": "/dev/fuse"}, ["s3fs", "b", "/mnt/s3"])
    (tmp_path / "701").mkdir()  # gone between the listing and the read: no fd folder
    (tmp_path / "702").mkdir()
    (tmp_path / "702" / "fd").write_text("not a folder")
    assert find_daemon("/mnt/s3", str(tmp_path)) == 700


STAT = ("4242 (rclone) S 1 4242 4242 0 -1 4194560 5000 0 0 0 {utime} {stime} 0 0 20 0 "
        "12 0 100 1000000 2000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n")


def _daemon_files(root: Path, utime: int, stime: int, rchar: int | None,
                  wchar: int = 0) -> None:
    d = root / "4242"
    d.mkdir(exist_ok=True)
    (d / "stat").write_text(STAT.format(utime=utime, stime=stime))
    if rchar is not None:
        (d / "io").write_text(f"rchar: {rchar}\nwchar: {wchar}\nsyscr: 1\nsyscw: 1\n"
                              "read_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n")


def test_read_daemon_sample(tmp_path: Path) -> None:
    _daemon_files(tmp_path, 120, 30, 1000, 5000)
    s = read_daemon_sample(4242, str(tmp_path))
    assert s == FuseDaemonSample(4242, 150, 1000, 5000)
    (tmp_path / "4242" / "io").unlink()
    s = read_daemon_sample(4242, str(tmp_path))
    assert s == FuseDaemonSample(4242, 150, None, None)
    assert read_daemon_sample(4243, str(tmp_path)) is None
    (tmp_path / "4242" / "stat").write_text("garbage")
    assert read_daemon_sample(4242, str(tmp_path)) is None


def test_daemon_rates() -> None:
    prev = FuseDaemonSample(7, 100, 1_000, 10_000)
    cur = FuseDaemonSample(7, 150, 3_000, 4_010_000)
    r = daemon_rates(prev, cur, 2.0, clk_tck=100)
    assert r == pytest.approx({"cpu_pct": 25.0, "rchar_per_s": 1_000.0,
                               "wchar_per_s": 2_000_000.0})
    assert daemon_rates(prev, FuseDaemonSample(7, 150, None, None), 2.0,
                        clk_tck=100) == pytest.approx({"cpu_pct": 25.0})
    assert daemon_rates(prev, FuseDaemonSample(8, 150, 0, 0), 2.0) == {}
    with pytest.raises(ValueError, match="seconds must be positive"):
        daemon_rates(prev, cur, 0.0)


# -- the lab: a real rclone mount --------------------------------------------

N_FILES = 50
FILE_SIZE = 4096
TPS = 10.0


def _need_lab() -> None:
    reason = fuse_lab_skip_reason()
    need(reason is None, reason or "")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuseLab]:
    _need_lab()
    tmp = tmp_path_factory.mktemp("fuselab")
    data = tmp / "data"
    data.mkdir()
    for i in range(N_FILES):
        (data / f"sample{i:03d}.bin").write_bytes(os.urandom(FILE_SIZE))
    with slow_fuse(str(data), TPS, tmp=tmp) as running:
        os.listdir(running.mount_point)  # the one listing, before anything is timed
        yield running


def _lab_mount(lab: FuseLab) -> MountEntry:
    entries = read_mountinfo() or []
    found = [m for m in entries if m.mount_point == lab.mount_point]
    assert found, f"{lab.mount_point} is not in /proc/self/mountinfo"
    return found[-1]


def _read_files(lab: FuseLab, names: list[str]) -> int:
    total = 0
    for name in names:
        with open(os.path.join(lab.mount_point, name), "rb") as fh:
            total += len(fh.read())
    return total


def _names(start: int, count: int) -> list[str]:
    return [f"sample{i:03d}.bin" for i in range(start, start + count)]


def test_lab_mount_is_seen_as_rclone_fuse(lab: FuseLab,
                                          record_property: RecordProperty) -> None:
    m = _lab_mount(lab)
    assert m.fstype == "fuse.rclone"
    assert fuse_subtype(m.fstype) == "rclone" and fuse_tool(m) == "rclone"
    assert REMOTE_FUSE["rclone"] == "object store"
    conn = fuse_connection(m)
    assert conn is not None
    st = os.stat(lab.mount_point)
    assert conn == os.minor(st.st_dev) and os.major(st.st_dev) == 0
    assert os.path.isdir(os.path.join(FUSECTL, str(conn)))
    waiting = read_waiting(conn)
    assert isinstance(waiting, int)
    record_property("measured", f"connection {conn}, waiting just after the listing {waiting}")


def test_lab_find_daemon_is_the_mount_process(lab: FuseLab) -> None:
    assert find_daemon(lab.mount_point) == lab.mount_pid


def test_lab_reads_are_throttled(lab: FuseLab, record_property: RecordProperty) -> None:
    """20 files at 10 requests/s: at least ~2 s; the daemon's wchar carries the bytes."""
    before = read_daemon_sample(lab.mount_pid)
    t0 = time.monotonic()
    total = _read_files(lab, _names(0, 20))
    elapsed = time.monotonic() - t0
    after = read_daemon_sample(lab.mount_pid)
    record_property("measured", f"20 files in {elapsed:.2f} s at --tpslimit {TPS:g}")
    assert total == 20 * FILE_SIZE
    assert elapsed >= 1.0, f"20 reads took {elapsed:.2f} s: the mount is not throttled"
    assert before is not None and after is not None
    assert before.wchar is not None and after.wchar is not None
    # each read's reply is written to /dev/fuse by the daemon
    assert after.wchar - before.wchar >= total
    rates = daemon_rates(before, after, elapsed)
    assert rates["cpu_pct"] >= 0 and rates["wchar_per_s"] > 0
    record_property("measured", f"daemon: {rates['cpu_pct']:.1f}% CPU, "
                                f"wchar {rates['wchar_per_s'] / 1024:.1f} KiB/s")


def test_lab_waiting_counts_requests_in_flight(lab: FuseLab,
                                               record_property: RecordProperty) -> None:
    conn = fuse_connection(_lab_mount(lab))
    assert conn is not None
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            _read_files(lab, _names(20, 10))
        except BaseException as exc:  # reported below, in the test's own thread
            errors.append(exc)

    t = threading.Thread(target=reader, name="fuse-reader")
    t.start()
    seen: list[int] = []
    try:
        while t.is_alive():
            value = read_waiting(conn)
            if value is not None:
                seen.append(value)
            time.sleep(0.005)
    finally:
        t.join(30)
    assert not t.is_alive(), "the reader is still blocked on the mount after 30 s"
    assert not errors, errors
    busy = sum(1 for v in seen if v >= 1)
    record_property("measured", f"waiting: max {max(seen, default=-1)}, >= 1 in {busy} "
                                f"of {len(seen)} samples")
    assert seen and max(seen) >= 1


def test_lab_cleans_up_after_an_exception(tmp_path: Path) -> None:
    _need_lab()
    data = tmp_path / "data"
    data.mkdir()
    (data / "one.bin").write_bytes(b"x" * 10)
    pids: tuple[int, int] = (0, 0)
    mount_point = ""
    try:
        with slow_fuse(str(data), 50, tmp=tmp_path / "lab") as running:
            assert (Path(running.mount_point) / "one.bin").read_bytes() == b"x" * 10
            pids = (running.server_pid, running.mount_pid)
            mount_point = running.mount_point
            raise KeyError("boom")
    except KeyError:
        pass
    assert mount_point and all(pids)
    assert not any(m.mount_point == mount_point for m in read_mountinfo() or [])
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
