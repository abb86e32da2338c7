"""Pack a folder of many small sample files into LMDB or HDF5 shards (``iolens pack``).

A dataset of many small files costs the disk one or more I/Os per sample; packed
into a few large files it is read in large, mostly sequential requests. This
module turns ``SRC`` into a pack at ``DST``:

- ``SRC/<class>/.../<file>`` (an image-folder layout): every file under a class
  folder, at any depth, is a sample whose label is the class's index in the
  sorted class names, and the samples come in the order torchvision's
  ImageFolder lists them; a folder of files only is packed without labels.
  With ``shuffle_seed`` the samples are stored in a random order drawn from that
  seed instead (``manifest["order"]``), so that any run of consecutive samples,
  the unit a disk serves in one large read, mixes the classes.
- Each sample is stored under the key ``%010d`` of its index (LMDB) or at an
  offset in one byte array (HDF5, dataset ``data``), in shards of about
  ``shard_size`` bytes (``shard-00000.lmdb``, ``shard-00001.lmdb``, ...).
- ``DST/manifest.json`` lists the format, classes, shards and, per sample, its
  key, source path, size, label, shard, offset and blake2b checksum, and the files
  that were skipped and why. It is written last, after a verification pass
  re-read every stored sample and compared its checksum with the source's.

Resuming: the list of files to pack is frozen at the start
(``DST/.pack-state/plan.json``), and every durable step (an LMDB transaction of
``commit_every`` samples, an HDF5 flush) is followed by a line in
``DST/.pack-state/journal.jsonl``, written and synced whole. A run that is
interrupted (Ctrl-C, a kill, a crash) resumes from the last journal line: what
was written after it is cut off (LMDB keys deleted, the HDF5 array shrunk) and
written again, so the result equals that of an uninterrupted run. A shard file
HDF5 cannot open after a kill is written again from its first sample.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

PACK_SCHEMA = 1
MANIFEST = "manifest.json"
STATE_DIR = ".pack-state"
FORMATS = ("lmdb", "hdf5", "webdataset")
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5", "webdataset": ".tar"}
TAR_BLOCK = 512
CHECKSUM = "blake2b-128"
COMMIT_BYTES = 64 << 20
"""A transaction is committed after ``commit_every`` samples or this many bytes."""
HDF5_CHUNK = 1 << 20


class PackError(Exception):
    """The pack cannot start (bad arguments, DST holds something else): exit code 2."""


class PackFailed(Exception):
    """The pack could not be written or failed verification: exit code 3."""


def parse_size(text: str) -> int:
    """``512M``, ``4G``, ``1.5GiB``, ``100k``, ``65536``: bytes (binary units: K = 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 512M, 4G, 65536)")
    value = float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")
    if value < 1:
        raise ValueError(f"a size must be at least 1 byte, not {text!r}")
    return int(value)


def checksum(data: bytes) -> str:
    """The checksum a manifest records per sample."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def sample_key(index: int) -> bytes:
    """The LMDB key of the sample at ``index`` (keys sort in sample order)."""
    return b"%010d" % index


def shard_name(fmt: str, shard: int) -> str:
    return f"shard-{shard:05d}{SUFFIX[fmt]}"


def tar_extension(path: str) -> str:
    """The extension a sample keeps in a WebDataset shard: the source file's last suffix,
    lowercased (WebDataset's decoders go by it), or ``bin`` where it has none or one that
    is not a plain word (a dot would split the sample's key)."""
    ext = os.path.splitext(path)[1][1:].lower()
    return ext if re.fullmatch(r"[a-z0-9_]{1,16}", ext) else "bin"


def _padded(n: int) -> int:
    return -(-n // TAR_BLOCK) * TAR_BLOCK


def tar_span(entry: dict[str, Any]) -> int:
    """The bytes a sample takes in a WebDataset shard: its file's header and data, and the
    ``cls`` member holding its label when it has one."""
    span = TAR_BLOCK + _padded(int(entry["size"]))
    if entry.get("label") is not None:
        span += TAR_BLOCK + _padded(len(str(entry["label"])))
    return span


# -- listing ------------------------------------------------------------------------------


@dataclass
class Listing:
    """What is to be packed: classes (empty for a flat folder), samples as (relative path,
    label or None) in pack order, and what was left out while listing."""

    classes: list[str]
    samples: list[tuple[str, int | None]]
    skipped: list[dict[str, str]] = field(default_factory=list)


def _walk(top: str, rel: str, seen: set[tuple[int, int]], skipped: list[dict[str, str]],
          ) -> Iterator[tuple[str, str]]:
    """(relative folder, file name) of every non-folder under ``top``, folders as
    ``sorted(os.walk(top, followlinks=True))`` orders them; a folder met twice (a cycle of
    symlinks) or one that cannot be read is reported in ``skipped``."""
    try:
        st = os.stat(top)
        key = (st.st_dev, st.st_ino)
        if key in seen:
            skipped.append({"path": rel, "reason": "a folder already packed (a cycle of "
                                                   "symlinks)"})
            return
        seen.add(key)
        with os.scandir(top) as it:
            entries = list(it)
    except OSError as exc:
        skipped.append({"path": rel, "reason": _reason(exc)})
        return
    files: list[str] = []
    dirs: list[str] = []
    for e in entries:
        try:
            is_dir = e.is_dir()
        except OSError:
            is_dir = False
        (dirs if is_dir else files).append(e.name)
    yield from ((rel, name) for name in sorted(files))
    for name in sorted(dirs):
        yield from _walk(os.path.join(top, name), os.path.join(rel, name), seen, skipped)


def list_samples(src: str) -> Listing:
    """The samples under ``src``: an image-folder layout when it holds folders (each a
    class), else a flat folder of unlabeled samples."""
    with os.scandir(src) as it:
        entries = sorted(it, key=lambda e: e.name)
    skipped: list[dict[str, str]] = []

    def is_dir(e: os.DirEntry[str]) -> bool:
        try:
            return e.is_dir()
        except OSError:
            return False

    classes = [e.name for e in entries if is_dir(e)]
    if not classes:
        return Listing([], [(e.name, None) for e in entries], skipped)
    for e in entries:
        if not is_dir(e):
            skipped.append({"path": e.name, "reason": "not in a class folder"})
    samples: list[tuple[str, int | None]] = []
    seen: set[tuple[int, int]] = set()
    for label, name in enumerate(classes):
        found = list(_walk(os.path.join(src, name), name, seen, skipped))
        # ImageFolder: sorted(os.walk(...)) orders folders by path, then files by name.
        found.sort()
        samples.extend((os.path.join(folder, f), label) for folder, f in found)
    return Listing(classes, samples, skipped)


# -- reading ------------------------------------------------------------------------------


class Skip(Exception):
    """A source file that is not packed; the message says why."""


def _reason(exc: OSError) -> str:
    import errno  # noqa: PLC0415

    if exc.errno == errno.ENOENT:
        return "no such file: vanished, or a dangling symlink"
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return exc.strerror or str(exc)


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def read_sample(path: str) -> bytes:
    """The bytes of the regular file ``path``; raises :class:`Skip` for anything else.

    Opened without blocking, so a FIFO with no writer is refused instead of waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Skip(_reason(exc)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
            raise Skip(f"{kind}, not a file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read()
    except OSError as exc:
        raise Skip(_reason(exc)) from None
    finally:
        os.close(fd)


# -- shard writers ------------------------------------------------------------------------


class ShardWriter(Protocol):
    """One shard being written. ``write`` makes a batch durable; ``close`` ends the shard."""

    def write(self, first: int, batch: Sequence[bytes],
              entries: Sequence[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...

    def abandon(self) -> None:
        """Let go of the shard as it is (after an interruption)."""


class _LMDBWriter:
    def __init__(self, path: str, first: int, keep: int, initial_map: int) -> None:
        import lmdb  # noqa: PLC0415

        self._lmdb = lmdb
        self.env = lmdb.open(path, subdir=False, map_size=initial_map, readahead=False,
                             meminit=False, max_dbs=0)
        # Keys written after the last journaled transaction are cut off, to be written again.
        with self.env.begin(write=True) as txn:
            cur = txn.cursor()
            if cur.set_range(sample_key(first + keep)):
                while cur.delete():
                    pass

    def write(self, first: int, batch: Sequence[bytes],
              entries: Sequence[dict[str, Any]]) -> None:
        del entries
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for i, data in enumerate(batch):
                        txn.put(sample_key(first + i), data, overwrite=True)
                return
            except self._lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()

    def abandon(self) -> None:
        self.env.close()


class _HDF5Writer:
    def __init__(self, path: str, keep_bytes: int) -> None:
        import h5py  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

        self.final = path
        self.part = path + ".part"
        if os.path.exists(path) and not os.path.exists(self.part):
            os.replace(path, self.part)  # closed earlier, reopened to continue
        self.file = h5py.File(self.part, "a")
        if "data" in self.file:
            data = self.file["data"]
            if data.shape[0] < keep_bytes:
                self.file.close()
                raise OSError(f"{self.part} holds {data.shape[0]} bytes, fewer than the "
                              f"{keep_bytes} journaled")
            data.resize((keep_bytes,))
        else:
            self.file.create_dataset("data", shape=(0,), maxshape=(None,), dtype="u1",
                                     chunks=(HDF5_CHUNK,))
        self.data = self.file["data"]
        self.end = keep_bytes

    def write(self, first: int, batch: Sequence[bytes],
              entries: Sequence[dict[str, Any]]) -> None:
        import numpy as np  # noqa: PLC0415

        del first, entries
        blob = b"".join(batch)
        if blob:
            self.data.resize((self.end + len(blob),))
            self.data[self.end:self.end + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
            self.end += len(blob)
        self.file.flush()
        with open(self.part, "rb") as fh:
            os.fsync(fh.fileno())

    def close(self) -> None:
        self.file.close()
        os.replace(self.part, self.final)

    def abandon(self) -> None:
        if self.file.id.valid:
            self.file.close()


class _TarWriter:
    """A WebDataset shard: a tar file, per sample ``KEY.EXT`` (the file's bytes) and, for a
    labeled pack, ``KEY.cls`` (the label as decimal text). Written as ``.part``, cut back to
    the journaled length when continued, closed with the two zero blocks that end a tar."""

    def __init__(self, path: str, keep_bytes: int) -> None:
        self.final = path
        self.part = path + ".part"
        if os.path.exists(path) and not os.path.exists(self.part):
            os.replace(path, self.part)  # closed earlier, reopened to continue
        self.fh = open(self.part, "ab+")  # noqa: SIM115 - held across writes, closed below
        try:
            size = os.fstat(self.fh.fileno()).st_size
            if size < keep_bytes:
                raise OSError(f"{self.part} holds {size} bytes, fewer than the {keep_bytes} "
                              "journaled")
            self.fh.truncate(keep_bytes)
        except BaseException:
            self.fh.close()
            raise

    @staticmethod
    def _member(name: str, data: bytes) -> bytes:
        import tarfile  # noqa: PLC0415

        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        pad = _padded(len(data)) - len(data)
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict") + data + b"\0" * pad

    def write(self, first: int, batch: Sequence[bytes],
              entries: Sequence[dict[str, Any]]) -> None:
        del first
        for data, e in zip(batch, entries, strict=True):
            self.fh.write(self._member(f"{e['key']}.{tar_extension(e['path'])}", data))
            if e.get("label") is not None:
                self.fh.write(self._member(f"{e['key']}.cls", str(e["label"]).encode()))
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.write(b"\0" * (2 * TAR_BLOCK))
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.part, self.final)

    def abandon(self) -> None:
        self.fh.close()


# -- the pack -----------------------------------------------------------------------------


@dataclass
class Options:
    fmt: str = "lmdb"
    shard_size: int | None = None
    commit_every: int = 1000
    readers: int = 8
    shuffle_seed: int | None = None
    """Store the samples in a random order drawn from this seed (None: the folder's order)."""


def order_of(seed: int | None) -> dict[str, Any]:
    """The manifest's ``order``: the folder's, or shuffled with ``seed``."""
    return {"kind": "folder"} if seed is None else {"kind": "shuffled", "seed": seed}


def shuffled(samples: list[Any], seed: int) -> list[Any]:
    """``samples`` in the random order that ``seed`` draws (the same on every machine)."""
    import random  # noqa: PLC0415

    out = list(samples)
    random.Random(seed).shuffle(out)
    return out


@dataclass
class Progress:
    """What the packer reports as it goes: ``total`` samples, ``done`` so far (packed or
    skipped), ``bytes`` packed, and ``phase`` (``pack`` or ``verify``)."""

    total: int = 0
    done: int = 0
    bytes: int = 0
    phase: str = "pack"


@dataclass
class Result:
    """A finished pack: its manifest, and whether it was already complete before this run."""

    manifest: dict[str, Any]
    already: bool = False
    resumed_from: int = 0
    seconds: float = 0.0
    verify_seconds: float = 0.0


def _write_json_atomic(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(dst: str) -> dict[str, Any]:
    """The manifest of the complete pack at ``dst``."""
    with open(os.path.join(dst, MANIFEST), encoding="utf-8") as fh:
        manifest: dict[str, Any] = json.load(fh)
    return manifest


def _check_dst(src: str, dst: str, opts: Options) -> dict[str, Any] | None:
    """The plan or manifest already at ``dst`` when it is a pack of ``src`` with these
    options (None: a fresh start); raises PackError when ``dst`` holds something else."""
    if not os.path.lexists(dst):
        return None
    if not os.path.isdir(dst):
        raise PackError(f"{dst} exists and is not a folder")
    found: dict[str, Any] | None = None
    for name in (MANIFEST, os.path.join(STATE_DIR, "plan.json")):
        path = os.path.join(dst, name)
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as fh:
                    found = json.load(fh)
            except (OSError, ValueError) as exc:
                raise PackError(f"{path} cannot be read ({exc}); remove {dst} to pack "
                                "again") from None
            break
    if found is None:
        if os.listdir(dst):
            raise PackError(f"{dst} exists, is not empty and is not a pack; choose another "
                            "DST or empty it")
        return None
    if found.get("src") != src:
        raise PackError(f"{dst} is a pack of {found.get('src')}, not of {src}; choose "
                        "another DST or remove it")
    theirs = (found.get("format"), found.get("shard_size"),
              found.get("order") or order_of(None))
    if theirs != (opts.fmt, opts.shard_size, order_of(opts.shuffle_seed)):
        size = "no --shard-size" if theirs[1] is None else f"--shard-size {theirs[1]}"
        order = (f"--shuffle --seed {theirs[2]['seed']}" if theirs[2]["kind"] == "shuffled"
                 else "no --shuffle")
        raise PackError(f"{dst} is a pack of {src} made with --format {theirs[0]}, {size} and "
                        f"{order}; give the same options to continue it, or choose another "
                        "DST")
    return found


def _shard_files(dst: str, fmt: str) -> list[str]:
    pat = re.compile(r"shard-(\d{5})" + re.escape(SUFFIX[fmt]) + r"(\.part|-lock)?")
    return sorted(n for n in os.listdir(dst) if pat.fullmatch(n))


def pack(src: str, dst: str, opts: Options,
         progress: Callable[[Progress], None] | None = None) -> Result:
    """Pack ``src`` into ``dst`` (or continue an interrupted pack); see the module."""
    t0 = time.monotonic()
    if opts.fmt not in FORMATS:
        raise PackError(f"unknown format {opts.fmt!r} (choose lmdb, hdf5 or webdataset)")
    if not os.path.isdir(src):
        raise PackError(f"{src} is not a folder" if os.path.exists(src) else
                        f"{src} does not exist")
    src = os.path.realpath(src)
    dst = os.path.abspath(dst)
    real_dst = os.path.realpath(dst)
    if real_dst == src or real_dst.startswith(src.rstrip(os.sep) + os.sep):
        raise PackError(f"DST {dst} is inside SRC {src}; the pack would pack itself")
    found = _check_dst(src, dst, opts)
    if found is not None and found.get("complete"):
        return Result(found, already=True, seconds=time.monotonic() - t0)
    state = os.path.join(dst, STATE_DIR)
    if found is None:
        listing = list_samples(src)
        if not listing.samples and not listing.skipped:
            raise PackError(f"{src} holds no files")
        os.makedirs(state, exist_ok=True)
        samples = listing.samples
        if opts.shuffle_seed is not None:
            samples = shuffled(samples, opts.shuffle_seed)
        plan = {"pack_schema": PACK_SCHEMA, "src": src, "format": opts.fmt,
                "shard_size": opts.shard_size, "order": order_of(opts.shuffle_seed),
                "classes": listing.classes, "samples": samples, "skipped": listing.skipped,
                "created": time.time()}
        _write_json_atomic(os.path.join(state, "plan.json"), plan)
    else:
        plan = found
    packer = _Packer(src, dst, plan, opts, progress)
    resumed = packer.run()
    manifest = packer.verify()
    _write_json_atomic(os.path.join(dst, MANIFEST), manifest)
    shutil.rmtree(state, ignore_errors=True)
    return Result(manifest, resumed_from=resumed, seconds=time.monotonic() - t0,
                  verify_seconds=packer.verify_seconds)


class _Packer:
    def __init__(self, src: str, dst: str, plan: dict[str, Any], opts: Options,
                 progress: Callable[[Progress], None] | None) -> None:
        self.src, self.dst, self.plan, self.opts = src, dst, plan, opts
        self.fmt: str = plan["format"]
        self.shard_size: int | None = plan["shard_size"]
        self.samples: list[tuple[str, int | None]] = [(str(p), lab)
                                                       for p, lab in plan["samples"]]
        self.journal = os.path.join(dst, STATE_DIR, "journal.jsonl")
        self.entries: list[dict[str, Any]] = []
        self.skipped: list[dict[str, str]] = list(plan["skipped"])
        self.shards: list[dict[str, Any]] = []  # file, count, bytes, first
        self.next = 0  # the next plan index
        self.report = Progress(total=len(self.samples))
        self.progress = progress
        self.verify_seconds = 0.0
        self.lines: list[dict[str, Any]] = []
        self._writer: ShardWriter | None = None

    # journal ---------------------------------------------------------------

    def _replay(self) -> None:
        """Read the journal up to its last whole line, and rewrite it to just that."""
        lines: list[dict[str, Any]] = []
        try:
            with open(self.journal, encoding="utf-8") as fh:
                for raw in fh:
                    if not raw.endswith("\n"):
                        break
                    try:
                        lines.append(json.loads(raw))
                    except ValueError:
                        break
        except FileNotFoundError:
            pass
        self._apply(lines)

    def _apply(self, lines: list[dict[str, Any]]) -> None:
        self.entries, self.shards, self.next = [], [], 0
        self.skipped = list(self.plan["skipped"])
        self.lines = lines
        for line in lines:
            shard = line["shard"]
            if shard == len(self.shards):
                self.shards.append({"file": shard_name(self.fmt, shard), "first":
                                    len(self.entries), "count": 0, "bytes": 0})
            s = self.shards[shard]
            self.entries.extend(line["entries"])
            s["count"] += len(line["entries"])
            s["bytes"] += sum(e["size"] for e in line["entries"])
            self.skipped.extend(line["skipped"])
            self.next = line["end"]
        tmp = self.journal + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in lines)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.journal)

    def _journal(self, line: dict[str, Any]) -> None:
        with open(self.journal, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.lines.append(line)

    # writing ---------------------------------------------------------------

    def _open_shard(self, shard: int) -> ShardWriter:
        path = os.path.join(self.dst, shard_name(self.fmt, shard))
        s = self.shards[shard] if shard < len(self.shards) else None
        keep, keep_bytes = (s["count"], s["bytes"]) if s else (0, 0)
        first = s["first"] if s else len(self.entries)
        if self.fmt == "lmdb":
            initial = max(64 << 20, 2 * (self.shard_size or 0), 2 * keep_bytes)
            return _LMDBWriter(path, first, keep, initial)
        if self.fmt == "webdataset":
            return _TarWriter(path, sum(tar_span(e) for e in self.entries[first:first + keep]))
        try:
            return _HDF5Writer(path, keep_bytes)
        except OSError:
            pass
        # A shard HDF5 cannot open after a kill is written again from its first sample.
        for name in (path, path + ".part"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
        if keep_bytes or keep:
            self._apply([line for line in self.lines if line["shard"] < shard])
        return _HDF5Writer(path, 0)

    def run(self) -> int:
        """Pack what the journal does not hold yet; returns the plan index it resumed at."""
        self._replay()
        # Shard files past the journaled ones are leftovers of an interrupted run.
        current = max(len(self.shards) - 1, 0)
        for name in _shard_files(self.dst, self.fmt):
            if int(name[6:11]) > current:
                os.unlink(os.path.join(self.dst, name))
        writer = self._open_shard(current)
        if current == len(self.shards):
            self._new_shard(current)
        resumed = self.next
        self.report.done = self.next
        self.report.bytes = sum(e["size"] for e in self.entries)
        self._tick(force=True)
        try:
            self._pack_from(current, writer)
        except BaseException:
            # Interrupted or failed: let go of the shard as it is; the journal says how much
            # of it counts, and the next run cuts off the rest.
            with contextlib.suppress(Exception):
                (self._writer or writer).abandon()
            raise
        return resumed

    def _new_shard(self, shard: int) -> None:
        self.shards.append({"file": shard_name(self.fmt, shard), "first": len(self.entries),
                            "count": 0, "bytes": 0})

    def _reads(self) -> Iterator[tuple[int, bytes | Skip]]:
        """(plan index, bytes or Skip) from ``self.next`` on, read ahead in order by a pool."""
        def one(i: int) -> bytes | Skip:
            try:
                return read_sample(os.path.join(self.src, self.samples[i][0]))
            except Skip as exc:
                return exc

        pool = ThreadPoolExecutor(max_workers=max(1, self.opts.readers),
                                  thread_name_prefix="iolens-pack")
        ahead: deque[tuple[int, Future[bytes | Skip]]] = deque()
        todo = iter(range(self.next, len(self.samples)))
        try:
            for i in todo:
                ahead.append((i, pool.submit(one, i)))
                if len(ahead) >= 4 * max(1, self.opts.readers):
                    break
            while ahead:
                i, fut = ahead.popleft()
                nxt = next(todo, None)
                if nxt is not None:
                    ahead.append((nxt, pool.submit(one, nxt)))
                yield i, fut.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _pack_from(self, shard: int, writer: ShardWriter) -> None:
        s = self.shards[shard]
        batch: list[bytes] = []
        entries: list[dict[str, Any]] = []
        skipped: list[dict[str, str]] = []
        batch_bytes = 0
        start = self.next
        # a WebDataset shard's tar bytes: committed, and of the batch
        tar_done = sum(tar_span(e) for e in self.entries[s["first"]:]) \
            if self.fmt == "webdataset" else 0
        tar_batch = 0

        self._writer = writer

        def commit(end: int) -> None:
            nonlocal batch, entries, skipped, batch_bytes, start, tar_done, tar_batch
            if not batch and not skipped and end == start:
                return
            first = s["first"] + s["count"]
            writer.write(first, batch, entries)
            line = {"shard": len(self.shards) - 1, "start": start, "end": end,
                    "entries": entries, "skipped": skipped}
            self._journal(line)
            self.entries.extend(entries)
            self.skipped.extend(skipped)
            s["count"] += len(entries)
            s["bytes"] += batch_bytes
            self.next = end
            batch, entries, skipped, batch_bytes, start = [], [], [], 0, end
            tar_done, tar_batch = tar_done + tar_batch, 0

        for i, got in self._reads():
            path, label = self.samples[i]
            if isinstance(got, Skip):
                skipped.append({"path": path, "reason": str(got)})
            else:
                size = len(got)
                if (self.shard_size is not None and s["count"] + len(batch) > 0
                        and s["bytes"] + batch_bytes + size > self.shard_size):
                    commit(i)
                    writer.close()
                    self._new_shard(len(self.shards))
                    s = self.shards[-1]
                    tar_done = 0
                    self._writer = writer = self._open_shard(len(self.shards) - 1)
                index = s["first"] + s["count"] + len(batch)
                entry: dict[str, Any] = {"index": index, "key": sample_key(index).decode(),
                                         "path": path, "size": size, "label": label,
                                         "shard": len(self.shards) - 1,
                                         "blake2b": checksum(got)}
                if self.fmt == "hdf5":
                    entry["offset"] = s["bytes"] + batch_bytes
                elif self.fmt == "webdataset":  # where the file's bytes start in the tar
                    entry["offset"] = tar_done + tar_batch + TAR_BLOCK
                    tar_batch += tar_span(entry)
                batch.append(got)
                entries.append(entry)
                batch_bytes += size
                self.report.bytes += size
            self.report.done = i + 1
            self._tick()
            if len(batch) >= self.opts.commit_every or batch_bytes >= COMMIT_BYTES:
                commit(i + 1)
        self._tick(force=True)
        commit(len(self.samples))
        writer.close()

    _last_tick = 0.0

    def _tick(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (force or now - self._last_tick >= 0.1):
            self._last_tick = now
            self.progress(self.report)

    # verification ----------------------------------------------------------

    def verify(self) -> dict[str, Any]:
        """Re-read every stored sample, compare its checksum, and return the manifest."""
        t = time.monotonic()
        self.report.phase, self.report.done, self.report.bytes = "verify", 0, 0
        self.report.total = len(self.entries)
        self._tick(force=True)
        bad: list[str] = []
        for s in self.shards:
            mine = self.entries[s["first"]:s["first"] + s["count"]]
            for e, data in zip(mine, read_shard(self.dst, self.fmt, s["file"], mine),
                               strict=True):
                if data is None or len(data) != e["size"] or checksum(data) != e["blake2b"]:
                    bad.append(e["path"])
                self.report.done += 1
                self.report.bytes += len(data or b"")
                self._tick()
        self._tick(force=True)
        for lock in [n for n in _shard_files(self.dst, self.fmt) if n.endswith("-lock")]:
            os.unlink(os.path.join(self.dst, lock))
        self.verify_seconds = time.monotonic() - t
        if bad:
            raise PackFailed(f"verification failed: {len(bad)} stored samples differ from "
                             f"what was read (first: {bad[0]}); remove {self.dst} and pack "
                             "again")
        digest = hashlib.blake2b(digest_size=16)
        for e in self.entries:
            digest.update(f"{e['key']} {e['blake2b']}\n".encode())
        return {
            "pack_schema": PACK_SCHEMA, "complete": True, "src": self.src,
            "format": self.fmt, "shard_size": self.shard_size,
            "order": self.plan.get("order") or order_of(None), "count": len(self.entries),
            "bytes": sum(e["size"] for e in self.entries), "classes": self.plan["classes"],
            "labeled": bool(self.plan["classes"]), "checksum": CHECKSUM,
            "digest": digest.hexdigest(), "verified": True, "shards": self.shards,
            "samples": self.entries, "skipped": self.skipped,
            "created": self.plan.get("created"), "finished": time.time(),
        }


def read_shard(dst: str, fmt: str, file: str, entries: Sequence[dict[str, Any]],
               ) -> Iterator[bytes | None]:
    """The stored bytes of ``entries`` (all in shard ``file``), in order (None: missing)."""
    path = os.path.join(dst, file)
    if fmt == "lmdb":
        import lmdb  # noqa: PLC0415

        env = lmdb.open(path, subdir=False, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                for e in entries:
                    data = txn.get(e["key"].encode())
                    yield None if data is None else bytes(data)
        finally:
            env.close()
        return
    if fmt == "webdataset":
        yield from _read_tar(path, entries)
        return
    import h5py  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

    with h5py.File(path, "r") as fh:
        data = fh["data"]
        for e in entries:
            yield data[e["offset"]:e["offset"] + e["size"]].tobytes()


def _read_tar(path: str, entries: Sequence[dict[str, Any]]) -> Iterator[bytes | None]:
    """The samples of a WebDataset shard, read back as a tar reader sees it: each entry's
    file member under its name, at its offset, and its ``cls`` member with its label (None
    where any of it is wrong)."""
    import tarfile  # noqa: PLC0415

    with tarfile.open(path, "r:") as tar:
        members = iter(tar)
        for e in entries:
            want: list[tuple[str, bytes | None]] = [
                (f"{e['key']}.{tar_extension(e['path'])}", None)]
            if e.get("label") is not None:
                want.append((f"{e['key']}.cls", str(e["label"]).encode()))
            got: bytes | None = None
            for i, (name, content) in enumerate(want):
                m = next(members, None)
                fh = tar.extractfile(m) if m is not None and m.name == name else None
                data = fh.read() if fh is not None else None
                if data is None or (content is not None and data != content):
                    got = None
                    break
                if i == 0:
                    got = data if m is not None and m.offset_data == e["offset"] else None
            yield got


def describe_skipped(skipped: Sequence[dict[str, str]], limit: int = 5) -> str:
    """``a/b (a FIFO, not a file), c (permission denied), and 3 more``."""
    shown = [f"{s['path']} ({s['reason']})" for s in skipped[:limit]]
    more = len(skipped) - limit
    return ", ".join(shown) + (f", and {more} more (see the manifest)" if more > 0 else "")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
