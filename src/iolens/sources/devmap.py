"""Which block devices serve a path: dataset, checkpoint or log folder -> disks to watch."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from iolens.sources._files import as_bytes
from iolens.sources.sysblock import kernel_name

# Filesystems that live in memory or on a network, and so have no block device.
_MEMORY_FS = frozenset({"tmpfs", "ramfs", "devtmpfs", "shm", "hugetlbfs", "proc", "sysfs"})
_MAX_SLAVE_DEPTH = 8  # dm on md on dm...: deeper than any real stack
_NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs",
                         "lustre", "virtiofs", "afs"})


@dataclass(frozen=True, slots=True)
class MountEntry:
    """One line of /proc/<pid>/mountinfo."""

    devnum: tuple[int, int]
    """The st_dev the mount's files report (major 0 for filesystems without one block device)."""
    root: str
    """The folder of the filesystem mounted here (not "/" for bind mounts and subvolumes)."""
    mount_point: str
    """Where it is mounted."""
    fstype: str
    """Filesystem type, e.g. ``ext4``, ``overlay``, ``fuse.sshfs``."""
    source: str
    """Mount source, e.g. ``/dev/sda1``, ``server:/export``, ``tmpfs``."""
    super_options: str
    """Per-superblock options (overlayfs lists lowerdir, upperdir here)."""


_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")


def _unescape(field: bytes) -> str:
    """Undo mountinfo's octal escapes (space, tab, newline, backslash); names need not be UTF-8."""
    raw = _OCTAL_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field)
    return os.fsdecode(raw)


class MountTable(list[MountEntry]):
    """The entries of a mountinfo file, with the count of lines that did not fit."""

    skipped: int = 0
    """Lines that are not blank and do not have mountinfo's format."""


def parse_mountinfo(text: str | bytes) -> MountTable:
    """Parse mountinfo text; lines that do not fit the format are skipped and counted."""
    data = as_bytes(text)
    entries = MountTable()
    for line in data.splitlines():
        if not line.strip():
            continue
        left, sep, right = line.partition(b" - ")
        fields = left.split()
        tail = right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            entries.skipped += 1
            continue
        major_s, _, minor_s = fields[2].partition(b":")
        try:
            devnum = (int(major_s), int(minor_s))
        except ValueError:
            entries.skipped += 1
            continue
        if devnum[0] < 0 or devnum[1] < 0:
            entries.skipped += 1
            continue
        entries.append(MountEntry(devnum, _unescape(fields[3]), _unescape(fields[4]),
                                  os.fsdecode(tail[0]), _unescape(tail[1]),
                                  os.fsdecode(tail[2]) if len(tail) > 2 else ""))
    return entries


def read_mountinfo(proc_root: str = "/proc") -> list[MountEntry] | None:
    """This process's mounts, or ``None`` when mountinfo cannot be read."""
    try:
        with open(os.path.join(proc_root, "self", "mountinfo"), "rb") as fh:
            return parse_mountinfo(fh.read(16 << 20))
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class DeviceMapping:
    """The answer of :func:`device_for_path`."""

    path: str
    """The path asked about, made absolute."""
    existing: str
    """The nearest existing path that was examined (the path itself if it exists)."""
    fstype: str
    """Filesystem type of the mount holding it ('' if unknown)."""
    mount_point: str
    """Mount point of that filesystem ('' if unknown)."""
    device: str | None
    """The block device that holds the filesystem (``sda1``, ``dm-0``, ``loop0``), if any."""
    disks: tuple[str, ...]
    """The devices whose counters show this path's I/O: whole disks, the members of
    device-mapper and md devices, or the loop device itself. Empty when none."""
    reason: str = ""
    """Why ``disks`` is empty, in one sentence, or a note on how they were found."""
    backing_file: str = ""
    """For a loop device, the file behind it."""

    @property
    def has_block_device(self) -> bool:
        """True when at least one device's counters show this path's I/O."""
        return bool(self.disks)


def nearest_existing(path: str) -> str:
    """``path`` itself, or its nearest existing parent (a file not yet written maps through it)."""
    cur = os.path.abspath(path)
    while not os.path.exists(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    return cur


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def resolve_devnum(major: int, minor: int,
                   sys_root: str = "/sys") -> tuple[str, tuple[str, ...]] | None:
    """The kernel name of a device number and the disks under it, from sysfs.

    Partitions resolve to their disk; device-mapper and md devices to the
    disks of their members (``slaves/``), each counted once. ``None`` when
    sysfs does not know the number.
    """
    link = os.path.join(sys_root, "dev", "block", f"{major}:{minor}")
    if not os.path.exists(link):
        return None
    return _resolve_dir(os.path.realpath(link), 0)


def _resolve_dir(devdir: str, depth: int) -> tuple[str, tuple[str, ...]]:
    name = kernel_name(os.path.basename(devdir))
    diskdir = devdir
    if os.path.exists(os.path.join(devdir, "partition")):
        diskdir = os.path.dirname(devdir)
    disk = kernel_name(os.path.basename(diskdir))
    disks: list[str] = []
    slaves_dir = os.path.join(devdir, "slaves")
    try:
        slaves = sorted(os.listdir(slaves_dir))
    except OSError:
        slaves = []
    if not slaves and diskdir != devdir:
        # A partition of a dm or md device: the members sit under the whole device.
        try:
            slaves_dir = os.path.join(diskdir, "slaves")
            slaves = sorted(os.listdir(slaves_dir))
        except OSError:
            slaves = []
    if slaves and depth < _MAX_SLAVE_DEPTH:
        for slave in slaves:
            _, below = _resolve_dir(os.path.realpath(os.path.join(slaves_dir, slave)), depth + 1)
            disks.extend(d for d in below if d not in disks)
    else:
        disks.append(disk)
    return name, tuple(disks)


def _mount_for(entries: list[MountEntry], existing: str,
               devnum: tuple[int, int]) -> MountEntry | None:
    real = os.path.realpath(existing)

    def prefix_len(e: MountEntry) -> int:
        mp = e.mount_point.rstrip("/") or "/"
        if real == mp or real.startswith(mp if mp == "/" else mp + "/"):
            return len(mp)
        return -1

    candidates = [e for e in entries if e.devnum == devnum and prefix_len(e) >= 0]
    if not candidates:
        candidates = [e for e in entries if prefix_len(e) >= 0]
    if not candidates:
        return None
    # The last of the longest mount points wins: later mounts hide earlier ones.
    best = max(prefix_len(e) for e in candidates)
    return [e for e in candidates if prefix_len(e) == best][-1]


def device_for_path(path: str, proc_root: str = "/proc", sys_root: str = "/sys") -> DeviceMapping:
    """Map a path to the block devices that serve it.

    A path that does not exist yet maps through its nearest existing parent.
    Filesystems without a block device (tmpfs, NFS, FUSE) give an empty
    ``disks`` and a ``reason``; the per-process counters in /proc/<pid>/io
    are then the only signal of their I/O. Raises ValueError for an empty
    path and OSError when even the nearest existing parent cannot be examined.
    """
    if not path:
        raise ValueError("empty path")
    entries = read_mountinfo(proc_root)
    return _map_path(path, entries, proc_root, sys_root, set())


def _map_path(path: str, entries: list[MountEntry] | None, proc_root: str, sys_root: str,
              visited: set[str]) -> DeviceMapping:
    abspath = os.path.abspath(path)
    existing = nearest_existing(abspath)
    st = os.stat(existing)
    devnum = (os.major(st.st_dev), os.minor(st.st_dev))
    mount = _mount_for(entries or [], existing, devnum)
    fstype = mount.fstype if mount else ""
    mount_point = mount.mount_point if mount else ""

    def mapping(device: str | None, disks: tuple[str, ...], reason: str = "",
                backing: str = "") -> DeviceMapping:
        return DeviceMapping(abspath, existing, fstype, mount_point, device, disks, reason, backing)

    if devnum[0] != 0:
        resolved = resolve_devnum(*devnum, sys_root=sys_root)
        if resolved is not None:
            name, disks = resolved
            backing = _read(os.path.join(sys_root, "block", name.replace("/", "!"),
                                         "loop", "backing_file"))
            return mapping(name, disks, "", backing)
        return mapping(None, (), f"device {devnum[0]}:{devnum[1]} is not listed in "
                                 f"{sys_root}/dev/block")
    if entries is None:
        return mapping(None, (), f"{proc_root}/self/mountinfo cannot be read, so the "
                                 f"filesystem of {existing} is unknown")
    if mount is None:
        return mapping(None, (), f"no mount found for {existing} in {proc_root}/self/mountinfo")
    base = fstype.split(".")[0]
    if fstype in _MEMORY_FS:
        return mapping(None, (), f"no block device ({fstype}: its files live in memory)")
    if base in _NETWORK_FS:
        return mapping(None, (), f"no block device ({fstype} from {mount.source}: a network "
                                 "filesystem; per-process counters show its I/O)")
    if base in ("fuse", "fuseblk") and not mount.source.startswith("/dev/"):
        return mapping(None, (), f"no block device ({fstype}: a FUSE filesystem; "
                                 "per-process counters show its I/O)")
    if fstype == "overlay":
        return _map_overlay(mount, entries, proc_root, sys_root, visited=visited, mapping=mapping)
    if mount.source.startswith("/dev/"):
        # btrfs and others report an anonymous device number; the source names the disk.
        try:
            rdev = os.stat(mount.source).st_rdev
        except (OSError, ValueError):  # ValueError: a NUL, written \000 in mountinfo
            rdev = 0
        if rdev:
            resolved = resolve_devnum(os.major(rdev), os.minor(rdev), sys_root)
            if resolved is not None:
                name, disks_t = resolved
                return mapping(name, disks_t, f"{fstype} on {mount.source}")
    return mapping(None, (), f"no block device ({fstype or 'unknown filesystem'} "
                             f"from {mount.source or '?'})")


def _map_overlay(mount: MountEntry, entries: list[MountEntry], proc_root: str, sys_root: str,
                 *, visited: set[str], mapping: Callable[..., DeviceMapping]) -> DeviceMapping:
    # Each overlay is followed once: inside a container the layer folders do not
    # exist, and mapping them through their parents would land on this overlay again.
    visited.add(mount.mount_point)
    layers: list[str] = []
    for opt in mount.super_options.split(","):
        key, _, value = opt.partition("=")
        if key in ("lowerdir", "upperdir"):
            layers.extend(_unescape(os.fsencode(p)) for p in value.split(":") if p)
    disks: list[str] = []
    missing = 0
    for layer in layers:
        if not os.path.exists(layer):
            missing += 1
            continue
        sub_mount = _mount_for(entries, layer, (-1, -1))
        if sub_mount is not None and sub_mount.mount_point in visited:
            continue
        sub = _map_path(layer, entries, proc_root, sys_root, visited)
        disks.extend(d for d in sub.disks if d not in disks)
    note = "overlayfs: the devices of its layers" if disks else \
        "no block device found for overlayfs"
    if missing:
        note += (f" ({missing} of {len(layers)} layer folders are not visible here, as "
                 "inside a container)")
    return mapping(None, tuple(disks), note)
