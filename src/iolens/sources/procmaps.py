"""The files a process has mapped into memory, from /proc/<pid>/maps (pure parser + reader).

A dataset read through ``numpy.memmap`` (or any mmap) is opened once, mapped,
and the file closed: it shows in no fd list and its reads in no rchar, only
as page faults in read_bytes. Its mapping stays in /proc/<pid>/maps, which
is how the recorder finds the file and the device under it.
"""

from __future__ import annotations

import os

_CODE = (".so", ".pyc", ".py")
"""Mapped code and Python's own files, not data."""
_SYSTEM = ("/usr/", "/lib", "/bin/", "/sbin/", "/etc/", "/proc/", "/sys/", "/dev/", "/memfd:",
           "/SYSV")
_MAX_BYTES = 4 << 20
"""Read at most this much of a maps file (a torch process maps a few hundred files)."""


def data_file(path: str, exclude: tuple[str, ...] = ()) -> bool:
    """Whether an absolute ``path`` a process holds (open or mapped) can be a data file: not
    code (.so, .py, .pyc), not in a system folder, Python's installation or a kernel
    filesystem (but /dev/shm, a dataset's place in RAM), not deleted, not
    multiprocessing's or torch's own scratch files, and not under ``exclude``."""
    if not path.startswith("/") or path.endswith(" (deleted)"):
        return False
    if path.startswith("/dev/shm/"):
        name = path[9:]
        if name.startswith(("torch_", "__KMP", "sem.", "psm_", "mp-")):
            return False
    elif path.startswith(_SYSTEM):
        return False
    name = os.path.basename(path)
    if name.endswith(_CODE) or ".so." in name or "/pymp-" in path:
        return False
    if "/site-packages/" in path or "/dist-packages/" in path or "/lib/python" in path:
        return False  # (Python's own: a spawned worker's imports read metadata there)
    return not (exclude and path.startswith(exclude))


def mapped_files(text: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """The data files mapped in ``text`` (a maps file): absolute paths, once each, in order.

    Programs and shared libraries (any file with an executable mapping, and names
    that say so), Python's own files, system folders, anonymous and special
    mappings (``[heap]``, ``(deleted)``) and paths under ``exclude`` are left out.
    Lines that do not have the maps format are skipped.
    """
    out: dict[str, None] = {}
    code: set[str] = set()
    """Files with an executable mapping: programs and libraries, whatever their name."""
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5]
        if "x" in parts[1]:
            code.add(path)
            continue
        if data_file(path, exclude):
            out.setdefault(path, None)
    return [p for p in out if p not in code]


def read_mapped_files(pid: int, proc_root: str = "/proc",
                      exclude: tuple[str, ...] = ()) -> list[str]:
    """:func:`mapped_files` of process ``pid``; empty when its maps cannot be read."""
    try:
        with open(os.path.join(proc_root, str(pid), "maps"), "rb") as fh:
            data = fh.read(_MAX_BYTES)
    except OSError:
        return []
    return mapped_files(os.fsdecode(data), exclude)
