"""Synthetic kernel counters, written as /proc/diskstats, /sys/block/*/stat and /proc/uptime.

One model of devices feeds both iolens and sysstat's iostat, so that the
two can be compared on exactly the same numbers.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FakeDevice:
    """One device: numbers, name, the 17 counters and how many the kernel prints."""

    major: int
    minor: int
    name: str
    values: list[int]
    nfields: int = 17
    partition_of: str | None = None

    def diskstats_line(self) -> str:
        vals = " ".join(str(v) for v in self.values[: self.nfields])
        return f"{self.major:4d} {self.minor:7d} {self.name} {vals}"

    def stat_text(self) -> str:
        # sysfs prints each value right-aligned in at least 8 columns (like %8lu).
        return " ".join(f"{v:8d}" for v in self.values[: self.nfields]) + "\n"


@dataclass
class FakeSnapshot:
    """The kernel's state at one sample."""

    uptime: str
    devices: list[FakeDevice] = field(default_factory=list)
    extra_diskstats_lines: list[str] = field(default_factory=list)

    def diskstats_text(self) -> str:
        lines = [d.diskstats_line() for d in self.devices] + self.extra_diskstats_lines
        return "\n".join(lines) + "\n"


def counters(rd: int = 0, rd_m: int = 0, rd_s: int = 0, rd_t: int = 0, wr: int = 0,
             wr_m: int = 0, wr_s: int = 0, wr_t: int = 0, inflight: int = 0, io_t: int = 0,
             rq_t: int = 0, dc: int = 0, dc_m: int = 0, dc_s: int = 0, dc_t: int = 0,
             fl: int = 0, fl_t: int = 0) -> list[int]:
    """The 17 counters in kernel order, by sysstat's short names."""
    return [rd, rd_m, rd_s, rd_t, wr, wr_m, wr_s, wr_t, inflight, io_t, rq_t,
            dc, dc_m, dc_s, dc_t, fl, fl_t]


def write_snapshot_dir(snap: FakeSnapshot, folder: Path) -> Path:
    """Save as a replay folder: ``diskstats`` and ``uptime``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "diskstats").write_text(snap.diskstats_text())
    (folder / "uptime").write_text(f"{snap.uptime} 0.00\n")
    return folder


def write_sys_block(snap: FakeSnapshot, sys_block: Path) -> None:
    """Make ``sys_block`` hold exactly the snapshot's devices (disks, partitions as subfolders)."""
    sys_block.mkdir(parents=True, exist_ok=True)
    wanted: dict[Path, FakeDevice] = {}
    for dev in snap.devices:
        if dev.partition_of:
            wanted[sys_block / dev.partition_of.replace("/", "!") / dev.name] = dev
        else:
            wanted[sys_block / dev.name.replace("/", "!")] = dev
    # Drop what vanished, deepest first.
    for path in sorted(sys_block.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_dir() and path not in wanted:
            shutil.rmtree(path)
    for path, dev in wanted.items():
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / "stat.tmp"
        tmp.write_text(dev.stat_text())
        os.replace(tmp, path / "stat")
        (path / "dev").write_text(f"{dev.major}:{dev.minor}\n")
        if dev.partition_of:
            (path / "partition").write_text(f"{dev.minor}\n")


class FedIostat:
    """Runs real iostat in a private mount namespace over fixture files.

    /proc/uptime becomes a FIFO. iostat opens it first in every sample; the
    feeder, once that open returns (so iostat is done with the previous
    sample), rewrites /proc/diskstats and /sys/block for the next snapshot
    and only then hands over the uptime text. Every sample thus sees exactly
    one snapshot, with no timing guesswork.
    """

    def __init__(self, workdir: Path, snaps: Sequence[FakeSnapshot]) -> None:
        self.workdir = workdir
        self.snaps = list(snaps)
        self.fifo = workdir / "uptime.fifo"
        self.diskstats = workdir / "proc_diskstats"
        self.sys_root = workdir / "sys"
        self.sys_block = self.sys_root / "block"
        self.error: BaseException | None = None

    def _apply(self, snap: FakeSnapshot) -> None:
        tmp = self.workdir / "diskstats.tmp"
        tmp.write_text(snap.diskstats_text())
        # Rewrite in place: the bind mount holds the inode, so no rename.
        self.diskstats.write_text(tmp.read_text())
        write_sys_block(snap, self.sys_block)

    def _feed(self) -> None:
        try:
            for snap in self.snaps:
                fd = os.open(self.fifo, os.O_WRONLY)  # blocks until iostat opens it
                try:
                    self._apply(snap)
                    os.write(fd, f"{snap.uptime} 0.00\n".encode())
                    # Hold the write end until iostat closes its end (POLLERR on a
                    # pipe's write end), so the next open waits for its next sample.
                    poller = select.poll()
                    poller.register(fd, select.POLLERR)
                    if not poller.poll(30_000):
                        raise TimeoutError("iostat kept /proc/uptime open for 30 s")
                finally:
                    os.close(fd)
        except BaseException as exc:  # reported by run()
            self.error = exc

    def run(self, args: Sequence[str], timeout: float = 60) -> str:
        """iostat's stdout for ``iostat -x -d ARGS 1 N`` over all the snapshots."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.mkfifo(self.fifo)
        self._apply(self.snaps[0])
        feeder = threading.Thread(target=self._feed, daemon=True)
        feeder.start()
        script = (
            "set -e; mount --make-rprivate / 2>/dev/null || true; "
            f"mount --bind {self.fifo} /proc/uptime; "
            f"mount --bind {self.diskstats} /proc/diskstats; "
            f"mount --bind {self.sys_block} /sys/block; "
            'exec iostat -x -d "$@"'
        )
        # With -y iostat reads one sample more than its count (the skipped one).
        count = len(self.snaps) - (1 if "-y" in args else 0)
        cmd = ["unshare", "-m", "sh", "-c", script, "iostat", *args, "1", str(count)]
        env = dict(os.environ, LC_ALL="C")
        env.pop("S_TIME_FORMAT", None)
        env.pop("S_COLORS", None)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
        feeder.join(timeout=5)
        if feeder.is_alive():
            # iostat stopped early: open the reading end so the feeder's open returns.
            fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
            feeder.join(timeout=5)
            os.close(fd)
        if proc.returncode != 0:
            raise AssertionError(f"iostat failed ({proc.returncode}): {proc.stderr}")
        if self.error is not None:
            raise self.error
        return proc.stdout
