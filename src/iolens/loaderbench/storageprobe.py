"""``iolens probe --storage PATH``: what bounds the storage that holds a dataset.

A short, bounded, read-only probe against the dataset's own files:

1. random reads of the sample size (the median size of the files found under
   PATH, at most :data:`SAMPLE_MAX`; or, where the files are packs many samples
   large, the job's bytes per sample, ``sample_bytes``, from the run that
   ``iolens probe --run`` names): a whole small file per read, or one
   sample-sized chunk at a random aligned offset of a larger file; first with
   one read in flight, then with K (threads);
2. sequential reads with one in flight, each the device's readahead window
   (what the kernel asks for when a file is read in order, as a pack is;
   1 to 8 MiB): the largest files, or, when every file is small (reading many
   small files back to back is not sequential), the filesystem's block device
   itself, read-only with O_DIRECT over the 1 MiB stretches the files' extents
   fill (FIEMAP), so that what is read is the dataset's data (needs read access
   to the device node: root).

The verdict tells the storage cases apart that call for different fixes:

- ``iops``: large reads deliver clearly more bytes/s than sample-sized ones;
  the device is bound by its requests per second, and packing small files
  into large shards read in order helps;
- ``bandwidth``: large reads deliver no more bytes/s; packing gains nothing;
- ``latency`` (FUSE, NFS, or no sequential figure): more reads in flight
  deliver more reads/s; more DataLoader workers or threads help;
- ``rate``: more reads in flight do not help: a fixed ceiling of requests/s
  (an object store's request limit); fewer, larger requests help;
- ``unknown``: too few reads to tell, or the reads were served from memory.

NOTE [the page cache left as found]: reads must reach the storage, not the
page cache. Where the filesystem takes O_DIRECT (aligned buffers from mmap)
the probe reads past the cache and leaves it untouched (``method: direct``).
Elsewhere (a first open or read refused with EINVAL) it reads only ranges
with no page in the cache (cachestat, syscall 451, or mincore on a mapping
of the file; readahead off with POSIX_FADV_RANDOM) and drops each range it
read again with POSIX_FADV_DONTNEED (``method: evicted``): pages that were
cached stay cached, pages that were not stay out. tmpfs files live in
memory, so there the reads are of memory (``method: cached``).

Nothing is opened for writing: files and the device are opened O_RDONLY,
files with O_NOATIME where permitted (no access-time update to write back),
and FIEMAP is asked without FIEMAP_FLAG_SYNC (which would write dirty data).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
import random
import stat
import statistics
import struct
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from iolens.loaderbench.measure import Progress
from iolens.loaderbench.source import SpecError

SAMPLE_MAX = 4 << 20
PACKED_SAMPLES = 32
"""Files this many of the job's samples large, or more, are packs: the random reads are a
sample's size, not the file's."""
"""Largest sample size probed: beyond it a read is a large read already."""
REQUEST_BYTES = 1 << 20
"""Size of a sequential read at least, and the device stretches' size."""
REQUEST_BYTES_MAX = 8 << 20
"""Size of a sequential read at most."""
CONCURRENCY = 8
"""Random reads in flight in the parallel phase: a DataLoader's workers, typically."""
SECONDS = 6.0
"""The whole probe's default time."""
SCAN_FILES_MAX = 20_000
"""Files listed at most under PATH: enough for a median and a random choice."""
SCAN_SECONDS_MAX = 1.0
"""Listing time at most: a huge tree over a slow store must not eat the probe."""
SCAN_SHARE = 0.15
"""Share of the probe's time the listing takes at most (when under SCAN_SECONDS_MAX)..."""
SCAN_FILES_MIN = 256
"""...once it has found this many files: enough to draw random reads from."""
SCAN_SHARE_MAX = 0.5
"""Share of the probe's time the listing takes at most in any case (a slow store's first
listing of a folder can take seconds), leaving the rest to the reads."""
ALIGN = max(4096, mmap.PAGESIZE)
"""O_DIRECT offsets and lengths, and page-cache ranges, are multiples of this."""
SEQUENTIAL_FILE_MIN = 4 * REQUEST_BYTES
"""A file is read sequentially when at least this large (four 1 MiB requests or more)."""
DEVICE_FILL_MIN = 0.75
"""A 1 MiB stretch of the device is read when the files' data fills this share of it (the
rest may be free space that a sparse or thin-provisioned volume serves without a read)."""
SEQUENTIAL_FILES_MAX = 64
"""Largest files read in the sequential phase at most (more than it has time for)."""
EXTENT_FILES_MAX = 4096
"""Files whose extents are asked for (FIEMAP) at most, for the device read."""
EXTENT_SHARE = 0.25
"""Share of the sequential phase that finding the extents may take at most."""
MIN_READS = 20
"""Random reads each phase needs before its rate is compared: fewer say too little."""
MIN_SEQUENTIAL_READS = 4
"""Sequential reads needed for a bandwidth figure."""
PACK_GAIN = 1.5
"""Sequential bytes/s at least this many times the random ones: large reads deliver more
bytes, so the device is bound by requests (IOPS) and packing helps; below, bandwidth."""
PARALLEL_GAIN = 1.5
"""K reads in flight delivering at least this many times the reads/s of one: each request's
latency bounds the store (more in flight help); below, a fixed ceiling of requests/s."""
JOIN_GRACE_S = 1.0
"""How long past a phase's deadline the reads still in flight are waited for (so that
their pages are dropped); a read that takes longer is left behind and said so."""
ERRORS_MAX = 200
"""Failed reads (a file gone, a permission) after which a phase stops."""
FIRST_OPENS = 32
"""Files tried before concluding that none can be read."""

# Filesystems whose FIEMAP physical offsets are byte offsets on the device they are
# mounted from (btrfs's are logical addresses in its own chunk space, for example).
_FIEMAP_DEVICE_FS = frozenset({"ext2", "ext3", "ext4", "xfs"})
_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_HEADER = struct.Struct("=QQIIII")
_FIEMAP_EXTENT = struct.Struct("=QQQ2QI3I")
_FIEMAP_EXTENTS = 32
_FIEMAP_LAST = 0x1
# Unknown place, delayed allocation, encoded, encrypted, not aligned, inline, tail packed,
# unwritten: no plain run of the file's bytes on the device to read.
_FIEMAP_SKIP = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
_SYS_CACHESTAT = 451
_MAP_FAILED = ctypes.c_void_p(-1).value


class StorageProbeError(SpecError):
    """PATH cannot be probed: missing, or no file under it can be read (a usage error)."""


# -- the result ---------------------------------------------------------------------------


@dataclass
class Phase:
    """What one phase of reads counted up to its deadline."""

    concurrency: int
    reads: int = 0
    seconds: float = 0.0
    bytes: int = 0
    latencies: list[float] = field(default_factory=list, repr=False)
    """Seconds per read, of the reads counted."""
    skipped: int = 0
    """Reads not made: the range was in the page cache (``evicted`` method)."""
    errors: int = 0
    first_error: str = ""
    stalled: int = 0
    """Reads still in flight JOIN_GRACE_S after the deadline."""

    @property
    def reads_per_s(self) -> float:
        return self.reads / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def latency_p50_ms(self) -> float | None:
        return statistics.median(self.latencies) * 1000 if self.latencies else None

    def to_dict(self) -> dict[str, Any]:
        p50 = self.latency_p50_ms
        return {"concurrency": self.concurrency, "reads": self.reads,
                "seconds": round(self.seconds, 3), "reads_per_s": round(self.reads_per_s, 1),
                "bytes_per_s": round(self.bytes_per_s),
                "latency_p50_ms": None if p50 is None else round(p50, 3)}


def sequential_request_bytes(device: str | None, sys_root: str = "/sys") -> int:
    """The size of the sequential phase's reads: the device's readahead window, which is
    what the kernel asks the device for when a file is read in order (a pack read a
    batch at a time), within REQUEST_BYTES..REQUEST_BYTES_MAX; REQUEST_BYTES when
    unknown. A partition's window is its disk's."""
    if not device:
        return REQUEST_BYTES
    base = os.path.join(sys_root, "class", "block", device)
    for queue in (os.path.join(base, "queue"), os.path.join(base, "..", "queue")):
        try:
            with open(os.path.join(queue, "read_ahead_kb"), encoding="ascii") as fh:
                kib = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        return min(max(kib << 10, REQUEST_BYTES), REQUEST_BYTES_MAX) // ALIGN * ALIGN
    return REQUEST_BYTES


@dataclass
class Sequential:
    """The sequential phase: reads of ``request`` bytes, one in flight, from ``source``."""

    source: str
    """``files`` (the largest files) or ``device`` (the block device, read-only)."""
    phase: Phase
    request: int = REQUEST_BYTES

    def to_dict(self) -> dict[str, Any]:
        return {"request_bytes": self.request, "source": self.source,
                "reads": self.phase.reads, "seconds": round(self.phase.seconds, 3),
                "bytes_per_s": round(self.phase.bytes_per_s)}


@dataclass
class StorageProbe:
    """The answer of :func:`probe_storage`."""

    path: str
    mount: str
    fstype: str
    device: str | None
    kind: str
    """``block``, ``fuse``, ``nfs``, ``tmpfs`` or ``other``."""
    files_seen: int
    sample_bytes: int
    method: str
    """How the reads avoided the page cache: ``direct``, ``evicted`` or ``cached``."""
    random_1: Phase
    random_k: Phase
    sequential: Sequential | None
    limit: str = "unknown"
    summary: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def iops_ceiling(self) -> float:
        """Reads/s at the sample size: the better of the two random phases."""
        return max(self.random_1.reads_per_s, self.random_k.reads_per_s)

    @property
    def bandwidth_ceiling(self) -> float:
        """Bytes/s: the best of the sequential and random phases."""
        seq = self.sequential.phase.bytes_per_s if self.sequential else 0.0
        return max(seq, self.random_1.bytes_per_s, self.random_k.bytes_per_s)

    @property
    def parallel_gain(self) -> float | None:
        """Reads/s with K in flight over reads/s with one."""
        return parallel_gain(self.random_1, self.random_k)

    def to_dict(self) -> dict[str, Any]:
        gain = self.parallel_gain
        return {"path": self.path, "mount": self.mount, "fstype": self.fstype,
                "device": self.device, "kind": self.kind, "files_seen": self.files_seen,
                "sample_bytes": self.sample_bytes, "method": self.method,
                "random_1": self.random_1.to_dict(), "random_k": self.random_k.to_dict(),
                "sequential": self.sequential.to_dict() if self.sequential else None,
                "iops_ceiling": round(self.iops_ceiling, 1),
                "bandwidth_ceiling": round(self.bandwidth_ceiling),
                "limit": self.limit, "parallel_gain": None if gain is None else round(gain, 2),
                "summary": self.summary, "seconds": round(self.seconds, 3),
                "notes": list(self.notes)}


# -- the verdict --------------------------------------------------------------------------


def parallel_gain(random_1: Phase, random_k: Phase) -> float | None:
    """random_k's reads/s over random_1's; None without a random_1 rate."""
    if random_1.reads_per_s <= 0:
        return None
    return random_k.reads_per_s / random_1.reads_per_s


def classify(kind: str, method: str, random_1: Phase, random_k: Phase,
             sequential: Phase | None, *, sample_bytes: int = 0) -> tuple[str, str]:
    """The limit (``iops``, ``bandwidth``, ``latency``, ``rate`` or ``unknown``) and a
    sentence saying why and what helps.

    A block device with a sequential figure: ``iops`` when large reads deliver at least
    PACK_GAIN times the bytes/s of the better random phase, else ``bandwidth``. FUSE,
    NFS, or no sequential figure: ``latency`` when K reads in flight deliver at least
    PARALLEL_GAIN times the reads/s of one, else ``rate``.
    """
    size = human_bytes(sample_bytes) if sample_bytes else "sample-sized"
    if method == "cached":
        return "unknown", ("the reads were served from memory (the files live in the page "
                           "cache or in RAM), so they say nothing of a storage device")
    few = min(random_1.reads, random_k.reads)
    if few < MIN_READS and random_1.skipped + random_k.skipped > few:
        return "unknown", (f"too few reads to tell ({random_1.reads} and {random_k.reads}): "
                           "the files' pages were in the page cache, and only ranges out of "
                           "it are read; drop them first (as root: `echo 1 > "
                           "/proc/sys/vm/drop_caches`) and probe again")
    if few < MIN_READS:
        return "unknown", (f"too few reads to tell ({random_1.reads} with one in flight, "
                           f"{random_k.reads} with {random_k.concurrency}; {MIN_READS} each "
                           "needed): give it more --seconds")
    random_bps = max(random_1.bytes_per_s, random_k.bytes_per_s)
    if kind not in ("fuse", "nfs") and sequential is not None \
            and sequential.reads >= MIN_SEQUENTIAL_READS and random_bps > 0:
        ratio = sequential.bytes_per_s / random_bps
        if ratio >= PACK_GAIN:
            return "iops", (f"IOPS-bound: large sequential reads deliver {ratio:.1f}x the "
                            f"bytes/s of random {size} reads, so packing the small files into "
                            "large shards read in order (iolens pack) should help")
        return "bandwidth", (f"bandwidth-bound: large sequential reads deliver "
                             f"{ratio:.2f}x the bytes/s of random {size} reads, so packing "
                             "gains nothing; fewer bytes (compression, smaller samples), a "
                             "cache in RAM or faster storage do")
    gain = parallel_gain(random_1, random_k) or 0.0
    k = random_k.concurrency
    if gain >= PARALLEL_GAIN:
        return "latency", (f"latency-bound: {k} reads in flight deliver {gain:.1f}x the "
                           "reads/s of one, so more requests in flight help (more DataLoader "
                           "workers, threads per worker, a larger prefetch)")
    ceiling = max(random_1.reads_per_s, random_k.reads_per_s)
    return "rate", (f"rate-limited: {k} reads in flight deliver {gain:.2f}x the reads/s of "
                    f"one, a fixed ceiling of about {ceiling:.0f} requests/s; fewer requests "
                    "per sample (packing into larger objects) or a local cache help, more "
                    "workers do not")


def human_bytes(n: float) -> str:
    """1.5 MiB, 64 KiB, 512 B."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n:.0f} B"


# -- the page cache -----------------------------------------------------------------------


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_cachestat_works = [True]


def resident_pages(fd: int, offset: int = 0, length: int = 0) -> int:
    """Pages of the open file ``fd`` in the page cache within ``[offset, offset+length)``
    (``length`` 0: to the end): cachestat (Linux 6.5+), else mincore on a mapping.
    Raises OSError when neither can tell."""
    if _cachestat_works[0]:
        rng = _CachestatRange(offset, length)
        cs = _Cachestat()
        if _libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(cs), 0) == 0:
            return int(cs.nr_cache)
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter refuses it
            raise OSError(err, f"cachestat: {os.strerror(err)}")
        _cachestat_works[0] = False
    return _mincore(fd, offset, length)


def _mincore(fd: int, offset: int, length: int) -> int:
    start = offset - offset % mmap.PAGESIZE
    if length == 0:
        length = os.fstat(fd).st_size - offset
    size = offset + length - start
    if size <= 0:
        return 0
    addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap for mincore: {os.strerror(err)}")
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(addr, size, vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore: {os.strerror(err)}")
        return sum(v & 1 for v in vec)
    finally:
        _libc.munmap(addr, size)


def resident_pages_of(path: str) -> int:
    """Pages of the file at ``path`` in the page cache (opening it reads nothing)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return resident_pages(fd)
    finally:
        os.close(fd)


# -- reading ------------------------------------------------------------------------------


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _open(path: str, extra: int = 0) -> int:
    """``path`` read-only, without an access-time update where the kernel allows it."""
    flags = os.O_RDONLY | os.O_CLOEXEC | extra
    try:
        return os.open(path, flags | os.O_NOATIME)
    except PermissionError:  # O_NOATIME needs the file's owner (or CAP_FOWNER)
        return os.open(path, flags)


class _Reader:
    """One read of a range of a file, the way ``method`` keeps off the page cache."""

    def __init__(self, method: str) -> None:
        self.method = method

    def open(self, path: str) -> int:
        fd = _open(path, os.O_DIRECT if self.method == "direct" else 0)
        if self.method == "evicted":
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead past the range
        return fd

    def read(self, fd: int, offset: int, length: int, view: memoryview) -> int | None:
        """Bytes read of ``[offset, offset+length)``; None when the range had pages in the
        page cache (``evicted``: not read, so that cache is not measured)."""
        if self.method == "direct":
            return os.preadv(fd, [view[:_up(length)]], offset)
        if self.method == "cached":
            return os.preadv(fd, [view[:length]], offset)
        span = _up(length)
        if resident_pages(fd, offset, span):
            return None
        try:
            return os.preadv(fd, [view[:length]], offset)
        finally:
            os.posix_fadvise(fd, offset, span, os.POSIX_FADV_DONTNEED)

    def read_file(self, path: str, offset: int, length: int, view: memoryview) -> int | None:
        fd = self.open(path)
        try:
            return self.read(fd, offset, length, view)
        finally:
            os.close(fd)


Job = Callable[[memoryview], int | None]
"""One read: the bytes it read into the buffer, or None when skipped."""


def _run_phase(next_job: Callable[[], Job | None], concurrency: int, deadline: float,
               buffer_bytes: int, skip_limit: int) -> Phase:
    """Run jobs on ``concurrency`` threads until ``deadline`` (or no job is left) and count
    the reads that completed by then. ``skip_limit`` skips in a row end the phase: a whole
    pass found nothing out of the page cache."""
    phase = Phase(concurrency)
    lock = threading.Lock()
    in_row = [0]
    start = time.monotonic()

    def take() -> Job | None:
        with lock:
            if in_row[0] >= skip_limit or phase.errors >= ERRORS_MAX:
                return None
            return next_job()

    def worker() -> None:
        buf = mmap.mmap(-1, buffer_bytes)  # page-aligned, as O_DIRECT needs
        view = memoryview(buf)
        try:
            while time.monotonic() < deadline:
                job = take()
                if job is None:
                    break
                t0 = time.monotonic()
                try:
                    n = job(view)
                except OSError as exc:
                    with lock:
                        phase.errors += 1
                        phase.first_error = phase.first_error or str(exc)
                    continue
                t1 = time.monotonic()
                with lock:
                    if n is None:
                        phase.skipped += 1
                        in_row[0] += 1
                    elif t1 <= deadline:
                        in_row[0] = 0
                        phase.reads += 1
                        phase.bytes += n
                        phase.latencies.append(t1 - t0)
        finally:
            view.release()
            buf.close()

    threads = [threading.Thread(target=worker, name=f"iolens-probe-{i}", daemon=True)
               for i in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(max(0.0, deadline + JOIN_GRACE_S - time.monotonic()))
    phase.stalled = sum(th.is_alive() for th in threads)
    ended = deadline if phase.stalled or time.monotonic() >= deadline else time.monotonic()
    phase.seconds = max(0.0, min(ended, deadline) - start)
    return phase


# -- what is there ------------------------------------------------------------------------


@dataclass
class _File:
    path: str
    size: int
    ino: int
    """The inode number: files made together sit near each other, inodes and data alike."""


def _scan(root: str, deadline: float, last: float) -> tuple[list[_File], bool]:
    """Regular, non-empty files under ``root`` on its filesystem (no symlinks followed),
    at most SCAN_FILES_MAX of them, until ``deadline`` once SCAN_FILES_MIN are found, and
    until ``last`` in any case; and whether the listing was cut."""
    st = os.stat(root)
    if stat.S_ISREG(st.st_mode):
        return ([_File(root, st.st_size, st.st_ino)] if st.st_size else []), False
    files: list[_File] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    if len(files) >= SCAN_FILES_MAX or time.monotonic() >= (
                            deadline if len(files) >= SCAN_FILES_MIN else last):
                        return files, True
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if entry.stat(follow_symlinks=False).st_dev == st.st_dev:
                                stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            size = entry.stat(follow_symlinks=False).st_size
                            if size > 0:
                                files.append(_File(entry.path, size, entry.inode()))
                    except OSError:
                        continue
        except OSError:
            continue
    return files, False


def _detect_method(files: list[_File], kind: str, allow_direct: bool) -> tuple[str, str]:
    """``direct``, ``evicted`` or ``cached``, and a note. Raises StorageProbeError when none
    of the first FIRST_OPENS files can be opened."""
    last_error = ""
    for f in files[:FIRST_OPENS]:
        try:
            os.close(_open(f.path))
        except OSError as exc:
            last_error = f"{f.path}: {exc.strerror or exc}"
            continue
        if kind == "tmpfs":
            return "cached", ("tmpfs keeps its files in memory: the figures are of memory, "
                              "not of a storage device")
        if not allow_direct:
            return "evicted", "reads of ranges out of the page cache only, dropped after"
        try:
            fd = _open(f.path, os.O_DIRECT)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                last_error = f"{f.path}: {exc.strerror or exc}"
                continue
            return "evicted", (f"{kind} refuses O_DIRECT: only ranges out of the page cache "
                               "are read, and dropped again after")
        buf = mmap.mmap(-1, ALIGN)
        try:
            os.preadv(fd, [buf], 0)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return "evicted", (f"{kind} refuses O_DIRECT reads: only ranges out of the page "
                               "cache are read, and dropped again after")
        finally:
            buf.close()
            os.close(fd)
        return "direct", "O_DIRECT reads: past the page cache, which is left untouched"
    raise StorageProbeError(f"no file under the path can be read ({last_error})"
                            if last_error else "no file under the path can be read")


def _random_jobs(files: list[_File], sample: int, reader: _Reader,
                 rng: random.Random) -> Callable[[], Job]:
    """Random reads: a whole file when no larger than the sample, else a sample-sized chunk
    at a random aligned offset; files in a shuffled order, reshuffled each pass (so that no
    two threads read one file at once)."""
    order: list[int] = []

    def next_job() -> Job:
        if not order:
            order.extend(range(len(files)))
            rng.shuffle(order)
        f = files[order.pop()]
        if f.size <= sample:
            offset, length = 0, f.size
        else:
            offset, length = rng.randrange(0, (f.size - sample) // ALIGN + 1) * ALIGN, sample
        return functools.partial(reader.read_file, f.path, offset, length)

    return next_job


def _file_chunks(files: list[_File], reader: _Reader,
                 request: int = REQUEST_BYTES) -> Generator[Job, None, None]:
    """Reads of ``request`` bytes in order through ``files``, one after the other; over again
    at the end. The open file stays open across its reads."""
    while True:
        opened = 0
        for f in files:
            try:
                fd = reader.open(f.path)
            except OSError:
                continue
            opened += 1
            try:
                for offset in range(0, f.size, request):
                    length = min(request, f.size - offset)
                    yield functools.partial(reader.read, fd, offset, length)
            finally:
                os.close(fd)
        if not opened:
            return


def _extents(path: str) -> list[tuple[int, int]]:
    """(physical offset, length) of the file's plain data extents (FIEMAP, no sync)."""
    out: list[tuple[int, int]] = []
    fd = _open(path)
    try:
        start = 0
        while True:
            buf = bytearray(_FIEMAP_HEADER.size + _FIEMAP_EXTENT.size * _FIEMAP_EXTENTS)
            _FIEMAP_HEADER.pack_into(buf, 0, start, (1 << 64) - 1 - start, 0, 0,
                                     _FIEMAP_EXTENTS, 0)
            fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf)
            mapped = _FIEMAP_HEADER.unpack_from(buf, 0)[3]
            if not mapped:
                return out
            for i in range(mapped):
                logical, physical, length, _, _, flags, *_ = _FIEMAP_EXTENT.unpack_from(
                    buf, _FIEMAP_HEADER.size + i * _FIEMAP_EXTENT.size)
                if not flags & _FIEMAP_SKIP:
                    out.append((physical, length))
                if flags & _FIEMAP_LAST:
                    return out
                start = logical + length
    finally:
        os.close(fd)


def _device_chunks(files: list[_File], deadline: float,
                   request: int = REQUEST_BYTES) -> tuple[list[int], int]:
    """The device offsets of reads of ``request`` bytes over the 1 MiB-aligned stretches
    that the files' data fills at least DEVICE_FILL_MIN of (runs of such stretches, cut
    into requests), ascending; and how many files' extents were read. The files are taken
    in inode order, so that those looked at (EXTENT_FILES_MAX, or what ``deadline``
    allows) are neighbours that fill whole stretches, not a scattered sample that fills
    none."""
    fill: dict[int, int] = {}
    seen = 0
    for f in sorted(files, key=lambda f: f.ino)[:EXTENT_FILES_MAX]:
        if time.monotonic() >= deadline:
            break
        try:
            extents = _extents(f.path)
        except OSError:
            continue
        seen += 1
        for physical, length in extents:
            pos, end = physical, physical + length
            while pos < end:
                chunk = pos // REQUEST_BYTES
                stop = min(end, (chunk + 1) * REQUEST_BYTES)
                fill[chunk] = fill.get(chunk, 0) + stop - pos
                pos = stop
    need = DEVICE_FILL_MIN * REQUEST_BYTES
    full = [c for c in sorted(fill) if fill[c] >= need]
    offsets: list[int] = []
    i = 0
    while i < len(full):
        j = i
        while j + 1 < len(full) and full[j + 1] == full[j] + 1:
            j += 1
        run_start, run_end = full[i] * REQUEST_BYTES, (full[j] + 1) * REQUEST_BYTES
        offsets.extend(range(run_start, run_end - request + 1, request))
        i = j + 1
    return offsets, seen


def _device_node(device: str | None, path: str) -> str | None:
    """The /dev node of the filesystem's device, checked to be the one holding ``path``."""
    if not device:
        return None
    node = os.path.join("/dev", device)
    try:
        st = os.stat(node)
        return node if stat.S_ISBLK(st.st_mode) and st.st_rdev == os.stat(path).st_dev \
            else None
    except OSError:
        return None


def _device_jobs(fd: int, offsets: list[int], request: int = REQUEST_BYTES) -> Iterator[Job]:
    """O_DIRECT reads of ``request`` bytes of the device at ``offsets``, in order, over again
    at the end."""
    while True:
        for offset in offsets:
            yield functools.partial(_pread_request, fd, offset, request)


def _pread_request(fd: int, offset: int, request: int, view: memoryview) -> int:
    return os.preadv(fd, [view[:request]], offset)


def _mapping(path: str) -> tuple[str, str, str | None, str, str]:
    """(mount, fstype, device, kind, note) of the filesystem holding ``path``."""
    from iolens.recorder.storage import kind_of  # noqa: PLC0415 - the recorder's naming
    from iolens.sources.devmap import device_for_path  # noqa: PLC0415

    m = device_for_path(path)
    kind = kind_of(m.fstype, m.device)
    note = ""
    if kind == "overlay":
        kind = "block" if m.disks else "other"
        note = (f"overlayfs over {', '.join(m.disks)}: its layers' devices are read"
                if m.disks else "overlayfs with no block device found under it")
    return m.mount_point, m.fstype, m.device, kind, note


# -- the probe ----------------------------------------------------------------------------


def probe_storage(path: str, *, seconds: float = SECONDS, concurrency: int = CONCURRENCY,
                  allow_direct: bool = True, progress: Progress | None = None,
                  seed: int | None = None, sample_bytes: float | None = None
                  ) -> StorageProbe:
    """Probe the storage under ``path`` for about ``seconds`` (see the module).

    ``allow_direct=False`` reads through the page cache (only what is not in it, dropped
    again after) even where O_DIRECT works. ``sample_bytes`` is what the job reads per
    sample (its run's figure): the random reads' size where the files hold many samples
    each (PACKED_SAMPLES or more). Raises StorageProbeError when ``path`` does not exist
    or holds no readable file.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    if concurrency < 2:
        raise ValueError(f"concurrency must be at least 2, not {concurrency}")
    t0 = time.monotonic()
    end = t0 + seconds
    abspath = os.path.abspath(path)
    if not os.path.exists(abspath):
        raise StorageProbeError(f"{path}: no such file or folder")
    rng = random.Random(seed)
    notes: list[str] = []

    def stage(label: str) -> None:
        if progress is not None:
            progress.start(label)

    def done(label: str, result: str) -> None:
        if progress is not None:
            progress.finish(label, result)

    stage("listing the files")
    try:
        mount, fstype, device, kind, map_note = _mapping(abspath)
    except (OSError, ValueError) as exc:
        raise StorageProbeError(f"{path}: cannot be examined ({exc})") from exc
    if map_note:
        notes.append(map_note)
    try:
        files, cut = _scan(abspath, t0 + min(SCAN_SECONDS_MAX, SCAN_SHARE * seconds),
                           t0 + SCAN_SHARE_MAX * seconds)
    except OSError as exc:
        raise StorageProbeError(f"{path}: cannot be listed ({exc.strerror or exc})") from exc
    if not files and cut:
        raise StorageProbeError(f"{path}: no file found under it in "
                                f"{SCAN_SHARE_MAX * seconds:g} s (a slow listing: give it more "
                                "--seconds)")
    if not files:
        raise StorageProbeError(f"{path}: no readable file under it (no regular, non-empty "
                                "file found)")
    if cut:
        notes.append(f"the listing stopped at {len(files)} files (at most {SCAN_FILES_MAX}, "
                     f"or {time.monotonic() - t0:.2g} s of listing): the figures are of those")
    rng.shuffle(files)
    sample = min(int(statistics.median(f.size for f in files)), SAMPLE_MAX)
    if sample_bytes is not None and sample_bytes > 0 and (
            statistics.median(f.size for f in files) >= PACKED_SAMPLES * sample_bytes):
        # a pack: its samples are read one at a time, not the file's first 4 MiB
        sample = max(ALIGN, min(SAMPLE_MAX, round(sample_bytes / ALIGN) * ALIGN))
        notes.append(f"random reads of {human_bytes(sample)}, the job's bytes per sample: "
                     "the files hold many samples each")
    method, method_note = _detect_method(files, kind, allow_direct)
    notes.append(method_note)
    reader = _Reader(method)

    # Where the sequential reads come from, decided before the clock is split.
    large = sorted((f for f in files if f.size >= SEQUENTIAL_FILE_MIN),
                   key=lambda f: -f.size)[:SEQUENTIAL_FILES_MAX]
    node: str | None = None
    seq_note = ""
    if large:
        seq_source = "files"
    elif kind != "block":
        seq_source = ""
        seq_note = (f"sequential bandwidth not measured: every file is under "
                    f"{human_bytes(SEQUENTIAL_FILE_MIN)} and {kind} storage has no block "
                    "device to read")
    elif fstype not in _FIEMAP_DEVICE_FS:
        seq_source = ""
        seq_note = (f"sequential bandwidth not measured: every file is under "
                    f"{human_bytes(SEQUENTIAL_FILE_MIN)}, and where {fstype}'s data sits on "
                    "its device is not known here")
    else:
        node = _device_node(device, abspath)
        if node is not None and os.access(node, os.R_OK):
            seq_source = "device"
        else:
            seq_source = ""
            what = node or (f"/dev/{device}" if device else "the block device")
            seq_note = (f"sequential bandwidth not measured: every file is under "
                        f"{human_bytes(SEQUENTIAL_FILE_MIN)} (reading many small files back "
                        f"to back is not sequential), and {what} cannot be read here "
                        "(root can read it)")

    if not seq_source and progress is not None:
        progress.set_total(3)
    done("listing the files", f"{len(files)} files, sample {human_bytes(sample)}, {method}")
    request = sequential_request_bytes(device) if seq_source else REQUEST_BYTES
    buffer_bytes = max(_up(sample), request)
    phases_left = 3 if seq_source else 2

    def phase_deadline() -> float:
        nonlocal phases_left
        now = time.monotonic()
        share = max(0.0, end - now) / max(phases_left, 1)
        phases_left -= 1
        return now + share

    k = concurrency
    random_phases: list[Phase] = []
    for n in (1, k):
        label = f"random {human_bytes(sample)} reads, {n} in flight"
        stage(label)
        ph = _run_phase(_random_jobs(files, sample, reader, rng), n, phase_deadline(),
                        buffer_bytes, skip_limit=len(files))
        random_phases.append(ph)
        done(label, f"{ph.reads_per_s:,.1f} reads/s, {human_bytes(ph.bytes_per_s)}/s")
    r1, rk = random_phases

    sequential: Sequential | None = None
    if seq_source:
        label = f"sequential {human_bytes(request)} reads"
        stage(label)
        deadline = phase_deadline()
        if seq_source == "files":
            gen = _file_chunks(large, reader, request)
            ph = _run_phase(lambda: next(gen, None), 1, deadline, buffer_bytes,
                            skip_limit=sum(-(-f.size // request) for f in large))
            with contextlib.suppress(ValueError):  # a stalled read holds it: left behind
                gen.close()
            sequential = Sequential("files", ph, request)
            notes.append(f"sequential: {human_bytes(request)} reads (the device's readahead "
                         f"window, at least 1 MiB) in order through the {len(large)} largest "
                         f"files ({human_bytes(SEQUENTIAL_FILE_MIN)} or more), largest first")
        else:
            assert node is not None
            start = time.monotonic()
            offsets, seen = _device_chunks(files, start + EXTENT_SHARE * (deadline - start),
                                           request)
            if len(offsets) < MIN_SEQUENTIAL_READS:
                seq_note = (f"sequential bandwidth not measured: the data of the {seen} "
                            f"files looked at fills {len(offsets)} whole "
                            f"{human_bytes(request)} reads of {node} (at least "
                            f"{MIN_SEQUENTIAL_READS} needed)")
            else:
                try:
                    fd = os.open(node, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
                except OSError as exc:
                    seq_note = f"sequential bandwidth not measured: {node}: {exc.strerror}"
                else:
                    try:
                        jobs = _device_jobs(fd, offsets, request)
                        ph = _run_phase(lambda: next(jobs), 1, deadline, buffer_bytes,
                                        skip_limit=1)
                    finally:
                        os.close(fd)
                    sequential = Sequential("device", ph, request)
                    notes.append(f"sequential: every file is small, so the block device {node} "
                                 f"was read instead, read-only with O_DIRECT, in "
                                 f"{human_bytes(request)} reads (its readahead window, at "
                                 f"least 1 MiB) over the stretches that the data of {seen} "
                                 "files fills")
        if sequential is not None:
            p = sequential.phase
            done(label, f"{human_bytes(p.bytes_per_s)}/s")
        else:
            done(label, "not measured")
    if seq_note:
        notes.append(seq_note)

    result = StorageProbe(abspath, mount, fstype, device, kind, len(files), sample, method,
                          r1, rk, sequential)
    result.limit, result.summary = classify(kind, method, r1, rk,
                                            sequential.phase if sequential else None,
                                            sample_bytes=sample)
    checked = [(r1, "random, 1 in flight"), (rk, f"random, {k} in flight")]
    if sequential is not None:
        checked.append((sequential.phase, "sequential"))
    for ph, what in checked:
        if ph.skipped:
            notes.append(f"{what}: {ph.skipped} reads skipped, their ranges were in the page "
                         "cache")
        if ph.errors:
            notes.append(f"{what}: {ph.errors} reads failed ({ph.first_error})")
        if ph.stalled:
            notes.append(f"{what}: {ph.stalled} reads still in flight {JOIN_GRACE_S:g} s past "
                         "the deadline (the storage stalls); their pages may stay cached")
    if sequential is not None and sequential.phase.reads < MIN_SEQUENTIAL_READS:
        notes.append(f"sequential: only {sequential.phase.reads} reads, too few for a "
                     "bandwidth figure")
    total = sum(f.size for f in files)
    if method != "cached" and rk.bytes + r1.bytes > total:
        notes.append(f"the random phases read {human_bytes(r1.bytes + rk.bytes)}, more than the "
                     f"{human_bytes(total)} of files seen: files were read more than once, and "
                     "a cache below the page cache (disk, controller, server) may have served "
                     "repeats")
    result.notes = notes
    result.seconds = time.monotonic() - t0
    return result


# -- text ---------------------------------------------------------------------------------


def _rate_line(label: str, ph: Phase) -> str:
    p50 = ph.latency_p50_ms
    lat = f"p50 {p50:8.2f} ms" if p50 is not None else f"p50 {'-':>8}"
    return (f"  {label:<40} {ph.reads:>7} reads {ph.reads_per_s:>10,.1f} reads/s "
            f"{human_bytes(ph.bytes_per_s) + '/s':>12}  {lat}")


_METHOD = {"direct": "O_DIRECT, past the page cache",
           "evicted": "only ranges out of the page cache, dropped after",
           "cached": "from memory"}


def render_text(result: StorageProbe) -> str:
    """The phases' figures, the two ceilings and the limit, as text."""
    on = f"{result.fstype or 'unknown filesystem'}"
    on += f" on {result.device}" if result.device else ""
    lines = [f"iolens probe --storage {result.path}",
             f"  {on} ({result.kind}), mounted at {result.mount or '?'}",
             f"  {result.files_seen} files seen, sample {human_bytes(result.sample_bytes)} "
             f"(the median file size), reads {_METHOD.get(result.method, result.method)}", ""]
    lines.append(_rate_line("random reads, 1 in flight", result.random_1))
    lines.append(_rate_line(f"random reads, {result.random_k.concurrency} in flight",
                            result.random_k))
    if result.sequential is not None:
        s = result.sequential
        src = "the block device" if s.source == "device" else "the largest files"
        what = f"sequential {human_bytes(s.request)} reads, {src}"
        lines.append(f"  {what:<40} {s.phase.reads:>7} reads "
                     f"{'':>18} {human_bytes(s.phase.bytes_per_s) + '/s':>12}")
    else:
        lines.append(f"  {'sequential reads':<40} not measured")
    gain = result.parallel_gain
    lines.append("")
    lines.append(f"  IOPS ceiling {result.iops_ceiling:,.1f} reads/s at "
                 f"{human_bytes(result.sample_bytes)}; bandwidth ceiling "
                 f"{human_bytes(result.bandwidth_ceiling)}/s; parallel gain "
                 + (f"{gain:.2f}x" if gain is not None else "-"))
    lines.append("")
    lines.append(f"limit: {result.limit}: {result.summary}")
    lines.extend(f"note: {n}" for n in result.notes)
    lines.append(f"({result.seconds:.1f} s)")
    return "\n".join(lines) + "\n"
