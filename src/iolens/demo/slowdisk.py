"""A real slow disk to train on: a throttled, file-backed loop device (root only).

    with SlowDisk(256 << 20, read_bps=8 << 20) as disk:
        ...write the dataset under disk.mount_point...
        disk.evict()                # its pages leave the page cache (drop_caches(): all pages)
        disk.join(os.getpid())      # this process and the children it forks later
        ...train...

The loop device carries ext4 and sits on a sparse file in a temporary folder.
Reads are throttled by a cgroup v1 blkio group whose limit is set on the
disk that holds the backing file, not on the loop device: the loop device
then stays busy while its requests wait below it, so /proc/diskstats shows it
saturated (high %util, await of tens of ms), as a real slow disk would be.
A limit on the loop device itself (``above=True``) holds the requests above it
and leaves its %util low, as a cgroup's io.max on a cloud volume does. The
loop device uses direct I/O where it can, so its reads reach the backing disk
instead of that disk's page cache.

Only the processes that join the group are throttled; the recorder
(``iolens run``) stays outside it. Everything is undone on exit, in reverse
order, also after an error, Ctrl-C, SIGTERM or SIGHUP: the joined processes
go back to their cgroup, the cgroup is removed, the filesystem unmounted,
the loop device detached and the temporary folder deleted. Leftovers of a
process that was killed outright are removed by the next :class:`SlowDisk`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType, TracebackType

from iolens.sources.devmap import device_for_path, read_mountinfo
from iolens.sources.procfs import pid_alive
from iolens.sources.sysblock import sysfs_name

PREFIX = "iolens-slowdisk-"
"""Name prefix of the cgroups and temporary folders a slow disk makes (then the owner's pid)."""
TOOLS = ("losetup", "mkfs.ext4", "mount", "umount")
_SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"
_TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SlowDiskUnavailable(RuntimeError):
    """This machine or user cannot make a slow disk; ``missing`` says what is lacking."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = list(missing)
        super().__init__("cannot make a slow disk: needs " + "; ".join(self.missing))


class SlowDiskCleanupError(RuntimeError):
    """Part of a slow disk could not be removed; the message says which and what is left."""


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=os.environ.get("PATH", "") + os.pathsep + _SBIN_PATH)


def find_blkio_root(proc_root: str = "/proc") -> str | None:
    """Mount point of the cgroup v1 hierarchy that holds the blkio controller, if mounted."""
    for entry in read_mountinfo(proc_root) or []:
        if entry.fstype == "cgroup" and "blkio" in entry.super_options.split(",") \
                and entry.root == "/":
            return entry.mount_point
    return None


def missing_requirements(blkio_root: str | None = None) -> list[str]:
    """What this process lacks to make a slow disk, one short phrase each (empty: all there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append(f"root (running as uid {os.geteuid()})")
    tools = [t for t in TOOLS if _which(t) is None]
    if tools:
        missing.append(" and ".join(tools) + " (util-linux, e2fsprogs)")
    if not os.path.exists("/dev/loop-control"):
        missing.append("loop devices (no /dev/loop-control)")
    root = blkio_root or find_blkio_root()
    if root is None:
        missing.append("a cgroup v1 blkio hierarchy (none is mounted; cgroup v2 alone has no "
                       "blkio.throttle files)")
    elif not os.path.exists(os.path.join(root, "blkio.throttle.read_bps_device")):
        missing.append(f"blk-throttle (no blkio.throttle.read_bps_device under {root})")
    return missing


def _run(*args: str) -> str:
    tool = _which(args[0]) or args[0]
    done = subprocess.run([tool, *args[1:]], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise OSError(f"{' '.join(args)} failed: {detail[-1] if detail else done.returncode}")
    return done.stdout


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _pids_in(cgroup: str) -> list[int]:
    return [int(p) for p in _read(os.path.join(cgroup, "cgroup.procs")).split()]


def _blkio_cgroup_of(pid: int, blkio_root: str) -> str:
    """The blkio cgroup folder ``pid`` is in now (the hierarchy's root if unknown)."""
    for line in _read(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if "blkio" in controllers.split(","):
            return os.path.join(blkio_root, path.lstrip("/"))
    return blkio_root


def _owner(name: str) -> int | None:
    """The pid in a name made by a slow disk (``iolens-slowdisk-<pid>...``), else None."""
    if not name.startswith(PREFIX):
        return None
    digits = ""
    for ch in name[len(PREFIX):]:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None


def _move(pid: int, to: str, fallback: str) -> None:
    try:
        _write(os.path.join(to, "cgroup.procs"), str(pid))
    except ProcessLookupError:  # exited meanwhile
        pass
    except OSError:  # ``to`` went away meanwhile
        with contextlib.suppress(OSError):
            _write(os.path.join(fallback, "cgroup.procs"), str(pid))


def _empty_cgroup(cgroup: str, to: str, fallback: str, tries: int = 50) -> None:
    """Move every process out of ``cgroup`` into ``to`` (else ``fallback``), then remove it."""
    for attempt in range(tries):
        for pid in _pids_in(cgroup):
            _move(pid, to, fallback)
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError:  # a process was still on its way out, or forked meanwhile
            if attempt == tries - 1:
                raise
            time.sleep(0.02)


def _mount_points() -> list[str]:
    return [e.mount_point for e in read_mountinfo() or []]


def _unmount(mount_point: str) -> None:
    """Unmount, retrying while files are still open there, then lazily."""
    for _ in range(20):
        if mount_point not in _mount_points():
            return
        try:
            _run("umount", mount_point)
            return
        except OSError:
            time.sleep(0.1)
    _run("umount", "-l", mount_point)


def reap_stale(blkio_root: str | None = None, tmp_dir: str | None = None) -> list[str]:
    """Remove what slow disks of processes that no longer exist left behind.

    A slow disk killed outright (SIGKILL) cannot clean up; its cgroup, mount,
    loop device and folder carry its pid in their names. Returns what was removed.
    """
    removed: list[str] = []
    root = blkio_root or find_blkio_root()
    if root is not None:
        for name in _listdir(root):
            owner = _owner(name)
            if owner is None or pid_alive(owner):
                continue
            with contextlib.suppress(OSError):
                _empty_cgroup(os.path.join(root, name), root, root, tries=5)
                removed.append(os.path.join(root, name))
    base = tmp_dir or tempfile.gettempdir()
    for name in _listdir(base):
        owner = _owner(name)
        folder = os.path.join(base, name)
        if owner is None or pid_alive(owner) or not os.path.isdir(folder):
            continue
        for mp in [m for m in _mount_points() if m.startswith(folder + "/")]:
            with contextlib.suppress(OSError):
                _run("umount", "-l", mp)
                removed.append(mp)
        backing = os.path.join(folder, "disk.img")
        if os.path.exists(backing):
            with contextlib.suppress(OSError):
                for line in _run("losetup", "--associated", backing).splitlines():
                    dev = line.split(":", 1)[0]
                    _run("losetup", "--detach", dev)
                    removed.append(dev)
        with contextlib.suppress(OSError):
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def drop_cached(paths: Iterable[str]) -> None:
    """Drop the cached clean pages of the files at ``paths`` (posix_fadvise DONTNEED); a file
    that cannot be opened is passed over."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_cached_tree(root: str) -> None:
    """:func:`drop_cached` for every file under ``root``."""
    drop_cached(os.path.join(folder, f) for folder, _, files in os.walk(root) for f in files)


class SlowDisk:
    """A throttled loop device with ext4 mounted on it; a context manager (see the module)."""

    def __init__(self, size: int = 256 << 20, *, read_bps: int | None = None,
                 read_iops: int | None = None, write_bps: int | None = None,
                 direct_io: bool = True, tmp_dir: str | None = None,
                 blkio_root: str | None = None, above: bool = False) -> None:
        """``size`` bytes of disk; reads limited to ``read_bps`` bytes/s and/or
        ``read_iops`` requests/s, writes to ``write_bps`` bytes/s, on the backing
        disk for the processes that join. The loop driver charges its I/O on the
        backing file to the cgroup of the process whose request it serves, which
        is why a limit on the backing disk saturates the loop device itself.

        ``above``: the limits are set on the loop device itself instead, as a cgroup's
        io.max on a volume: the requests wait above the device, whose %util stays low
        while the readers wait."""
        if read_bps is None and read_iops is None and write_bps is None:
            raise ValueError("give read_bps, read_iops or write_bps")
        for what, value in (("read_bps", read_bps), ("read_iops", read_iops),
                            ("write_bps", write_bps)):
            if value is not None and value <= 0:
                raise ValueError(f"{what} must be positive, not {value}")
        if size < 16 << 20:
            raise ValueError(f"size must be at least 16 MiB, not {size}")
        self.size = size
        self.read_bps = read_bps
        self.read_iops = read_iops
        self.write_bps = write_bps
        self.want_direct_io = direct_io
        self.above = above
        self.tmp_dir = tmp_dir or tempfile.gettempdir()
        self._blkio_root = blkio_root
        self.blkio_root = ""
        self.workdir = ""
        self.backing_file = ""
        self.loop_device = ""
        """``/dev/loopN``."""
        self.loop_name = ""
        """``loopN``, as /proc/diskstats and iolens name it."""
        self.mount_point = ""
        self.cgroup = ""
        self.backing_disks: dict[str, str] = {}
        """Disk name -> ``major:minor``: where the throttle is set."""
        self.direct_io = False
        """Whether the loop device reads its backing file with direct I/O."""
        self._undo: list[tuple[str, Callable[[], None]]] = []
        self._return_to = ""
        self._signals: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    # -- setup ------------------------------------------------------------------

    def open(self) -> SlowDisk:
        """Build the disk; on any failure what was built is removed and the error raised."""
        if self._undo:
            raise RuntimeError("this slow disk is already open")
        missing = missing_requirements(self._blkio_root)
        if missing:
            raise SlowDiskUnavailable(missing)
        self.blkio_root = self._blkio_root or find_blkio_root() or ""
        mapping = device_for_path(self.tmp_dir)
        if not mapping.disks:
            raise SlowDiskUnavailable([f"a temporary folder on a disk ({self.tmp_dir}: "
                                       f"{mapping.reason})"])
        for disk in mapping.disks:
            devnum = _read(os.path.join("/sys/block", sysfs_name(disk), "dev"))
            if not devnum:
                raise SlowDiskUnavailable([f"the device number of {disk} (/sys/block)"])
            self.backing_disks[disk] = devnum
        with contextlib.suppress(OSError):
            reap_stale(self.blkio_root, self.tmp_dir)
        try:
            self._build()
        except BaseException:
            self._teardown(quiet=True)
            raise
        return self

    def _build(self) -> None:
        self.workdir = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.tmp_dir)
        self._undo.append(("remove " + self.workdir, lambda: shutil.rmtree(self.workdir)))
        self.backing_file = os.path.join(self.workdir, "disk.img")
        with open(self.backing_file, "wb") as fh:
            fh.truncate(self.size)

        # Each undo is registered before its step, so a signal in the middle of a step
        # (losetup done, its output not yet read) still leaves nothing behind.
        self._undo.append(("detach the loop device of " + self.backing_file, self._detach))
        try:
            self.loop_device = self._attach(direct_io=self.want_direct_io)
        except OSError:
            if not self.want_direct_io:
                raise
            self._detach()  # direct I/O refused here: buffered I/O still makes a slow disk
            self.loop_device = self._attach(direct_io=False)
        self.loop_name = os.path.basename(self.loop_device)
        self.direct_io = _read(f"/sys/block/{self.loop_name}/loop/dio") == "1"

        # 4 KiB blocks and inode tables written now: no background ext4lazyinit
        # writes to the device while it is measured.
        _run("mkfs.ext4", "-q", "-F", "-b", "4096", "-i", "16384", "-m", "0",
             "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop_device)
        self.mount_point = os.path.join(self.workdir, "mnt")
        os.mkdir(self.mount_point)
        self._undo.append(("unmount " + self.mount_point, lambda: _unmount(self.mount_point)))
        _run("mount", "-t", "ext4", "-o", "noatime", self.loop_device, self.mount_point)

        name = f"{PREFIX}{os.getpid()}"
        n = 0
        while True:
            self.cgroup = os.path.join(self.blkio_root, name if n == 0 else f"{name}.{n}")
            try:
                os.mkdir(self.cgroup)
                break
            except FileExistsError:
                n += 1
        self._undo.append(("remove cgroup " + self.cgroup,
                           lambda: _empty_cgroup(self.cgroup, self._return_to or self.blkio_root,
                                                 self.blkio_root)))
        targets = list(self.backing_disks.values())
        if self.above:
            devnum = _read(f"/sys/block/{self.loop_name}/dev")
            if not devnum:
                raise SlowDiskUnavailable([f"the device number of {self.loop_name} (/sys/block)"])
            targets = [devnum]
        for devnum in targets:
            if self.read_bps is not None:
                _write(os.path.join(self.cgroup, "blkio.throttle.read_bps_device"),
                       f"{devnum} {self.read_bps}")
            if self.read_iops is not None:
                _write(os.path.join(self.cgroup, "blkio.throttle.read_iops_device"),
                       f"{devnum} {self.read_iops}")
            if self.write_bps is not None:
                _write(os.path.join(self.cgroup, "blkio.throttle.write_bps_device"),
                       f"{devnum} {self.write_bps}")

    def _attach(self, *, direct_io: bool) -> str:
        args = ["losetup", "--find", "--show"] + (["--direct-io=on"] if direct_io else [])
        return _run(*args, self.backing_file).strip()

    def _detach(self) -> None:
        """Detach every loop device on the backing file (one that is still in use lets go
        when it is closed)."""
        for line in _run("losetup", "--associated", self.backing_file).splitlines():
            _run("losetup", "--detach", line.split(":", 1)[0])

    # -- use --------------------------------------------------------------------

    def join(self, pid: int) -> None:
        """Throttle process ``pid`` (all its threads) and the children it forks from now on."""
        if not self.cgroup:
            raise RuntimeError("the slow disk is not open")
        if not self._return_to:
            self._return_to = _blkio_cgroup_of(pid, self.blkio_root)
        _write(os.path.join(self.cgroup, "cgroup.procs"), str(pid))

    def drop_caches(self) -> None:
        """Write dirty data back and drop the whole machine's page cache (as
        ``echo 3 > /proc/sys/vm/drop_caches``), so the next reads reach the disk.

        A joined process then reads its own code pages back through the throttle
        too, when the backing disk also holds them; :meth:`evict` spares them."""
        os.sync()
        _write("/proc/sys/vm/drop_caches", "3")

    def evict(self) -> None:
        """Drop the cached pages of this disk's files only, so the next reads reach the disk
        while the rest of the machine keeps its page cache."""
        os.sync()
        drop_cached([self.backing_file])
        drop_cached_tree(self.mount_point)

    def describe(self) -> str:
        """One line on what was set up."""
        limits = []
        if self.read_bps is not None:
            limits.append(f"{self.read_bps / (1 << 20):g} MiB/s")
        if self.read_iops is not None:
            limits.append(f"{self.read_iops} reads/s")
        if self.write_bps is not None:
            limits.append(f"writes to {self.write_bps / (1 << 20):g} MiB/s")
        disks = ", ".join(f"{d} ({n})" for d, n in self.backing_disks.items())
        where = ("loop device itself, above it" if self.above
                 else f"backing disk {disks}")
        io = "direct I/O" if self.direct_io else "buffered I/O"
        return (f"{self.loop_device} ({self.size >> 20} MiB ext4 on {self.backing_file}, "
                f"{io}) mounted at {self.mount_point}; reads of the processes in blkio cgroup "
                f"{os.path.basename(self.cgroup)} limited to {' and '.join(limits)} on the "
                f"{where}")

    # -- teardown ---------------------------------------------------------------

    def close(self) -> None:
        """Undo everything, in reverse order. Raises SlowDiskCleanupError naming what is left."""
        self._teardown(quiet=False)

    def _teardown(self, *, quiet: bool) -> None:
        """Run every undo step, the last registered first; a failed step does not stop the
        others. ``quiet`` prints the failures instead of raising them."""
        errors = []
        with _signals_ignored():
            while self._undo:
                what, undo = self._undo.pop()
                try:
                    undo()
                except Exception as exc:  # noqa: BLE001 - every later step must still run
                    errors.append(f"{what}: {exc}")
        self.cgroup = ""
        if not errors:
            return
        message = "slow disk cleanup incomplete: " + "; ".join(errors)
        if not quiet:
            raise SlowDiskCleanupError(message)
        print(message, file=sys.stderr)

    def __enter__(self) -> SlowDisk:
        self._catch_signals()
        try:
            return self.open()
        except BaseException:
            self._restore_signals()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            # After an error the cleanup problems are printed, not raised, so the
            # error that ended the body is the one the caller sees.
            self._teardown(quiet=exc is not None)
        finally:
            self._restore_signals()

    def _catch_signals(self) -> None:
        """SIGTERM and SIGHUP end the body with SystemExit(128+N), so the cleanup runs."""
        if threading.current_thread() is not threading.main_thread():
            return

        def stop(signum: int, frame: FrameType | None) -> None:
            del frame
            raise SystemExit(128 + signum)

        for s in (signal.SIGTERM, signal.SIGHUP):
            self._signals[s] = signal.signal(s, stop)

    def _restore_signals(self) -> None:
        for s, handler in self._signals.items():
            signal.signal(s, handler)
        self._signals.clear()


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """Let no Ctrl-C or SIGTERM cut a cleanup short (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in _TEARDOWN_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
