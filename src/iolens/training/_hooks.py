"""Zero-code DataLoader timing, installed inside the training process.

NOTE [never hurt the job]: every entry point here catches every exception.
A failure disables the instrumentation, writes why to
``<run>/timing/<pid>.json`` when it can, and lets training go on untouched.
The per-batch path does two clock reads, one array extend and one compare.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib.abc
import importlib.machinery
import json
import os
import queue
import stat
import sys
import time
import weakref
from array import array
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

# (imported now: a job whose interpreter lacks iolens has it on sys.path only while the
# bootstrap imports this module)
from iolens.rundir import append_whole, open_append, records, write_atomic

_now = time.monotonic_ns

SPARE_LIMIT_BYTES = 16 << 20
"""At most this much of the job's timing goes to the spare folder in /dev/shm (NOTE
[spare timing folder]): 700,000 batches."""


class TimingWriter:
    """Buffers records in memory and appends them to the process's timing file.

    NOTE [spare timing folder]: when the run directory stops taking writes (a
    full or read-only filesystem), the writer moves to ``spare``, a folder in
    memory (/dev/shm) whose name `iolens run` chose, makes it, and goes on there;
    the recorder reads both and moves the spare files into the run at the end.
    Only when that fails too, or past SPARE_LIMIT_BYTES (the DataLoader's
    workers need /dev/shm, and its pages count against the job's memory), are
    the records dropped (and counted).
    """

    __slots__ = ("_fd", "_ids", "_pfd", "buf", "directory", "dropped", "error", "flush_ns",
                 "last_flush", "loaders", "moved", "paths", "pid", "set_error", "spare",
                 "spare_bytes", "trackers", "typed", "written")

    def __init__(self, directory: str, flush_ns: int = 500_000_000,
                 spare: str | None = None) -> None:
        self.directory = directory
        self.spare = spare
        self.moved: str | None = None
        """Why the records went to ``spare`` instead of ``directory``; None while they do not."""
        self.spare_bytes = 0
        self.flush_ns = flush_ns
        self.buf: array[int] = array("q")
        self.last_flush = _now()
        self.pid = os.getpid()
        self._fd: int | None = None
        self._pfd: int | None = None
        self._ids: dict[int, tuple[int, int]] = {}
        """fd -> (st_dev, st_ino) of the files this writer opened (see _size_if_ours)."""
        self.paths: list[tuple[str, int]] = []
        """Folders the dataset was read from and their opens so far, not yet written (NOTE
        [dataset folders])."""
        self.dropped = 0
        self.written = 0
        self.error: str | None = None
        self.set_error: str | None = None
        """Why ``iolens run --set`` could not apply to a loader (the job then stopped)."""
        self.trackers: dict[str, str] = {}
        """The job's own trackers' run ids, by tracker, once noted (NOTE [the job's
        tracker run])."""
        self.loaders: dict[int, dict[str, Any]] = {}
        """The settings written of each loader, by tag (NOTE [loader settings])."""
        self.typed: set[int] = set()
        """Tags (shifted, as in the records) of the loaders whose batch types are noted."""

    def flush(self, now: int | None = None) -> None:
        """Append what is buffered; on failure, count the loss and remember why."""
        self.last_flush = _now() if now is None else now
        if self.paths:
            self._flush_paths()
        if not self.buf:
            return
        if self.error is not None:
            # The run directory cannot take writes: drop, so memory does not grow.
            self._drop()
            return
        try:
            fd, size = self._fd, self._size_if_ours(self._fd)
            if fd is None or size is None:
                fd, size = self._open(f"{self.pid}.bin")
                self._fd = fd
            data = self.buf.tobytes()
            if self.moved is not None:
                if self.spare_bytes + len(data) > SPARE_LIMIT_BYTES:
                    self.error = (f"timing records past {SPARE_LIMIT_BYTES >> 20} MiB in the "
                                  f"spare folder are dropped ({self.moved})")
                    self._drop()
                    return
                self.spare_bytes += len(data)
            # One write of whole records: O_APPEND keeps concurrent readers on
            # record boundaries, and a short write is cut back.
            append_whole(fd, data, size)
            self.written += len(self.buf) // 3
            del self.buf[:]
        except OSError as exc:
            why = f"cannot write timing records: {exc.strerror or exc}"
            if self.spare and self.moved is None:
                # NOTE [spare timing folder]: once, then on from there.
                self.moved = f"{why} in {self.directory}"
                self.directory = self.spare
                fd, self._fd = self._fd, None
                if fd is not None and self._size_if_ours(fd) is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self.flush(self.last_flush)
                return
            self.error = why
            self._drop()

    def _flush_paths(self) -> None:
        """Append the new dataset folders to ``<pid>.paths``, one JSON string a line."""
        lines, self.paths = self.paths, []
        if self.error is not None:
            return
        try:
            fd, size = self._pfd, self._size_if_ours(self._pfd)
            if fd is None or size is None:
                fd, size = self._open(f"{self.pid}.paths")
                self._pfd = fd
            data = "".join(json.dumps(list(p)) + "\n" for p in lines).encode()
            append_whole(fd, data, size)
        except (OSError, ValueError):
            pass  # the folders are a hint; the records matter more

    def _open(self, name: str) -> tuple[int, int]:
        """``name`` in the timing folder for appending, and its size; remembered as ours."""
        fd = open_append(os.path.join(self._folder(), name))
        st = os.fstat(fd)
        self._ids[fd] = (st.st_dev, st.st_ino)
        return fd, st.st_size

    def _size_if_ours(self, fd: int | None) -> int | None:
        """The size of the file behind ``fd`` while it is still the one this writer opened;
        None once the job closed the descriptor or put another file under its number
        (a worker that closes every descriptor, dup2 over it): then it is never written
        or closed again, as the number may be another file's now."""
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
        except OSError:
            self._ids.pop(fd, None)
            return None
        if self._ids.get(fd) != (st.st_dev, st.st_ino):
            self._ids.pop(fd, None)
            return None
        return st.st_size

    def _drop(self) -> None:
        self.dropped += len(self.buf) // 3
        del self.buf[:]

    def status(self, **extra: Any) -> None:
        """Write ``<pid>.json``: whether timing works here, and if not, why."""
        info = {"pid": self.pid, "records": self.written, "dropped": self.dropped,
                "error": self.error, **extra}
        if self.set_error is not None:
            info["set_error"] = self.set_error
        if self.moved is not None:
            info["moved"] = self.moved
        with contextlib.suppress(OSError, TypeError, ValueError):
            write_atomic(os.path.join(self._folder(), f"{self.pid}.json"),
                         json.dumps(info).encode())

    def note_tracker(self) -> None:
        """NOTE [the job's tracker run]: when the job has an MLflow run active as a
        DataLoader starts an epoch (the script called ``mlflow.start_run()``), write its
        id, experiment and tracking URI to ``tracker-mlflow-<pid>.json`` beside the timing
        files, so that ``iolens run --mlflow`` logs into that run instead of a new one.
        The same for a W&B run (``wandb.init()``): its id, project, entity and group, for
        ``--wandb`` to put iolens' run beside it. Neither package is imported here: only
        a job that imported it is asked."""
        m = sys.modules.get("mlflow")
        run = m.active_run() if m is not None else None
        if m is not None and run is not None:
            self.note_mlflow_run(run.info.run_id, run.info.experiment_id,
                                 str(m.get_tracking_uri()))
        w = sys.modules.get("wandb")
        theirs = getattr(w, "run", None) if w is not None else None
        if theirs is not None:
            self.note_wandb_run(str(theirs.id), str(theirs.project or ""),
                                str(theirs.entity or ""), str(theirs.group or ""))

    def note_mlflow_run(self, run_id: str, experiment_id: str, tracking_uri: str) -> None:
        """Name the MLflow run the job logs into (the fluent API's active run, or a
        framework logger's, such as Lightning's MLFlowLogger)."""
        self._note_run({"tracker": "mlflow", "run_id": run_id, "experiment_id": experiment_id,
                        "tracking_uri": tracking_uri})

    def note_wandb_run(self, run_id: str, project: str, entity: str, group: str) -> None:
        """Name the job's own W&B run (``wandb.run``), whose project, entity and group
        ``--wandb`` puts iolens' run beside."""
        self._note_run({"tracker": "wandb", "run_id": run_id, "project": project,
                        "entity": entity, "group": group})

    def note_loader(self, tag: int, loader: Any) -> None:
        """NOTE [loader settings]: once per loader, write ``loader-<pid>-<tag>.json``
        beside the timing files: the settings the advice must know (num_workers,
        persistent_workers, prefetch_factor, pin_memory, batch size, the start method,
        the sampler's and the dataset's types), so that it never asks for what is set
        already and knows data that sits in one large file."""
        if tag in self.loaders or self.moved is not None:
            return
        info = self.loaders[tag] = {"pid": self.pid, "tag": tag, **loader_settings(loader)}
        write_atomic(os.path.join(self._folder(), f"loader-{self.pid}-{tag}.json"),
                     json.dumps(info).encode())

    def note_batch(self, tag: int, batch: Any) -> None:
        """Add the types a batch of loader ``tag`` holds (``batch_types``: ``torch.Tensor``,
        ``numpy.ndarray``, ``list`` ...), how many leaves (``batch_leaves``), how many
        tensors (``batch_tensors``) and their bytes (``batch_bytes``) to its settings, and
        where the batch is its samples kept apart and alike, their fields
        (``batch_fields``): the hand-over advice says "return tensors" only to a loader
        whose batches hold something else (stacked, a tensor a field, where they are
        samples kept apart), and "one tensor" to one whose batches hold several."""
        self.typed.add(tag << records.TAG_SHIFT)
        info = self.loaders.get(tag)
        if info is None or self.moved is not None:
            return
        info["batch_types"] = ",".join(sorted(leaf_types(batch)))
        info["batch_leaves"], info["batch_tensors"], info["batch_bytes"] = batch_shape(batch)
        with contextlib.suppress(Exception):  # (a leaf's odd shape: the rest is written)
            fields = stackable_fields(batch, info.get("batch_size"))
            if fields is not None:
                info["batch_fields"] = fields
        write_atomic(os.path.join(self._folder(), f"loader-{self.pid}-{tag}.json"),
                     json.dumps(info).encode())

    def _note_run(self, info: dict[str, str]) -> None:
        """Write ``tracker-<tracker>-<pid>.json``, once a run (NOTE [the job's tracker run])."""
        name = info["tracker"]
        if self.moved is not None or self.trackers.get(name) == info["run_id"]:
            return
        write_atomic(os.path.join(self._folder(), f"tracker-{name}-{self.pid}.json"),
                     json.dumps({**info, "pid": self.pid}).encode())
        self.trackers[name] = info["run_id"]

    def _folder(self) -> str:
        """The timing directory, made if missing; OSError when a symlink stands in its place.

        The files in it are never written through a link either: NOTE [no writes
        through links] in iolens/rundir/__init__.py. The spare folder is made private
        (0700), and one this user does not own is refused.
        """
        if self.moved is None:
            os.makedirs(self.directory, exist_ok=True)
        else:
            with contextlib.suppress(FileExistsError):  # another process of the job made it
                os.mkdir(self.directory, 0o700)
        st = os.lstat(self.directory)
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, "the timing directory is a symbolic link", self.directory)
        if self.moved is not None and st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, "the spare timing folder belongs to another user",
                          self.directory)
        return self.directory

    def close(self) -> None:
        """Flush and close; safe to call twice."""
        self.flush()
        for fd in (self._fd, self._pfd):
            if fd is not None and self._size_if_ours(fd) is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._pfd = None
        self._ids.clear()


_writer: TimingWriter | None = None
_loader_tags: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_patched = False
_registered = False


def writer() -> TimingWriter | None:
    """The process's writer, if timing is on."""
    return _writer


def start(directory: str, flush_ns: int = 500_000_000, spare: str | None = None) -> TimingWriter:
    """Turn timing on for this process, writing under ``directory`` (or ``spare``, NOTE
    [spare timing folder])."""
    global _writer, _registered
    if _writer is None or _writer.directory not in (directory, spare):
        if _writer is not None:
            stop()
        _writer = TimingWriter(directory, flush_ns, spare)
        rank = _rank()
        if rank is not None:
            _writer.buf.extend((records.RANK, rank[0], rank[1]))
        if not _registered:
            atexit.register(_at_exit)
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _registered = True
        with contextlib.suppress(Exception):  # NOTE [never hurt the job]
            _install_audit()
    return _writer


def _rank() -> tuple[int, int] | None:
    """(rank, world size) from torchrun's environment, or None outside a multi-rank job."""
    try:
        return int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "0"))
    except (KeyError, ValueError):
        return None


def stop() -> None:
    """Flush, write the status file and turn timing off (the patches stay, idle)."""
    global _writer
    w, _writer = _writer, None
    if w is not None and w.pid == os.getpid():
        w.close()
        w.status(installed=_patched)


_inherited: tuple[str, int, str | None, str | None] | None = None
"""A forked child's parent's timing folder, flush period and spare folder: where a
DataLoader worker writes its stage timing (NOTE [stage timing])."""


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) must not write the parent's buffer.
    global _writer, _inherited, _clock
    w = _writer
    if w is not None:
        _inherited = (w.directory, w.flush_ns, w.spare, w.moved)
    _writer = None
    _clock = None


def _at_exit() -> None:
    w = _writer
    if w is not None and w.pid == os.getpid():
        w.close()
        if _patched or w.error or w.written:
            w.status(installed=_patched)


def _tag_for(loader: Any) -> int:
    """The loader's tag: the smallest no living loader of this process holds (a loader made
    anew each epoch takes the tag of the one gone, so that their timing reads as one loader;
    the count of living loaders, as before, could give a new loader the tag of one alive)."""
    try:
        tag = _loader_tags.get(loader)
        if tag is None:
            used = set(_loader_tags.values())
            tag = next(t for t in range(1, len(used) + 2) if t not in used)
            _loader_tags[loader] = tag
        return tag
    except TypeError:
        return 0


def step() -> None:
    """Mark the end of a training step in a loop that does not use a DataLoader."""
    w = _writer
    if w is None:
        return
    t = _now()
    w.buf.extend((records.STEP, t, 0))
    if t - w.last_flush > w.flush_ns:
        w.flush(t)


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _is_tensor(obj: Any) -> bool:
    """A torch tensor, its subclasses too (torchvision's tv_tensors, a Parameter): they go
    from a worker to the loop as a tensor does, through shared memory."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _leaf_type(obj: Any) -> str:
    if isinstance(obj, list | tuple):  # (of scalars, or bytes: default_collate keeps them)
        return "list" if isinstance(obj, list) else "tuple"
    return "torch.Tensor" if _is_tensor(obj) else _type_name(obj)


def leaf_types(batch: Any, depth: int = 3, limit: int = 32) -> set[str]:
    """The types of the leaves of a batch (tuples, lists and dicts walked ``depth`` deep,
    ``limit`` leaves at most); a list of numbers or strings is a ``list`` leaf (a tuple of
    them, as default_collate leaves a batch's bytes, a ``tuple``): it is pickled whole on
    its way from a worker, where a tensor goes through shared memory. A
    tensor's subclass is named ``torch.Tensor``, as it moves as one."""
    return {_leaf_type(obj) for obj in _leaves(batch, depth, limit)}


def batch_shape(batch: Any, depth: int = 3, limit: int = 1024) -> tuple[int, int, int]:
    """How many leaves a batch holds, how many of them are tensors, and their bytes (walked
    as :func:`leaf_types` walks it, ``limit`` leaves at most): each tensor goes from a
    worker to the loop as a shared-memory handle of its own, and each other leaf would as
    one (NOTE [a tensor's hand-over] in iolens/analysis/verdict/workers.py)."""
    leaves = tensors = size = 0
    for obj in _leaves(batch, depth, limit):
        leaves += 1
        if _is_tensor(obj):
            tensors += 1
            size += int(obj.nelement()) * int(obj.element_size())
        elif isinstance(obj, bytes | bytearray | str):
            size += len(obj)
        elif isinstance(obj, list | tuple):  # (of scalars or bytes: pickled whole)
            size += sum(len(x) if isinstance(x, bytes | bytearray | str) else 8
                        for x in obj[:limit])
        elif isinstance(n := getattr(obj, "nbytes", None), int):  # (a NumPy array)
            size += n
    return leaves, tensors, size


def stackable_fields(batch: Any, batch_size: Any, depth: int = 2,
                     limit: int = 1024) -> int | None:
    """How many fields each sample of a batch holds where the batch is its ``batch_size``
    samples kept apart (a list or tuple of them, as a collate_fn that returns its input
    makes) and the samples are alike: the same leaves under the same keys, each an array
    or a tensor of the same shape and dtype or a number, which the default collate_fn
    would stack into a tensor a field. None where the batch is not that (NOTE [samples
    kept apart] in iolens/analysis/verdict/workers.py)."""
    if type(batch_size) is not int or batch_size < 2 or not isinstance(batch, list | tuple) or (
            len(batch) != batch_size):
        return None
    first: list[tuple[Any, ...]] | None = None
    seen = 0
    for sample in batch:
        kind: list[tuple[Any, ...]] = []
        for at, leaf in _leaves_at(sample, depth, limit):  # (keys too: the collate's)
            shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
            if isinstance(shape, tuple):  # (a NumPy array's, or a tensor's torch.Size)
                kind.append((at, shape, str(dtype)))
            elif isinstance(leaf, int | float):
                kind.append((at, type(leaf).__name__))
            else:
                return None  # (bytes, strings, lists of them: not stacked)
        seen += len(kind)
        if not kind or seen > limit or (first is not None and kind != first):
            return None
        first = first or kind
    return len(first) if first else None


def _leaves(batch: Any, depth: int, limit: int) -> Iterator[Any]:
    return (obj for _, obj in _leaves_at(batch, depth, limit))


def _leaves_at(batch: Any, depth: int, limit: int) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """The leaves of ``batch`` with the keys and indices that lead to each."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), batch)]
    seen = 0
    while stack and seen < limit:
        at, obj = stack.pop()
        if len(at) < depth and isinstance(obj, dict):
            stack.extend(((*at, k), v) for k, v in list(obj.items())[:limit])
        elif len(at) < depth and isinstance(obj, tuple | list) and not (
                obj and isinstance(obj[0], int | float | str | bytes)):
            stack.extend(((*at, i), v) for i, v in enumerate(list(obj)[:limit]))
        else:  # (a leaf, or a list of scalars: pickled whole)
            seen += 1
            yield at, obj


def loader_settings(loader: Any) -> dict[str, Any]:
    """The settings of a DataLoader (or of any loader ``iolens.instrument()`` wraps) that
    the advice reads (NOTE [loader settings]); what a loader lacks is left out."""
    out: dict[str, Any] = {"loader": _type_name(loader)}
    for key in ("num_workers", "prefetch_factor", "batch_size"):
        v = getattr(loader, key, None)
        if type(v) is int:
            out[key] = v
    for key in ("persistent_workers", "pin_memory", "drop_last"):
        v = getattr(loader, key, None)
        if type(v) is bool:
            out[key] = v
    if "num_workers" in out:
        ctx = getattr(loader, "multiprocessing_context", None)
        method = getattr(ctx, "get_start_method", None)
        if callable(method):
            out["start_method"] = str(method())
        elif out["num_workers"] > 0:
            mp = sys.modules.get("multiprocessing")
            if mp is not None:  # (asked without fixing it: the job may still set it)
                out["start_method"] = str(mp.get_start_method(allow_none=True)
                                          or mp.get_all_start_methods()[0])
    for key in ("sampler", "batch_sampler", "dataset"):
        v = getattr(loader, key, None)
        if v is not None:
            out[key] = _type_name(v)
    given = getattr(loader, "_iolens_set", None)
    if isinstance(given, dict):
        out["set"] = dict(given)  # (iolens run --set: iolens.training.overrides)
    skipped = getattr(loader, "_iolens_set_skipped", None)
    if isinstance(skipped, dict) and skipped:
        out["set_skipped"] = dict(skipped)
    ds = getattr(loader, "dataset", None)
    if ds is not None:
        kind = getattr(loader, "_dataset_kind", None)
        out["iterable"] = kind == 1 if type(kind) is int else not hasattr(ds, "__getitem__")
        out["getitems"] = callable(getattr(ds, "__getitems__", None))
    return out


def _note_epoch(w: TimingWriter, loader: Any, it: Any, t: int) -> int:
    """Record an epoch start (and the loader's worker pids); returns the loader's tag."""
    try:
        tag = _tag_for(loader)
        if tag not in w.loaders:
            with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                w.note_loader(tag, loader)
        shift = records.TAG_SHIFT
        w.buf.extend((records.EPOCH | (tag << shift), t, int(getattr(loader, "num_workers", 0))))
        workers = 0
        for wid, proc in enumerate(getattr(it, "_workers", ()) or ()):
            pid = getattr(proc, "pid", None)
            if pid:
                w.buf.extend((records.WORKER | (tag << shift), int(pid), wid))
                workers += 1
        if workers:
            # At once, not at the next batch: the recorder tells the workers from other
            # processes by these pids, and spawned workers take seconds to their first.
            w.flush(t)
    except Exception:  # noqa: BLE001 - see NOTE [never hurt the job]
        return 0
    return tag


class TimedIterator:
    """Times ``next()`` of any iterator, for ``iolens.instrument(loader)``."""

    __slots__ = ("_it", "_kind")

    def __init__(self, loader: Any, it: Any) -> None:
        self._it = it
        w = _writer
        tag = _note_epoch(w, loader, it, _now()) if w is not None else 0
        if w is not None and not hasattr(loader, "num_workers"):
            w.buf.extend((records.ITERABLE | (tag << records.TAG_SHIFT), 1, 0))
        self._kind = records.BATCH | (tag << records.TAG_SHIFT)

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        t0 = _now()
        try:
            data = next(self._it)
        except StopIteration:
            w = _writer
            if w is not None:
                with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                    w.flush()  # the epoch's last batches, now (as the DataLoader patch does)
            raise
        t1 = _now()
        w = _writer
        if w is not None:
            w.buf.extend((self._kind, t0, t1))
            if t1 - w.last_flush > w.flush_ns:
                w.flush(t1)
        return data

    def __len__(self) -> int:
        return len(self._it)


def times_batches_of(loader: Any) -> bool:
    """Whether ``loader``'s batches are timed into a recording already.

    True when timing is on and ``loader`` is a torch DataLoader with the
    patch in place, a loader wrapped by ``iolens.instrument()``, or a list,
    tuple or dict of them (a framework may hold several). ``None`` (a loader
    the caller cannot name) counts as a DataLoader: nearly every training
    loop uses one.
    """
    if _writer is None:
        return False
    candidates = [getattr(sys.modules.get("iolens.api"), "InstrumentedLoader", None)]
    if _patched:
        candidates.append(getattr(sys.modules.get(_DataLoaderFinder.TARGET), "DataLoader", None))
    timed = tuple(c for c in candidates if isinstance(c, type))
    if not timed:
        return False
    if loader is None:
        return _patched
    stack, seen = [loader], 0
    while stack and seen < 64:  # (a bound: the first 64 tell)
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif not isinstance(item, timed):
            return False
    return True


class LoopTimer:
    """Times a training loop from a framework's own hooks (the Lightning and HF callbacks).

    Call :meth:`begin` when a step starts (its batch in hand) and :meth:`end`
    when it is done, and again after anything else that runs between steps
    but is not fetching data (validation, logging, checkpoints). A step's
    *data wait* runs from the last ``end()`` to its ``begin()``; the *step*
    from one ``begin()`` to the next (from :meth:`epoch` for an epoch's
    first), as the sidecar reckons the DataLoader patch's batches.

    The running totals (``batches``, ``wait_ns``, ``step_ns``) serve the
    callbacks' own figures. Records go to the recording only after
    :meth:`arm` found timing on and no DataLoader patch timing the same
    batches, so that none is counted twice. Per step: two clock reads, a few
    integer additions and, when recording, one array extend and one compare.
    """

    __slots__ = ("__weakref__", "_kind", "_last_begin", "_last_end", "_tag", "batches",
                 "recording", "step_ns", "wait_ns")

    def __init__(self) -> None:
        t = _now()
        self.batches = 0
        self.wait_ns = 0
        self.step_ns = 0
        self.recording = False
        """Whether :meth:`begin` writes batch records (see :meth:`arm`)."""
        self._tag = 0
        self._kind = records.BATCH
        self._last_begin = t
        self._last_end = t

    def arm(self, loader: Any = None) -> bool:
        """Decide whether the steps go to the recording; returns that decision.

        Yes when timing is on in this process and nothing times ``loader``
        already (see :func:`times_batches_of`): then the steps are this
        loop's only timing. Call it whenever the loader or the recording
        may have changed (each epoch).
        """
        try:
            self.recording = _writer is not None and not times_batches_of(loader)
            if self.recording and not self._tag:
                self._tag = _tag_for(self)
                self._kind = records.BATCH | (self._tag << records.TAG_SHIFT)
        except Exception:  # noqa: BLE001 - see NOTE [never hurt the job]
            self.recording = False
        return self.recording

    def epoch(self, num_workers: int = 0) -> None:
        """An epoch starts now: its first step's wait and time count from here."""
        t = _now()
        self._last_begin = self._last_end = t
        w = _writer
        if self.recording and w is not None:
            w.buf.extend((records.EPOCH | (self._tag << records.TAG_SHIFT), t, num_workers))

    def begin(self) -> None:
        """A step starts: its batch is in hand."""
        t = _now()
        end = self._last_end
        if end < self._last_begin:
            end = t  # no end() since the last step began: nothing known to be data wait
        self.batches += 1
        self.wait_ns += t - end
        self.step_ns += t - self._last_begin
        self._last_begin = t
        w = _writer
        if self.recording and w is not None:
            w.buf.extend((self._kind, end, t))
            if t - w.last_flush > w.flush_ns:
                w.flush(t)

    def end(self) -> None:
        """A step (or validation, logging, a checkpoint between steps) is done."""
        self._last_end = _now()

# -- stage timing inside the input pipeline -----------------------------------------------
#
# NOTE [stage timing]: inside each DataLoader worker (fork, spawn, forkserver) the
# worker loop's two queues and its collate_fn are wrapped, which splits each batch
# the worker makes into: the wait for its indices (idle), the fetch of its samples
# (from the indices in hand to the collate: dataset[i], __getitems__ or the
# iterable's next), with its on-CPU part from the thread's CPU clock, and the
# collate. The hand-over to the loop (the queue, unpickling, pin_memory) is joined
# by the recorder from the worker's READY record and the loop's HANDOVER record.
# With num_workers=0 the training process times the same stages of its own fetch.
# Per batch: seven clock reads, two of them the thread's CPU clock, and two array
# extends. An audit hook on "open" counts the files opened and notes the folders
# they are in (NOTE [dataset folders]). Any failure leaves the worker loop as torch
# wrote it (NOTE [never hurt the job]).
#
# A worker writes its records when it idles, every flush period, and after each batch
# that took _FLUSH_EACH_NS or more: a loop that stops mid-epoch leaves its persistent
# workers to multiprocessing, which ends them at exit with SIGTERM (torch's handler
# then leaves at once) while they fetch batches nobody will take, so a batch the loop
# took whose records were still buffered was lost (2 batches of 44, one worker with
# 4 batches prefetched, 54 ms a batch). The write of one batch's records took
# 4.3-4.7 us here, under 0.1% of a batch that slow; a faster worker idles (and
# writes) soon after the loop stops asking.

_cpu = time.thread_time_ns
_FLUSH_EACH_NS = 5_000_000
"""A batch fetched in this long or longer is written as soon as it is handed over."""
_PATHS_MAX = 64
"""At most this many dataset folders per process (an ImageNet tree has 1000)."""
_NOT_DATA = (".py", ".pyc", ".so")
_KERNEL_FS = ("/proc/", "/sys/", "/dev/")
_MARKS = frozenset(10 ** k for k in range(10))
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | _O_TMPFILE


class _StageClock:
    """One process's timing of the batch it is fetching now."""

    __slots__ = ("auto", "cpu_col", "cpu_got", "dirs", "files", "files_got", "idle", "ignore",
                 "samples", "t_col", "t_col_end", "t_got", "writer")

    def __init__(self, writer: TimingWriter, auto: bool) -> None:
        self.writer = writer
        self.auto = auto
        self.t_got = self.cpu_got = self.t_col = self.cpu_col = self.t_col_end = 0
        self.idle = 0
        """ns spent waiting in the index queue's get since the last batch was made."""
        self.samples = self.files = self.files_got = 0
        self.dirs: dict[str, list[Any]] = {}
        """Folder as opened -> [its absolute path, or None when it is not data; opens]."""
        self.ignore = tuple(d for d in (writer.directory, writer.spare) if d)

    def got(self) -> None:
        """The batch's indices are in hand: its fetch starts."""
        self.t_got = _now()
        self.cpu_got = _cpu()
        self.files_got = self.files
        self.samples = 0
        self.t_col_end = 0

    def emit(self, idx: int, t: int, ready: bool) -> None:
        """The batch is made: write its four records (only if its collate ran)."""
        if self.t_got and self.t_col_end:
            w = self.writer
            w.buf.extend((records.FETCH, self.t_col - self.t_got, self.cpu_col - self.cpu_got,
                          records.STAGE, self.t_col_end - self.t_col, self.idle,
                          records.COUNT, self.samples, self.files - self.files_got))
            if ready:
                w.buf.extend((records.READY, idx, t))
        self.t_got = 0
        self.idle = 0

    def opened(self, path: Any) -> None:
        """The audit hook saw a file opened for reading (NOTE [dataset folders]): a read of
        data counts.

        Left out: Python's own files, multiprocessing's folders, the kernel's
        filesystems and iolens' timing folder. A folder is noted when its opens reach
        1, 10, 100 ... so that the recorder can tell the dataset from a folder a
        library read a file in once.
        """
        if path.__class__ is bytes:
            path = os.fsdecode(path)
        if path.__class__ is not str or path.endswith(_NOT_DATA) or "/pymp-" in path:
            return  # (an fd, a dir_fd-relative name: no folder to tell)
        folder = _folder(path)
        entry = self.dirs.get(folder)
        if entry is None:
            if len(self.dirs) >= _PATHS_MAX:
                self.files += 1
                return
            entry = self.dirs[folder] = [_data_folder(folder, self.ignore), 0]
        if entry[0] is None:
            return
        self.files += 1
        n = entry[1] = entry[1] + 1
        if n in _MARKS:
            self.writer.paths.append((entry[0], n))


def _folder(path: str) -> str:
    """The folder of a path as opened ("." for a bare name, "/" for a file at the root)."""
    return (path.rpartition("/")[0] if "/" in path else ".") or "/"


def _data_folder(folder: str, ignore: tuple[str, ...]) -> str | None:
    """``folder`` made absolute, or None when it holds no data of the job's: the kernel's
    filesystems (but /dev/shm, a dataset's place in RAM) and iolens' timing folders."""
    full = os.path.abspath(folder)
    if full in ("/proc", "/sys", "/dev") or (full.startswith(_KERNEL_FS)
                                              and not full.startswith("/dev/shm/")):
        return None
    if ignore and full.startswith(ignore):
        return None
    return full


_clock: _StageClock | None = None
_audit_on = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    # NOTE [dataset folders]: every file a worker opens through Python (open, os.open,
    # io.open_code: PIL, numpy, torch.load, pandas ...) raises the "open" audit event,
    # whatever library asked for it. Native code (lmdb, HDF5) opens its files
    # without it; the recorder's scan of open files finds those.
    # A file opened for writing (a checkpoint, a log) notes its folder once, so that the
    # device it goes to is watched from the first write, not only while a scan of the
    # open files happens to catch it open.
    if event == "open":
        try:
            path, mode, flags = args[:3]
            if ((mode.__class__ is str and ("w" in mode or "a" in mode or "x" in mode
                                            or "+" in mode))
                    or (flags.__class__ is int and flags & _WRITE_FLAGS)):
                _note_write(path, flags)
                return
            c = _clock
            if c is not None:
                c.opened(path)
        except Exception:  # noqa: BLE001 - NOTE [never hurt the job]
            pass
    elif event in _NET_EVENTS:
        with contextlib.suppress(Exception):  # NOTE [never hurt the job]
            _note_url(event, args)


_NET_EVENTS = frozenset(("http.client.connect", "urllib.Request"))
_urls: set[str] = set()
"""The hosts (scheme://host:port) whose URLs are noted (NOTE [network storage] in
iolens/recorder/network.py)."""


def _note_url(event: str, args: tuple[Any, ...]) -> None:
    """Note where the job's Python code reads over the network: the URL of a urllib
    request, or the scheme, host and port of an http.client connection (requests and
    urllib3 use it), so that the recorder can name the peer its sockets connect to."""
    w = _writer
    if w is None or len(_urls) >= _PATHS_MAX:
        return
    if event == "urllib.Request":
        url = args[0]
        if url.__class__ is not str or "://" not in url:
            return
        key = url.split("/", 3)[:3]
        host = "/".join(key)
    else:
        conn, name, port = args[0], args[1], args[2]
        scheme = "https" if "HTTPS" in type(conn).__name__ else "http"
        host = url = f"{scheme}://{name}:{port}"
    if host in _urls:
        return
    _urls.add(host)
    w.paths.append((url, 1))


_written: dict[str, bool] = {}
"""Folders (as opened) that files were opened for writing in, noted or not."""


def _note_write(path: Any, flags: Any) -> None:
    w = _writer
    if w is None or len(_written) >= _PATHS_MAX:
        return
    if flags.__class__ is int and _O_TMPFILE and (flags & _O_TMPFILE) == _O_TMPFILE:
        return  # (O_TMPFILE carries O_DIRECTORY's bit: multiprocessing's temporary files)
    if path.__class__ is bytes:
        path = os.fsdecode(path)
    if path.__class__ is not str or "/pymp-" in path:
        return
    folder = _folder(path)
    if folder in _written:
        return
    full = _data_folder(folder, tuple(d for d in (w.directory, w.spare) if d))
    _written[folder] = full is not None
    if full is not None:
        w.paths.append((full, -1))  # -1: written (NOTE [dataset folders])
        w._flush_paths()  # now: a checkpoint's writes should not wait for the next batch


def _install_audit() -> None:
    global _audit_on
    if not _audit_on:
        sys.addaudithook(_audit)
        _audit_on = True


def _start_clock(auto: bool) -> _StageClock | None:
    """This process's stage clock, made with its writer (a worker's own) if timing is on."""
    global _clock
    w = _writer
    if w is None and _inherited is not None:
        directory, flush_ns, spare, moved = _inherited
        w = start(directory, flush_ns, spare)
        w.moved = moved
    if w is None:
        return None
    _clock = _StageClock(w, auto)
    _install_audit()
    return _clock


class _TimedIndexQueue:
    """A worker's index queue: notes when each batch's indices arrive."""

    __slots__ = ("_c", "_q")

    def __init__(self, q: Any, c: _StageClock) -> None:
        self._q = q
        self._c = c

    def get(self, *args: Any, **kwargs: Any) -> Any:
        c = self._c
        w = c.writer
        t0 = _now()
        try:
            if w.buf:
                # Work waiting is taken at once, as torch's own get would (one poll
                # either way). None waiting: the worker is ahead and about to idle, so
                # hand the figures over now, while nothing waits for it; a worker that
                # the process ends at exit (multiprocessing terminates daemonic
                # children) would otherwise lose its last batches.
                try:
                    r = self._q.get(False)
                except queue.Empty:
                    try:  # (as in put: plain try costs nothing when nothing fails)  # noqa: SIM105
                        w.flush()
                    except Exception:  # noqa: BLE001 - NOTE [never hurt the job]
                        pass
                    r = self._q.get(*args, **kwargs)
            else:
                r = self._q.get(*args, **kwargs)
        except BaseException:
            c.idle += _now() - t0  # (torch's get times out every 5 s while idle)
            raise
        if type(r) is tuple:  # (idx, indices); None and _ResumeIteration are not batches
            c.got()
            c.idle += c.t_got - t0
        else:
            c.idle += _now() - t0
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self._q, name)


class _TimedDataQueue:
    """A worker's result queue: the batch is made when the worker puts it."""

    __slots__ = ("_c", "_q")

    def __init__(self, q: Any, c: _StageClock) -> None:
        self._q = q
        self._c = c

    def put(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        c = self._c
        t = _now()
        slow = False
        try:  # (not contextlib.suppress: this runs for every batch)
            if type(obj) is tuple and len(obj) == 2 and type(obj[0]) is int:
                slow = c.t_got != 0 and t - c.t_got >= _FLUSH_EACH_NS
                c.emit(obj[0], t, True)
        except Exception:  # noqa: BLE001 - NOTE [never hurt the job]
            pass
        r = self._q.put(obj, *args, **kwargs)
        w = c.writer
        if slow or t - w.last_flush > w.flush_ns:
            # After the put: the batch is on its way before the write (NOTE [stage
            # timing]: a slow batch at once, as the worker may not live to the next).
            try:  # noqa: SIM105
                w.flush(t)
            except Exception:  # noqa: BLE001 - NOTE [never hurt the job]
                pass
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self._q, name)


def items_in(batch: Any) -> int:
    """How many samples one item of a loader without automatic batching holds
    (``batch_size=None``): a batch the dataset made itself (WebDataset's ``.batched(n)``)
    holds n, a single sample 1.

    A made batch is a tuple, list or dict of tensors, arrays and lists that all share one
    leading length n >= 2, one of them a label's 1-D tensor or list of n; a sample (an
    image of shape (3, H, W) and an int label) has no such leaf.
    """
    parts = batch.values() if isinstance(batch, dict) else batch
    if not isinstance(parts, (tuple, list, type({}.values()))):
        return 1
    n = 0
    flat = False
    for leaf in parts:
        shape = getattr(leaf, "shape", None)
        if shape is not None:
            if not shape:
                return 1
            size, flat = int(shape[0]), flat or len(shape) == 1
        elif isinstance(leaf, list):
            size, flat = len(leaf), True
        else:
            return 1
        if size < 2 or (n and size != n):
            return 1
        n = size
    return n if flat else 1


def _timed_collate(collate: Callable[[Any], Any], c: _StageClock) -> Callable[[Any], Any]:
    def collate_fn(batch: Any) -> Any:
        c.t_col = _now()
        c.cpu_col = _cpu()
        if c.auto:
            c.samples += len(batch) if type(batch) is list else 1
        else:  # (the dataset batches itself: NOTE [stage timing])
            c.samples += items_in(batch)
        out = collate(batch)
        c.t_col_end = _now()
        return out

    collate_fn.__wrapped__ = collate  # type: ignore[attr-defined]
    return collate_fn


_WORKER_ARGS = 7
"""torch's worker loop takes (dataset_kind, dataset, index_queue, data_queue, done_event,
auto_collation, collate_fn, ...) by position."""


def _wrap_worker_loop(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _worker_loop(*args: Any, **kwargs: Any) -> Any:
        c = None
        try:
            # The name torch gives its workers, a moment earlier than torch does (it sets
            # its signal handlers first): the recorder tells a worker from any other
            # child by it, and a forked worker is otherwise named as its parent.
            name = getattr(sys.modules.get("torch.multiprocessing"), "_set_thread_name", None)
            if callable(name):
                name("pt_data_worker")
        except Exception:  # noqa: BLE001 - NOTE [never hurt the job]
            pass
        try:
            if len(args) >= _WORKER_ARGS and not kwargs and callable(args[6]):
                c = _start_clock(bool(args[5]))
                if c is not None:
                    args = (*args[:2], _TimedIndexQueue(args[2], c), _TimedDataQueue(args[3], c),
                            args[4], args[5], _timed_collate(args[6], c), *args[7:])
        except Exception:  # noqa: BLE001 - NOTE [never hurt the job]
            c = None
        try:
            return orig(*args, **kwargs)
        finally:
            if c is not None:
                # A forked worker ends in os._exit, which runs no atexit handler.
                with contextlib.suppress(Exception):
                    stop()

    # Pickled by reference for spawn and forkserver: the child finds its own patched
    # copy under torch's name (or torch's own, where iolens is not loaded there).
    _worker_loop.__module__ = orig.__module__
    _worker_loop.__qualname__ = orig.__qualname__
    _worker_loop.__wrapped__ = orig  # type: ignore[attr-defined]
    return _worker_loop


def _patch_worker_loop(module: ModuleType) -> None:
    worker = sys.modules.get(module.__name__.rpartition(".")[0] + "._utils.worker")
    if worker is None:
        worker = getattr(getattr(module, "_utils", None), "worker", None)
    orig = getattr(worker, "_worker_loop", None)
    if worker is None or orig is None or hasattr(orig, "__wrapped__"):
        return
    setattr(worker, "_worker_loop", _wrap_worker_loop(orig))  # noqa: B010 - a module's name


def _time_in_process(it: Any) -> None:
    """num_workers=0: the training process times its own fetch (NOTE [stage timing])."""
    fetcher = getattr(it, "_dataset_fetcher", None)
    collate = getattr(fetcher, "collate_fn", None)
    if fetcher is None or getattr(it, "_workers", None) is not None or not callable(collate):
        return
    c = _clock if _clock is not None and _clock.writer is _writer else _start_clock(True)
    if c is None:
        return
    if not hasattr(collate, "__wrapped__"):
        fetcher.collate_fn = _timed_collate(collate, c)
    c.auto = bool(getattr(fetcher, "auto_collation", True))
    it._iolens_clock = c


def patch_dataloader(module: ModuleType) -> None:
    """Wrap ``_BaseDataLoaderIter.__next__`` and ``DataLoader.__iter__`` of torch's dataloader."""
    global _patched, _tuning
    if _patched:
        return
    base = module._BaseDataLoaderIter
    loader_cls = module.DataLoader
    orig_next: Callable[[Any], Any] = base.__next__
    orig_iter: Callable[[Any], Any] = loader_cls.__iter__
    batch = records.BATCH
    shift = records.TAG_SHIFT

    handover = records.HANDOVER

    def __next__(self: Any) -> Any:
        t0 = _now()
        c = getattr(self, "_iolens_clock", None)
        if c is not None:
            c.got()
        try:
            try:
                if _tuning and "_iolens_sent" in self.__dict__:
                    data = _tuner().guarded_next(self, orig_next)
                else:
                    data = orig_next(self)
            except RuntimeError as exc:  # NOTE [a setting that fails] in training/autotune.py
                if not (_tuning and _worker_failed(self, exc)):
                    raise
                data = orig_next(self)
        except StopIteration:
            # The epoch is over: hand its last batches over now, not at the next
            # epoch's, so that a job killed between epochs loses none of them.
            w = _writer
            if w is not None:
                with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                    w.flush()
                    if _tuning:
                        _tuner().epoch_ends(getattr(self, "_iolens_tag", 0),
                                            self.__dict__.get("_num_yielded"))
            raise
        t1 = _now()
        w = _writer
        if w is not None:
            tag = getattr(self, "_iolens_tag", 0) << shift
            if _tuning and self.__dict__.get("_num_yielded") == 1:
                with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                    _tuner().batch(tag >> shift, 1)
            w.buf.extend((batch | tag, t0, t1))
            if c is not None:
                c.emit(0, t1, False)
            elif (self.__dict__.get("_in_order", True) and "_workers" in self.__dict__
                  and "_iolens_rescued" not in self.__dict__):
                idx = self.__dict__.get("_rcvd_idx")
                if type(idx) is int:  # NOTE [stage timing]: the recorder joins it
                    w.buf.extend((handover | tag, idx - 1, t0))
            # An epoch's first batch is written at once: a job that hangs (or is killed)
            # right after it leaves it on disk, not in this buffer.
            if t1 - w.last_flush > w.flush_ns or self.__dict__.get("_num_yielded") == 1:
                w.flush(t1)
                if tag not in w.typed:  # (once per loader, at a flush: off the batch path)
                    with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                        w.note_batch(tag >> shift, data)
        return data

    def __iter__(self: Any) -> Any:
        t = _now()
        tuning = _tuning and _writer is not None
        random = None
        if tuning:
            with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                _tuner().epoch_starts(self, _tag_for(self))
                random = _tuner().random_state(self)
        try:
            it = orig_iter(self)
        except Exception as exc:  # NOTE [a setting that fails] in training/autotune.py
            if not (tuning and _start_failed(self, exc, random)):
                raise
            it = orig_iter(self)
        if tuning:
            with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                _tuner().iterator_made(self, it)
        w = _writer
        if w is not None:
            it._iolens_tag = _note_epoch(w, self, it, t)
            with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                _time_in_process(it)
            with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                w.note_tracker()
        return it

    __next__.__wrapped__ = orig_next  # type: ignore[attr-defined]
    __iter__.__wrapped__ = orig_iter  # type: ignore[attr-defined]
    base.__next__ = __next__
    loader_cls.__iter__ = __iter__
    _patched = True
    _patch_settings(loader_cls)
    with contextlib.suppress(Exception):  # NOTE [never hurt the job]
        _tuning = _tuner().enabled()
    with contextlib.suppress(Exception):  # NOTE [never hurt the job]: the loop's timing stands
        _patch_worker_loop(module)


_tuning = False
"""``iolens run --autotune`` (NOTE [autotune between epochs] in
iolens/training/autotune.py)."""


def _tuner() -> ModuleType:
    from iolens.training import autotune  # noqa: PLC0415 - only with --autotune

    return autotune


def _worker_failed(it: Any, exc: BaseException) -> bool:
    try:
        return bool(_tuner().worker_failed(it, exc))
    except Exception:  # noqa: BLE001 - NOTE [never hurt the job]: the loader's error stands
        return False


def _start_failed(loader: Any, exc: BaseException, random: Any) -> bool:
    try:
        return bool(_tuner().start_failed(loader, exc, random))
    except Exception:  # noqa: BLE001 - NOTE [never hurt the job]: the loader's error stands
        return False


def use_autotune(folder: str | None, quiet: bool = False) -> None:
    """``iolens.monitor(autotune=True)``: the loaders' settings between epochs through
    ``folder`` (None: no more), saying nothing on stderr with ``quiet``."""
    global _tuning
    with contextlib.suppress(Exception):  # NOTE [never hurt the job]
        _tuning = _tuner().configure(folder, quiet)


_settings: dict[str, Any] = {}
_set_names: list[str] = []
"""The DataLoader settings ``iolens run --set`` (or ``monitor(set=...)``) gives, and the
dataset class names whose loaders take them (none: every loader)."""
_init_of: Any = None
"""The DataLoader class whose ``__init__`` takes them, once patched."""
_took = 0
"""Loaders that took them so far."""
set_errors_raise = False
"""A setting a loader cannot take raises ValueError in the job (``monitor(set=...)``)
rather than ending it with exit 2 (``iolens run --set``)."""


def use_settings(settings: dict[str, Any], names: Sequence[str] = ()) -> None:
    """Give the DataLoaders made from now on ``settings`` (iolens.training.overrides, checked
    by the caller); empty: their own again."""
    global _settings, _set_names
    _settings, _set_names = dict(settings), list(names)
    mod = sys.modules.get(_DataLoaderFinder.TARGET)
    if _settings and _patched and mod is not None:
        _patch_settings(mod.DataLoader)


def _patch_settings(loader_cls: Any) -> None:
    """``iolens run --set``: the DataLoader's ``__init__`` takes the settings given instead
    of the job's own (iolens.training.overrides), for every loader or those whose dataset
    class is named. Nothing is patched without them."""
    global _init_of
    from iolens.training import overrides  # noqa: PLC0415 - only with --set

    if not _settings:
        got, names = overrides.from_env(os.environ.get(overrides.ENV))
        if got:
            use_settings(got, names)
    if not _settings or _init_of is not None:
        return
    import inspect  # noqa: PLC0415

    orig_init: Callable[..., None] = loader_cls.__init__
    sig = inspect.signature(orig_init)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        global _took
        settings, names = _settings, _set_names
        if not settings:
            orig_init(self, *args, **kwargs)
            return
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:  # torch says what is wrong with the job's own arguments
            orig_init(self, *args, **kwargs)
            return
        given = {k: v for k, v in bound.arguments.items() if k != "self"}
        dataset = given.get("dataset")
        if names and not overrides.names_of(dataset) & set(names):
            orig_init(self, *args, **kwargs)
            return
        taken, skipped = dict(settings), {}
        try:
            merged = overrides.merged(settings, given)
        except overrides.SetError as exc:
            message = f"{exc} (dataset {type(dataset).__name__})"
            if not _took:
                # The first loader cannot take what was asked: say so and stop before the
                # training starts (exit 2, as a usage error), rather than train on settings
                # other than those asked for.
                if set_errors_raise:
                    raise ValueError(message) from None
                print(f"iolens: error: {message}", file=sys.stderr, flush=True)
                w = _writer
                if w is not None:
                    w.set_error = message
                    with contextlib.suppress(Exception):  # NOTE [never hurt the job]
                        w.status(installed=_patched)
                raise SystemExit(2) from None
            # Another loader took them (a validation loader without workers beside the
            # training's): this one keeps its own for what it cannot take, with a warning;
            # the training goes on.
            skipped = {k: v for k, v in settings.items() if k in overrides.NEEDS_WORKERS}
            taken = {k: v for k, v in settings.items() if k not in skipped}
            print(f"iolens: warning: {overrides.line(skipped)} left out for the DataLoader of "
                  f"{type(dataset).__name__}: it has no workers", file=sys.stderr, flush=True)
            merged = overrides.merged(taken, given)
        for k, v in merged.items():
            bound.arguments[k] = v
        orig_init(*bound.args, **bound.kwargs)
        self._iolens_set = taken
        if skipped:
            self._iolens_set_skipped = skipped
        _took += 1

    __init__.__wrapped__ = orig_init  # type: ignore[attr-defined]
    loader_cls.__init__ = __init__
    _init_of = loader_cls


class _DataLoaderFinder(importlib.abc.MetaPathFinder):
    """Patches torch.utils.data.dataloader right after the user's script imports it."""

    TARGET = "torch.utils.data.dataloader"

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        try:
            patch_dataloader(module)
        except Exception as exc:  # noqa: BLE001 - see NOTE [never hurt the job]
            w = _writer
            if w is not None:
                w.error = f"could not instrument torch's DataLoader: {exc!r}"
                w.status(installed=False)


def install_import_hook() -> None:
    """Patch torch's DataLoader now if imported, else as soon as it is."""
    mod = sys.modules.get(_DataLoaderFinder.TARGET)
    if mod is not None:
        patch_dataloader(mod)
        return
    if not any(isinstance(f, _DataLoaderFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DataLoaderFinder())
