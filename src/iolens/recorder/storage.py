"""What serves the dataset: the folders the input pipeline opens files in, mapped to storage.

NOTE [storage roles]: each entry has a role. A folder the job both writes files in and
reads them from is a ``cache`` (a streaming library that copies shards there, then
reads them); where there is a cache, the storage the job only reads is the ``source``
the copies come from; otherwise it is the ``dataset``.

NOTE [dataset folders]: the DataLoader workers (and the training process with
num_workers=0) note every folder they open files in (an audit hook, see
iolens/training/_hooks.py); the recorder maps each to the mount that holds
it. A block device is then watched like a ``--path`` (its iostat figures in
every record from then on); a filesystem with no block device is named as
such, with the figures it has: FUSE (its subtype, the requests waiting on
its connection, the daemon's CPU and I/O where it runs here) and NFS (the
mountstats figures of nfsiostat). meta.json lists what was found and why.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from iolens.recorder.network import NetWatch
from iolens.sources import fuse
from iolens.sources.devmap import MountEntry, device_for_path, read_mountinfo
from iolens.sources.procfs import CLK_TCK, ProcessTable, ProcIO

if TYPE_CHECKING:
    from iolens.sources import nfs

_FOLDERS_SHOWN = 5
"""Folders listed per mount in meta.json (the rest are counted)."""
_MOUNTS_MAX = 16
"""Mounts followed at most: a job that opens files everywhere is not a dataset."""
_FOLDERS_MAX = 4096
"""Folders remembered at most (each worker notes 64 at most, NOTE [dataset folders])."""


def kind_of(fstype: str, device: str | None) -> str:
    """``block``, ``fuse``, ``nfs``, ``tmpfs``, ``overlay`` or ``other``: how the figures of
    a filesystem of type ``fstype`` are to be read."""
    if fuse.fuse_subtype(fstype) is not None:
        return "fuse"
    if fstype in ("nfs", "nfs4"):
        return "nfs"
    if fstype in ("tmpfs", "ramfs"):
        return "tmpfs"
    if device:
        return "block"
    if fstype == "overlay":
        return "overlay"
    return "other"


def page_cache_visible(kind: str) -> bool:
    """Whether ``1 - read_bytes/rchar`` means the page cache's share for this storage.

    Only reads of a block device count in read_bytes; FUSE, NFS and tmpfs reads
    never do, so there the figure would claim a cache hit it cannot see.
    """
    return kind in ("block", "overlay")


@dataclass
class Served:
    """One mount that serves the dataset."""

    mount: str
    fstype: str
    device: str | None
    disks: list[str]
    kind: str
    source: str = ""
    folders: list[str] = field(default_factory=list)
    more_folders: int = 0
    connection: int | None = None
    daemon: int | None = None
    largest: int = 0
    """The size of the largest data file seen open or mapped there (bytes): a dataset in
    one large file (LMDB, HDF5, Arrow, tar shards) is not packed again."""
    _opens: dict[tuple[int, str], int] = field(default_factory=dict)
    """(pid, folder) -> the most opens that process reported there (0: mapped files)."""
    maps: bool = False
    """Whether a process of the job mapped a data file there (NOTE [opened and mapped])."""

    def count(self, pid: int, folder: str, opens: int) -> None:
        key = (pid, folder)
        if opens == 0:
            self.maps = True
        if opens > self._opens.get(key, -1):
            self._opens[key] = opens

    @property
    def opens(self) -> int:
        """Files opened in this mount's folders, as the processes reported them (at 1, 10,
        100 ... opens each): the measure of which mount is the dataset's."""
        return sum(self._opens.values())
    _daemon_prev: tuple[int, ProcIO] | None = None
    _nfs_prev: nfs.NfsMount | None = None  # (a string annotation: nfs loads lazily)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mount": self.mount, "fstype": self.fstype,
                               "device": self.device, "kind": self.kind, "source": self.source,
                               "disks": self.disks, "folders": self.folders,
                               "page_cache_visible": page_cache_visible(self.kind)}
        if self.more_folders:
            out["more_folders"] = self.more_folders
        out["opens"] = self.opens
        if self.largest:
            out["largest_file"] = self.largest
        if self.maps:
            # NOTE [opened and mapped]: found in the memory maps. numpy.memmap and LMDB
            # open their file (numpy in the dataset's __init__, before the workers fork)
            # and read it through the map: the opens do not make it a file read with
            # read(). Marked only where nothing was opened, a 200 MB memmap opened at
            # init was told "it reads no dataset file while it waits": its page faults
            # were not counted as the dataset's.
            out["mapped"] = True
        if self.kind == "fuse":
            out["subtype"] = fuse.fuse_subtype(self.fstype)
            out["connection"] = self.connection
            out["daemon_pid"] = self.daemon
        return out


class StorageWatch:
    """Maps the dataset's folders to what serves them and samples those figures."""

    def __init__(self, proc_root: str = "/proc", sys_root: str = "/sys") -> None:
        self.proc_root = proc_root
        self.sys_root = sys_root
        self.served: dict[str, Served] = {}
        self.notes: list[str] = []
        self._procs = ProcessTable(proc_root)
        self._by_folder: dict[str, Served] = {}
        self.written: set[str] = set()
        """Folders the job opened files for writing in (bounded)."""
        self.net = NetWatch(proc_root)
        """The dataset's network peers (NOTE [network storage] in
        iolens/recorder/network.py)."""

    def add(self, folder: str, opens: int = 1, pid: int = 0) -> Served | None:
        """Note that the dataset reads ``folder``; returns its mount when it is new."""
        return next(iter(self.add_all([(pid, folder, opens)])), None)

    def add_all(self, folders: list[tuple[int, str, int]]) -> list[Served]:
        """Note (pid, folder, opens so far) of each folder read; returns the mounts new
        among them. The mount table is read once for them all, and a folder on a FUSE,
        NFS or memory filesystem is mapped from it alone: a stat there could hang on a
        mount whose server is gone."""
        new: list[Served] = []
        table: list[MountEntry] | None = None
        for pid, folder, opens in folders:
            if not is_dataset_path(folder):
                continue
            known = self._by_folder.get(folder)
            if known is not None:
                known.count(pid, folder, opens)
                continue
            if len(self.served) >= _MOUNTS_MAX or len(self._by_folder) >= _FOLDERS_MAX:
                continue
            if table is None:
                table = read_mountinfo(self.proc_root) or []
            s = self._map(folder, table)
            if s is None:
                continue
            old = self.served.get(s.mount)
            if old is not None:
                s = old
                if len(s.folders) < _FOLDERS_SHOWN:
                    s.folders.append(folder)
                else:
                    s.more_folders += 1
            else:
                s.folders.append(folder)
                self.served[s.mount] = s
                new.append(s)
            s.count(pid, folder, opens)
            self._by_folder[folder] = s
        return new

    def note_size(self, folder: str, size: int) -> None:
        """A data file of ``size`` bytes in ``folder`` (read or mapped) was seen."""
        s = self._by_folder.get(folder)
        if s is not None and size > s.largest:
            s.largest = size

    def note_written(self, folder: str) -> None:
        """The job opened a file for writing in ``folder``: a folder it also reads is a
        cache it fills (NOTE [storage roles])."""
        if len(self.written) < _FOLDERS_MAX:
            self.written.add(folder)

    def _map(self, folder: str, table: list[MountEntry]) -> Served | None:
        entry = _longest_mount(table, folder)
        if entry is not None and kind_of(entry.fstype, None) in ("fuse", "nfs", "tmpfs"):
            s = Served(entry.mount_point, entry.fstype, None, [], kind_of(entry.fstype, None),
                       entry.source)
        else:
            try:
                m = device_for_path(folder, self.proc_root, self.sys_root)
            except (OSError, ValueError):
                return None
            if not m.mount_point:
                return None
            entry = next((e for e in reversed(table) if e.mount_point == m.mount_point), None)
            s = Served(m.mount_point, m.fstype, m.device, list(m.disks),
                       kind_of(m.fstype, m.device), entry.source if entry else "")
        if s.kind == "fuse" and s.mount not in self.served:
            with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                s.connection = fuse.fuse_connection(entry) if entry is not None else None
                s.daemon = fuse.find_daemon(s.mount, self.proc_root)
        return s

    def sample(self, seconds: float) -> dict[str, Any]:
        """This interval's figures of the storage with no block device (FUSE, NFS, the
        network)."""
        out: dict[str, Any] = self.net.sample(seconds) if self.net.peers else {}
        stats: dict[str, nfs.NfsMount] | None = None
        if any(s.kind == "nfs" for s in self.served.values()):
            from iolens.sources import nfs  # noqa: PLC0415 - only where an NFS mount serves

        for s in self.served.values():
            if s.kind == "fuse":
                out[s.mount] = self._fuse(s, seconds)
            elif s.kind == "nfs":
                if stats is None:
                    stats = nfs.read_mountstats(self.proc_root) or {}
                cur = stats.get(s.mount)
                if cur is not None:
                    if s._nfs_prev is not None:
                        out[s.mount] = {k: round(v, 4) for k, v in
                                        nfs.nfs_rates(s._nfs_prev, cur, seconds).items()}
                    s._nfs_prev = cur
        return out

    def _fuse(self, s: Served, seconds: float) -> dict[str, Any]:
        fig: dict[str, Any] = {}
        if s.connection is not None:
            fig["waiting"] = fuse.read_waiting(s.connection, self.sys_root)
        if s.daemon is not None:
            st = self._procs.read_stat(s.daemon)
            io = self._procs.read_io(s.daemon)
            if st is None:
                s.daemon, s._daemon_prev = None, None
                return fig
            ticks = st.utime_ticks + st.stime_ticks
            io = io if io is not None else ProcIO()
            prev, s._daemon_prev = s._daemon_prev, (ticks, io)
            if prev is not None and seconds > 0:
                fig["daemon_cpu_pct"] = round(max(0, ticks - prev[0]) / CLK_TCK / seconds
                                              * 100, 2)
                # The daemon's rchar/wchar count its sockets: the network side of the mount.
                fig["daemon_rchar_s"] = round(max(0, io.rchar - prev[1].rchar) / seconds, 1)
                # Its disk reads (a FUSE mount with a local cache) are the job's, one step
                # away: never a neighbour's.
                fig["daemon_read_bytes_s"] = round(
                    max(0, io.read_bytes - prev[1].read_bytes) / seconds, 1)
                fig["daemon_wchar_s"] = round(max(0, io.wchar - prev[1].wchar) / seconds, 1)
        return fig

    def meta(self) -> list[dict[str, Any]]:
        """The mounts and network peers found, the dataset's first: the most files opened
        there (a peer counts its connections)."""
        found = []
        for s in self.served.values():
            d = s.to_dict()
            d["role"] = "cache" if self._fills(s) else "dataset"
            found.append(d)
        found += [{**p, "role": "dataset"} for p in self.net.meta()]
        if any(d["role"] == "cache" for d in found):
            for d in found:
                if d["role"] == "dataset":
                    d["role"] = "source"
        # NOTE [storage roles]: the source first, where the copies come from; then the
        # cache; each by the files opened there.
        order = {"source": 0, "dataset": 0, "cache": 1}
        return sorted(found, key=lambda x: (order[x["role"]], -int(x["opens"])))

    def _fills(self, s: Served) -> bool:
        """Whether the job writes files in a folder of ``s`` that it reads (a cache)."""
        return any(f in self.written for f in s.folders) or any(
            f in self.written for (_, f) in s._opens)


def _longest_mount(table: list[MountEntry], folder: str) -> MountEntry | None:
    """The mount that holds ``folder`` by its path alone (the last of the longest mount
    points: later mounts hide earlier ones); no filesystem is touched."""
    path = os.path.abspath(folder)
    best: MountEntry | None = None
    size = -1
    for e in table:
        mp = e.mount_point.rstrip("/") or "/"
        if path == mp or path.startswith(mp if mp == "/" else mp + "/"):
            n = len(mp)
            if n >= size:
                best, size = e, n
    return best


def storage_kinds(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The storage entries of a run's meta.json that are well formed."""
    out = []
    for s in meta.get("storage") or []:
        if isinstance(s, dict) and isinstance(s.get("mount"), str):
            out.append(s)
    return out


def is_dataset_path(path: str) -> bool:
    """A folder worth mapping: absolute and not a kernel filesystem (/dev/shm is a dataset's
    place in RAM, not one)."""
    return path.startswith("/") and (not path.startswith(("/proc/", "/sys/", "/dev/"))
                                     or path.startswith("/dev/shm/"))

