"""FUSE mounts: which tool serves them, their kernel queue, and the daemon process.

A FUSE filesystem shows as ``fuse.<subtype>`` in mountinfo (``fuse.rclone``,
``fuse.s3fs``), or as plain ``fuse``/``fuseblk`` with the tool's name as the
mount source (mountpoint-s3, blobfuse2). The kernel counts each connection's
outstanding requests in ``/sys/fs/fuse/connections/<N>/waiting`` (the fusectl
filesystem, when mounted), and the daemon that answers them is an ordinary
process holding ``/dev/fuse`` open; when it runs on this machine its CPU and
syscall byte counters say whether it, rather than the kernel, is the bottleneck.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from iolens._errors import StatsUnavailableError
from iolens.sources._files import read_text
from iolens.sources.devmap import MountEntry
from iolens.sources.procfs import CLK_TCK, parse_proc_io, parse_proc_stat

REMOTE_FUSE: dict[str, str] = {
    "rclone": "object store",
    "s3fs": "object store",
    "gcsfuse": "object store",
    "mountpoint-s3": "object store",
    "blobfuse2": "object store",
    "blobfuse": "object store",
    "goofys": "object store",
    "ossfs": "object store",
    "juicefs": "object store",
    "alluxio-fuse": "object store",
    "sshfs": "ssh",
    "ceph-fuse": "network filesystem",
    "glusterfs": "network filesystem",
    "cvmfs2": "network filesystem",
    "davfs": "WebDAV",
    "curlftpfs": "FTP",
}
"""FUSE tools that fetch their files over the network, by subtype, with what they talk to."""

# The kernel's dev_t, as fusectl prints it: MINORBITS is 20 (include/linux/kdev_t.h),
# unlike the userspace encoding that os.makedev uses.
_MINORBITS = 20
# virtiofs is a FUSE transport: its connections are listed in fusectl too.
_FUSE_FSTYPES = frozenset({"fuse", "fuseblk", "virtiofs"})
# No FUSE daemon holds more descriptors than this worth reading; a process with more
# (a training job with a million open files) is not the daemon, or is read only in part.
_MAX_FDS_PER_PROCESS = 65536
_DEV_FUSE = "/dev/fuse"


def fuse_subtype(fstype: str) -> str | None:
    """``'rclone'`` for ``fuse.rclone``, ``''`` for plain ``fuse``/``fuseblk``, None if not FUSE."""
    if fstype in ("fuse", "fuseblk"):
        return ""
    for prefix in ("fuse.", "fuseblk."):
        if fstype.startswith(prefix):
            return fstype[len(prefix):]
    return None


def fuse_tool(mount: MountEntry) -> str | None:
    """The name of the FUSE tool behind a mount: its subtype, else its source when that
    is a bare name (mountpoint-s3 and blobfuse2 mount as plain ``fuse`` with their name
    as the source); ``''`` when unknown, None when the mount is not FUSE."""
    sub = fuse_subtype(mount.fstype)
    if sub is None or sub:
        return sub
    source = mount.source
    if source and "/" not in source and ":" not in source:
        return source
    return ""


def fuse_connection(mount: MountEntry) -> int | None:
    """The FUSE connection number of a mount, which names /sys/fs/fuse/connections/<N>.

    fs/fuse/control.c names each connection's folder after ``fc->dev``, the
    superblock's device number in the kernel's encoding: for ``fuse`` (an
    anonymous device, major 0) that is the minor of the files' st_dev; for
    ``fuseblk`` it is (major << 20) | minor of the block device. None when
    the mount is not FUSE.
    """
    if fuse_subtype(mount.fstype) is None and mount.fstype not in _FUSE_FSTYPES:
        return None
    major, minor = mount.devnum
    return (major << _MINORBITS) | minor


def read_waiting(conn: int, sys_root: str = "/sys") -> int | None:
    """Requests of connection ``conn`` sent to the daemon and not yet answered.

    None when the file cannot be read (fusectl not mounted, as in most
    containers; not root) or does not hold a count.
    """
    try:
        text = read_text(os.path.join(sys_root, "fs", "fuse", "connections", str(conn), "waiting"))
    except StatsUnavailableError:
        return None
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        return None
    return int(value)


def _holds_dev_fuse(fd_dir: str) -> bool:
    try:
        with os.scandir(fd_dir) as it:
            for n, entry in enumerate(it):
                if n >= _MAX_FDS_PER_PROCESS:
                    return False
                try:
                    if os.readlink(entry.path) == _DEV_FUSE:
                        return True
                except OSError:
                    continue
    except OSError:  # gone, or another user's process without root
        return False
    return False


def _mentions(pid_dir: str, mount_point: str) -> bool:
    """Whether the process's arguments name ``mount_point``, relative to its cwd or not."""
    try:
        with open(os.path.join(pid_dir, "cmdline"), "rb") as fh:
            args = fh.read(1 << 20).split(b"\0")
    except OSError:
        return False
    try:
        cwd = os.readlink(os.path.join(pid_dir, "cwd"))
    except OSError:
        cwd = ""
    target = os.path.normpath(mount_point)
    for raw in args:
        if not raw:
            continue
        arg = os.fsdecode(raw)
        if os.path.isabs(arg):
            if os.path.normpath(arg) == target:
                return True
        elif cwd and os.path.normpath(os.path.join(cwd, arg)) == target:
            return True
    return False


def find_daemon(mount_point: str, proc_root: str = "/proc") -> int | None:
    """The pid of the FUSE daemon serving ``mount_point``, when it runs here.

    The candidates are the processes holding /dev/fuse open (/proc is walked
    once). One candidate is the answer; among several, the one whose command
    line names the mount point (the lowest pid if more than one does). None
    when there is no candidate, when several remain and none names the mount
    point (a guess would put another daemon's CPU on this mount), or when
    the descriptors cannot be read (not root, another pid namespace).
    """
    try:
        names = [e.name for e in os.scandir(proc_root) if e.name.isdigit()]
    except OSError:
        return None
    holders = sorted(int(n) for n in names
                     if _holds_dev_fuse(os.path.join(proc_root, n, "fd")))
    if not holders:
        return None
    if len(holders) == 1:
        return holders[0]
    for pid in holders:
        if _mentions(os.path.join(proc_root, str(pid)), mount_point):
            return pid
    return None


@dataclass(frozen=True, slots=True)
class FuseDaemonSample:
    """A FUSE daemon's cumulative counters at one moment."""

    pid: int
    """The daemon's process id."""
    cpu_ticks: int
    """User plus system CPU time, in clock ticks (CLK_TCK per second)."""
    rchar: int | None
    """Bytes read through read-like syscalls: requests from /dev/fuse and, for a
    daemon that uses read(2) on its sockets (Go's net package does), the network.
    None when /proc/<pid>/io is not readable."""
    wchar: int | None
    """Bytes written through write-like syscalls, replies to /dev/fuse included: a
    reading daemon's wchar grows by at least the bytes it serves. None when unreadable."""


def read_daemon_sample(pid: int, proc_root: str = "/proc") -> FuseDaemonSample | None:
    """The daemon's CPU ticks and byte counters, or None when it is gone."""
    base = os.path.join(proc_root, str(pid))
    try:
        st = parse_proc_stat(read_text(os.path.join(base, "stat")))
    except StatsUnavailableError:
        return None
    if st is None:
        return None
    try:
        io = parse_proc_io(read_text(os.path.join(base, "io")))
    except StatsUnavailableError:
        io = None
    return FuseDaemonSample(pid, st.utime_ticks + st.stime_ticks,
                            io.rchar if io else None, io.wchar if io else None)


def daemon_rates(prev: FuseDaemonSample, cur: FuseDaemonSample, seconds: float,
                 clk_tck: int = CLK_TCK) -> dict[str, float]:
    """``cpu_pct`` (of one CPU), ``rchar_per_s`` and ``wchar_per_s`` over the interval.

    Byte rates are left out when either sample lacks them; all figures are
    empty when the samples are of different processes. Raises ValueError
    unless ``seconds`` is positive.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive (got {seconds}): pass the interval "
                         "between the two samples")
    if prev.pid != cur.pid:
        return {}
    out = {"cpu_pct": max(0, cur.cpu_ticks - prev.cpu_ticks) / clk_tck / seconds * 100}
    if prev.rchar is not None and cur.rchar is not None:
        out["rchar_per_s"] = max(0, cur.rchar - prev.rchar) / seconds
    if prev.wchar is not None and cur.wchar is not None:
        out["wchar_per_s"] = max(0, cur.wchar - prev.wchar) / seconds
    return out
