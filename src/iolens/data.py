"""Datasets over packs made by ``iolens pack``: the original files' bytes, and their labels.

    from iolens.data import LMDBDataset
    ds = LMDBDataset("/data/train.pack", transform=decode)   # ds[i] == (decode(bytes), label)
    loader = DataLoader(ds, batch_size=64, num_workers=8, persistent_workers=True)

``ds[i]`` is ``(bytes, label)`` for the i-th file in the pack's order (the order
torchvision's ImageFolder gives the same folder, or a random one for a pack made
with ``--shuffle``); ``label`` is the class index, or -1 for a pack of a flat
folder. ``transform``, when given, is applied to the bytes. Both classes are
map-style datasets for any DataLoader: they open their LMDB environments or HDF5
files lazily, once per process, so every DataLoader worker opens its own after
the fork (an LMDB environment or an HDF5 file must not be used across a fork),
and they pickle without their open handles (for the spawn start method). lmdb,
h5py and torch are imported only when a sample is read.

Read a pack in large requests, which is what packing is for on a disk that limits
requests per second: a pack made with ``iolens pack --shuffle`` (its consecutive
samples mix the classes), read through :class:`BlockShuffleSampler` with the
block the batch size, so that each batch is a run of consecutive samples, which
``__getitems__`` reads in one request; the blocks come in a new random order each
epoch::

    ds = HDF5Dataset("/data/train.pack")
    loader = DataLoader(ds, batch_size=64, sampler=BlockShuffleSampler(ds, 64), ...)
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    _Base = Dataset[tuple[Any, int]]
else:
    _Base = object

__all__ = ["BlockShuffleSampler", "HDF5Dataset", "LMDBDataset", "PackDataset"]


class PackDataset(_Base):
    """What both pack datasets share: the manifest's keys, labels and shards, per-process
    handles, pickling without them."""

    format = ""

    def __init__(self, path: str | os.PathLike[str],
                 transform: Callable[[bytes], Any] | None = None) -> None:
        self.path = os.fspath(path)
        self.transform = transform
        manifest_path = os.path.join(self.path, "manifest.json")
        try:
            with open(manifest_path, encoding="utf-8") as fh:
                manifest = json.load(fh)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path} is not a complete pack (no manifest.json); "
                                    "run `iolens pack SRC DST` (again) to finish it") from None
        if manifest.get("format") != self.format:
            raise ValueError(f"{self.path} is a {manifest.get('format')} pack, not "
                             f"{self.format}")
        self.classes: list[str] = list(manifest["classes"])
        """The class names; a label is an index into them."""
        self.shard_files: list[str] = [s["file"] for s in manifest["shards"]]
        samples = manifest["samples"]
        self.labels: list[int] = [-1 if s["label"] is None else int(s["label"])
                                  for s in samples]
        self.sizes: list[int] = [int(s["size"]) for s in samples]
        self.shard_of: list[int] = [int(s["shard"]) for s in samples]
        self.locations: list[Any] = [self._location(s) for s in samples]
        self._handles: dict[int, Any] = {}
        self._pid = os.getpid()

    def _location(self, sample: dict[str, Any]) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.labels)

    def _shard(self, shard: int) -> Any:
        """This process's handle on ``shard``, opened on first use. Handles inherited over a
        fork are closed in this process (the files are only read: the parent's copies are
        not touched) and opened anew."""
        if self._pid != os.getpid():
            for handle in self._handles.values():
                with contextlib.suppress(Exception):
                    handle.close()
            self._handles = {}
            self._pid = os.getpid()
        handle = self._handles.get(shard)
        if handle is None:
            handle = self._handles[shard] = self._open(
                os.path.join(self.path, self.shard_files[shard]))
        return handle

    def _open(self, path: str) -> Any:
        raise NotImplementedError

    def _read(self, handle: Any, location: Any, size: int) -> bytes:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        data = self._read(self._shard(self.shard_of[index]), self.locations[index],
                          self.sizes[index])
        return (self.transform(data) if self.transform is not None else data,
                self.labels[index])

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, int]]:
        """The samples at ``indices`` (a DataLoader hands a batch's indices here): each run of
        consecutive samples in one shard is read in one request."""
        n = len(self)
        wanted = sorted({i + n if i < 0 else i for i in indices})
        if wanted and not (wanted[0] >= 0 and wanted[-1] < n):
            bad = next(i for i in indices if not -n <= i < n)
            raise IndexError(f"index {bad} out of range for {n} samples")
        got: dict[int, bytes] = {}
        start = 0
        for k in range(1, len(wanted) + 1):
            if (k < len(wanted) and wanted[k] == wanted[k - 1] + 1
                    and self.shard_of[wanted[k]] == self.shard_of[wanted[start]]):
                continue
            run = wanted[start:k]
            got.update(zip(run, self._read_run(self._shard(self.shard_of[run[0]]), run),
                           strict=True))
            start = k
        out = []
        for i in indices:
            data = got[i + n if i < 0 else i]
            out.append((self.transform(data) if self.transform is not None else data,
                        self.labels[i]))
        return out

    def _read_run(self, handle: Any, run: list[int]) -> list[bytes]:
        """The bytes of the consecutive samples ``run``, all in the shard ``handle``."""
        return [self._read(handle, self.locations[i], self.sizes[i]) for i in run]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def close(self) -> None:
        """Close this process's handles (they reopen on the next read)."""
        if self._pid == os.getpid():
            for handle in self._handles.values():
                handle.close()
        self._handles = {}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.path!r}: {len(self)} samples, "
                f"{len(self.classes)} classes, {len(self.shard_files)} shards)")


class LMDBDataset(PackDataset):
    """The samples of an LMDB pack (``iolens pack SRC DST --format lmdb``).

    ``readahead`` (default True) lets the kernel read ahead of each sample, which
    serves reads in the pack's order (or in shuffled blocks of it) in large
    requests; turn it off for uniformly random access to a pack larger than RAM.
    """

    format = "lmdb"

    def __init__(self, path: str | os.PathLike[str],
                 transform: Callable[[bytes], Any] | None = None, *,
                 readahead: bool = True) -> None:
        self.readahead = readahead
        super().__init__(path, transform)

    def _location(self, sample: dict[str, Any]) -> Any:
        return str(sample["key"]).encode()

    def _shard(self, shard: int) -> Any:
        # lmdb opens an environment once per process: datasets over the same pack share it.
        return _lmdb_env(os.path.join(self.path, self.shard_files[shard]), self.readahead)

    def close(self) -> None:
        """Close this process's environments of this pack (they reopen on the next read)."""
        for file in self.shard_files:
            env = _LMDB_ENVS.pop(os.path.realpath(os.path.join(self.path, file)), None)
            if env is not None:
                env.close()

    def _read(self, handle: Any, location: Any, size: int) -> bytes:
        with handle.begin() as txn:
            data = txn.get(location)
        if data is None:
            raise KeyError(f"{self.path}: no sample under key {location.decode()}")
        return bytes(data)

    def _read_run(self, handle: Any, run: list[int]) -> list[bytes]:
        # One transaction; the values of consecutive keys lie together in the map, where the
        # kernel reads them in large requests (readahead).
        out = []
        with handle.begin() as txn:
            for i in run:
                data = txn.get(self.locations[i])
                if data is None:
                    raise KeyError(f"{self.path}: no sample under key "
                                   f"{self.locations[i].decode()}")
                out.append(bytes(data))
        return out


class HDF5Dataset(PackDataset):
    """The samples of an HDF5 pack (``iolens pack SRC DST --format hdf5``): each shard file
    holds the samples back to back in the byte array ``data``."""

    format = "hdf5"

    def _location(self, sample: dict[str, Any]) -> Any:
        return int(sample["offset"])

    def _open(self, path: str) -> Any:
        import h5py  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

        # No chunk cache: a sample is read straight from its bytes in the file.
        return h5py.File(path, "r", rdcc_nbytes=0)

    def _read(self, handle: Any, location: Any, size: int) -> bytes:
        data: bytes = handle["data"][location:location + size].tobytes()
        return data

    def _read_run(self, handle: Any, run: list[int]) -> list[bytes]:
        # The samples lie back to back: one slice of the array, then cut.
        first = self.locations[run[0]]
        end = self.locations[run[-1]] + self.sizes[run[-1]]
        blob: bytes = handle["data"][first:end].tobytes()
        return [blob[self.locations[i] - first:self.locations[i] - first + self.sizes[i]]
                for i in run]


class BlockShuffleSampler:
    """Indices in blocks of ``block`` consecutive samples, the blocks in a random order that
    changes every epoch: a shuffle that keeps reads large.

    With ``block`` the DataLoader's ``batch_size``, every batch is one run of consecutive
    samples, which a pack dataset's ``__getitems__`` reads in one request (one of a disk's
    requests per batch, not per sample). Use it on a pack made with ``iolens pack
    --shuffle``, whose consecutive samples are already in a random order: a batch then mixes
    the classes, and which batches meet changes every epoch. The last, shorter block (when
    ``block`` does not divide the length) always comes last, so that the blocks before it
    stay aligned with the batches. The order is drawn from ``seed`` and the epoch: each pass
    over the sampler is the next epoch, or, once :meth:`set_epoch` was called (at the start
    of each epoch, as with ``DistributedSampler``), the epoch it set.
    """

    def __init__(self, data_source: Any, block: int, *, seed: int = 0) -> None:
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be a positive number of samples, not {block!r}")
        self.length = len(data_source)
        self.block = block
        self.seed = seed
        self.epoch = 0
        self._counting = True

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next passes give (the sampler no longer counts them)."""
        self.epoch = epoch
        self._counting = False

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Any:
        import random  # noqa: PLC0415

        full = self.length // self.block
        order = list(range(full))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        if self._counting:
            self.epoch += 1
        for b in order:
            yield from range(b * self.block, (b + 1) * self.block)
        yield from range(full * self.block, self.length)


_LMDB_ENVS: dict[str, Any] = {}
_LMDB_PID = [os.getpid()]


def _lmdb_env(path: str, readahead: bool) -> Any:
    """This process's read-only environment of the LMDB shard ``path``. Environments inherited
    over a fork are closed in the child (read-only and without locks, so the parent's stay as
    they are) and opened anew."""
    if _LMDB_PID[0] != os.getpid():
        for env in _LMDB_ENVS.values():
            with contextlib.suppress(Exception):
                env.close()
        _LMDB_ENVS.clear()
        _LMDB_PID[0] = os.getpid()
    key = os.path.realpath(path)
    env = _LMDB_ENVS.get(key)
    if env is None:
        import lmdb  # noqa: PLC0415

        # A finished pack is never written again: no lock file, no reader table.
        env = _LMDB_ENVS[key] = lmdb.open(key, subdir=False, readonly=True, lock=False,
                                          readahead=readahead)
    return env
