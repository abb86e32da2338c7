"""``iolens run --autotune``, inside the training process: each epoch's loader settings.

NOTE [autotune between epochs]: the decision is iolens' (iolens.job.autotune, in the
recorder's process, from the model of the epochs run so far); the job only measures its
epochs and applies what it is told, at the one moment a DataLoader may change its
workers without touching the data: the start of an epoch (``DataLoader.__iter__``). Each
epoch that ends is measured here (its batches, its time, its first batch's time) and,
when the next one starts, sent to iolens as an ask file (``ask-<pid>-<n>.json``, n the
number of its tuning, in the folder ``IOLENS_AUTOTUNE`` names); the epoch then waits for
the answer (at most ``IOLENS_AUTOTUNE_WAIT_S``, 30 s; past that iolens is taken for gone
and the loader is no longer tuned) and starts with the settings it holds. A persistent
loader's workers are shut down first so that the new ones start; torch makes new workers
each epoch otherwise.

Only ``num_workers`` and ``prefetch_factor`` change: they are read anew by each epoch's
iterator, and neither the sampler nor the dataset is touched, so each epoch sees the same
samples in the same order as without autotune (the sampler draws its shuffle from the
same generator either way). An iterable dataset is left as it is: each worker reads its
own share of it, which the worker count decides. Whatever fails here leaves the loader
as it was (NOTE [never hurt the job] in iolens/training/_hooks.py).

NOTE [a setting that fails]: settings autotune chose may fail where the code's own did
not: more workers than the memory holds (a worker killed by the kernel), a worker that
cannot start. The job must not pay for it. While a loader runs on settings other than
its code's (and yields in order), each index batch sent to a worker is kept until its
batch is in the training loop's hands. A worker's death is seen by torch's SIGCHLD
handler, which raises in the training process wherever it stands: while the iterator's
``next()`` runs that is caught there; in the training step it is kept and raised at the
next ``next()`` (``_watch_children``); where multiprocessing reaped the worker first,
torch's own check finds it within 5 s. The epoch is then finished in the training
process, as with num_workers=0: the batches sent and not in hand, in the order they
were sent, then the rest of the epoch's sampler, through the loader's own dataset and
collate_fn, so each sample comes once and in the code's order (there, as with
num_workers=0, no worker_init_fn runs, get_worker_info() is None and random
augmentations draw from the training process's generators). The loader goes back to its
code's settings at once, the next ask says what failed, and iolens answers with the best
settings that ran and tries nothing more. An iterator whose workers fail to start is
made again on the code's settings, with the random numbers it drew put back.

Pure standard library: imported inside the training process, only with ``--autotune``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from iolens.rundir import write_atomic

ENV = "IOLENS_AUTOTUNE"
"""The folder the asks and answers go through; unset: no autotune."""
FOLDER = "autotune"
"""That folder's name in the run directory."""
WAIT_ENV = "IOLENS_AUTOTUNE_WAIT_S"
WAIT_S = 30.0
POLL_S = 0.01
KEYS = ("num_workers", "prefetch_factor")
"""What autotune changes (torch reads them anew at each epoch's iterator)."""


@dataclass
class _Loader:
    """One loader's epochs as this process saw them."""

    epoch: int = 0
    """Epochs started."""
    started: float = 0.0
    first: float | None = None
    """When the epoch's first batch came."""
    ended: float | None = None
    batches: int = 0
    asked: int = 0
    refused: str | None = None
    ran: dict[str, Any] = field(default_factory=dict)
    """The settings the epoch runs with."""
    own: dict[str, Any] | None = None
    """The code's own settings (at the loader's first epoch)."""
    failed: dict[str, Any] | None = None
    """What failed in the epoch that ran, with which settings and what became of the
    epoch, not asked about yet (NOTE [a setting that fails])."""


@dataclass
class _Config:
    folder: str = ""
    wait_s: float = WAIT_S
    label: str = "--autotune"
    """How the user asked for it, in what is said."""
    quiet: bool = False
    guard: bool = False
    """The iterator being made runs on settings the code did not give (NOTE [a setting
    that fails])."""


class _Sent:
    """The index batches sent to a guarded iterator's workers and not yet in the training
    loop's hands, by the number torch sends them under (an in-order iterator's batch n is
    the epoch's n-th)."""

    __slots__ = ("got", "low", "sent")

    def __init__(self) -> None:
        self.sent: dict[int, Any] = {}
        self.low = 0
        self.got = 0
        """Batches of this epoch that reached the training loop."""

    def keep(self, send: int, index: Any) -> None:
        if send == 0:  # (a persistent iterator's next epoch)
            self.sent.clear()
            self.low = self.got = 0
        self.sent[send] = index
        while self.low < self.got:
            self.sent.pop(self.low, None)
            self.low += 1

    def owed(self, send: int) -> list[Any]:
        """Those not in the loop's hands, in order, with one drawn and not sent (``send``)."""
        return [self.sent[k] for k in range(self.got, send + 1) if k in self.sent]


_loaders: dict[int, _Loader] = {}
_alias: dict[int, int] = {}
"""A loader's tag -> the number its tuning goes by (NOTE [a loader made anew each
epoch])."""
_ids = itertools.count(1)
"""Each tuning's number, in the ask and answer files' names (a loader's tag may pass to
another loader, of another dataset, once its own is gone)."""
_held: dict[int, weakref.ref[Any]] = {}
"""A tag -> the loader that holds it now (a tag passes to a new loader once its own is
gone)."""
_by_kind: dict[tuple[str, str, Any], tuple[int, weakref.ref[Any]]] = {}
"""(dataset module, dataset class, batch size) -> (tuning tag, the loader it last served)."""
_conf = _Config()


def _tuning_tag(loader: Any, tag: int) -> int:
    """NOTE [a loader made anew each epoch]: a training loop may make its DataLoader again
    for each epoch (``for epoch in ...: loader = DataLoader(...)``). Each is a new object,
    with its own tag, that runs one epoch: tuned by its tag alone, none would ever ask. A
    loader of the same dataset class and batch size as one that no longer exists goes on
    with that one's tuning, and takes the settings it had reached; one made beside another
    that lives (a validation loader of the training's dataset class) is tuned apart."""
    held = _held.get(tag)
    if held is not None and held() is loader:
        return _alias[tag]
    ds = type(getattr(loader, "dataset", None))
    kind = (ds.__module__, ds.__qualname__, getattr(loader, "batch_size", None))
    prev = _by_kind.get(kind)
    got = _alias[tag] = prev[0] if prev is not None and prev[1]() is None else next(_ids)
    _held[tag] = weakref.ref(loader)
    _by_kind[kind] = (got, weakref.ref(loader))
    return got


def enabled() -> bool:
    """Whether ``iolens run --autotune`` asked for it (read from the environment), or
    ``iolens.monitor(autotune=True)`` (:func:`configure`)."""
    _conf.folder = os.environ.get(ENV) or _conf.folder
    _read_wait()
    return bool(_conf.folder)


def _read_wait() -> None:
    with contextlib.suppress(ValueError):
        _conf.wait_s = max(0.1, min(60.0, float(os.environ.get(WAIT_ENV, WAIT_S))))


def configure(folder: str | None, quiet: bool = False) -> bool:
    """``iolens.monitor(autotune=True)``: tune through ``folder`` from now on (None: no
    more), saying nothing with ``quiet``. Each recording's tuning starts anew."""
    _conf.folder = folder or ""
    _conf.label, _conf.quiet = "autotune", quiet
    _read_wait()
    for table in (_loaders, _alias, _held, _by_kind):
        table.clear()
    return bool(_conf.folder)


def refusal(loader: Any) -> str | None:
    """Why autotune leaves ``loader`` as it is, or None."""
    if getattr(loader, "_dataset_kind", 0) == 1:
        return ("an iterable dataset: each worker reads its own share of it, which the "
                "number of workers decides, so changing it changes the data")
    if getattr(loader, "batch_sampler", None) is None and not getattr(loader, "batch_size", 0):
        return "no batch size (batches made by the dataset itself)"
    return None


def epoch_starts(loader: Any, tag: int) -> None:
    """At ``DataLoader.__iter__``, before the epoch's iterator is made: ask for the settings
    of this epoch and apply them."""
    _conf.guard = False
    tag = _tuning_tag(loader, tag)
    st = _loaders.get(tag)
    if st is None:
        st = _loaders[tag] = _Loader(own=current(loader))
        st.refused = refusal(loader)
        if st.refused is not None:
            _say(f"{_conf.label} leaves the DataLoader of {type(loader.dataset).__name__} "
                 f"as it is: {st.refused}")
            _write(f"ask-{os.getpid()}-{tag}.json", {
                "pid": os.getpid(), "tag": tag, "seq": 0, "refused": st.refused,
                "dataset": type(loader.dataset).__name__})
    if st.failed is not None and st.ended is None:  # (an epoch the loop left early)
        st.ended = time.monotonic()
    if st.refused is None and st.epoch and st.ended is not None and (
            st.batches >= 2 or st.failed is not None):
        st.asked += 1
        ask = {"pid": os.getpid(), "tag": tag, "seq": st.asked, "epoch": st.epoch,
               "batches": st.batches, "seconds": st.ended - st.started,
               "first_s": (st.first or st.ended) - st.started,
               "persistent": bool(getattr(loader, "persistent_workers", False)),
               "dataset": type(loader.dataset).__name__, "settings": st.ran}
        if st.failed is not None:
            ask["failed"], st.failed = st.failed, None
        if not _write(f"ask-{os.getpid()}-{tag}.json", ask):
            st.refused = "the ask could not be written (the run directory takes no writes)"
        else:
            answer = _answer(f"answer-{os.getpid()}-{tag}.json", st.asked)
            if answer is not None:
                apply(loader, answer.get("settings") or {})
            else:  # iolens is gone, or stuck: the epochs no longer wait for it
                st.refused = f"iolens did not answer within {_conf.wait_s:g} s"
                _say(f"{_conf.label} stops for the DataLoader of "
                     f"{type(loader.dataset).__name__}: {st.refused}; it keeps "
                     f"{settings_text(current(loader))}")
    elif st.refused is None and st.ran:  # a loader made anew: the settings reached so far
        apply(loader, st.ran)
    st.epoch += 1
    st.ran = current(loader)
    st.started, st.first, st.ended, st.batches = time.monotonic(), None, None, 0
    if (st.refused is None and st.ran != st.own and loader.num_workers > 0
            and getattr(loader, "in_order", True)):
        _guard_workers()
        _conf.guard = True


def _say(message: str) -> None:
    if not _conf.quiet:
        with contextlib.suppress(Exception):  # NOTE [never hurt the job]: a closed stderr
            print(f"iolens: {message}", file=sys.stderr, flush=True)


def _torch_loader() -> Any:
    """torch's dataloader module (imported by the job: its loaders are being tuned)."""
    return sys.modules["torch.utils.data.dataloader"]


def _guard_workers() -> None:
    """Keep the index batches each guarded iterator sends its workers (NOTE [a setting
    that fails]): ``_next_index`` of torch's multiprocessing iterator, wrapped once."""
    cls = _torch_loader()._MultiProcessingDataLoaderIter
    if getattr(cls._next_index, "_iolens", False):
        return
    orig = cls._next_index

    def _next_index(self: Any) -> Any:
        index = orig(self)
        kept = self.__dict__.get("_iolens_sent")
        if kept is None and _conf.guard:
            kept = self.__dict__["_iolens_sent"] = _Sent()
        if kept is not None:
            kept.keep(self._send_idx, index)
        return index

    _next_index._iolens = True  # type: ignore[attr-defined]
    cls._next_index = _next_index


_guarded: weakref.WeakSet[Any] = weakref.WeakSet()
"""The guarded iterators alive."""
_inside: list[Any] = []
"""The guarded iterator whose ``next()`` runs now, if any."""


def iterator_made(loader: Any, it: Any) -> None:
    """After ``DataLoader.__iter__``: a guarded iterator knows its loader and its tuning,
    and its workers' deaths go through :func:`_on_child` (NOTE [a setting that fails])."""
    _conf.guard = False
    if "_iolens_sent" not in it.__dict__:
        return
    st = _state_of(loader)
    if st is None:
        del it.__dict__["_iolens_sent"]
        return
    it._iolens_loader = weakref.ref(loader)
    it._iolens_state = st
    _guarded.add(it)
    _watch_children()


def _watch_children() -> None:
    """NOTE [a setting that fails]: torch's SIGCHLD handler raises, in the training process,
    wherever it stands, when a worker dies. That is right while a guarded iterator's
    ``next()`` runs (the loader's own read of a batch half written by a worker killed
    then would wait for ever), and is caught there. Elsewhere (the training step), the
    death of a guarded iterator's worker is kept on that iterator and raised at its next
    ``next()``; any other's is raised as torch would."""
    signal = sys.modules.get("signal")
    if signal is None or getattr(signal.getsignal(signal.SIGCHLD), "_iolens", False):
        return
    torch_handler = signal.getsignal(signal.SIGCHLD)
    if not callable(torch_handler):
        return

    def _on_child(signum: int, frame: Any) -> None:
        if _inside:
            torch_handler(signum, frame)
            return
        try:
            torch_handler(signum, frame)
        except RuntimeError as exc:
            ours = _owner(exc)
            if ours is None:
                raise
            ours.__dict__.setdefault("_iolens_dead", exc)

    _on_child._iolens = True  # type: ignore[attr-defined]
    with contextlib.suppress(ValueError):  # (not the main thread: torch's handler stays)
        signal.signal(signal.SIGCHLD, _on_child)


def _owner(exc: BaseException) -> Any:
    """The guarded iterator whose worker torch's message ``exc`` names, or None."""
    text = str(exc)
    for it in list(_guarded):
        if any(f"(pid {w.pid})" in text for w in it.__dict__.get("_workers") or ()):
            return it
    return None


def guarded_next(it: Any, orig_next: Callable[[Any], Any]) -> Any:
    """``next()`` of a guarded iterator: a worker death kept for it is raised first, torch's
    own is raised while it runs, and a batch counts as got once it is in hand (one lost
    to an exception on the way is fetched again)."""
    _inside.append(it)
    try:
        dead = it.__dict__.pop("_iolens_dead", None)
        if dead is not None:
            raise dead
        data = orig_next(it)
    finally:
        _inside.pop()
    kept = it.__dict__.get("_iolens_sent")
    if kept is not None:
        kept.got += 1
    return data


def _state_of(loader: Any) -> _Loader | None:
    tag = next((t for t, ref in _held.items() if ref() is loader), None)
    return None if tag is None else _loaders.get(_alias[tag])


def _go_back(loader: Any | None, st: _Loader, what: str, then: str) -> None:
    """The loader (None: gone) back on its code's settings after ``what`` failed with
    the settings its epoch ran (``then``: what becomes of the epoch)."""
    st.failed = {"what": what, "settings": dict(st.ran), "then": then}
    own = st.own or {}
    name = type(getattr(loader, "dataset", None)).__name__
    if loader is not None:
        if loader.__dict__.get("_iterator") is not None:
            with contextlib.suppress(Exception):
                loader._iterator._shutdown_workers()
            loader._iterator = None
        loader.num_workers = own.get("num_workers", 0)
        loader.prefetch_factor = own.get("prefetch_factor")
    _say(f"{_conf.label}: {what} with {settings_text(st.ran)}; {then}, and the DataLoader "
         f"of {name} goes back to {settings_text(own)}")


def random_state(loader: Any) -> tuple[Any, Any] | None:
    """Before a guarded iterator is made: the state of the random numbers it draws from
    (the loader's generator, torch's own), for ``start_failed`` to put back."""
    if not _conf.guard:
        return None
    g = getattr(loader, "generator", None)
    torch = sys.modules["torch"]
    return (g.get_state() if g is not None else None), torch.random.get_rng_state()


def start_failed(loader: Any, exc: BaseException, random: tuple[Any, Any] | None) -> bool:
    """``DataLoader.__iter__`` raised ``exc``: True where the loader was guarded and is
    back on its code's settings, to be made again with the random numbers as they were
    before (``random``), so that its epoch draws the order the code's would."""
    guarded, _conf.guard = _conf.guard, False
    st = _state_of(loader) if guarded else None
    if st is None or random is None:
        return False
    g, own = random
    if g is not None:
        loader.generator.set_state(g)
    sys.modules["torch"].random.set_rng_state(own)
    _go_back(loader, st, f"the DataLoader's workers did not start ({exc})",
             "the epoch starts again")
    st.ran = current(loader)
    return True


def worker_failed(it: Any, exc: BaseException) -> bool:
    """``next()`` of a guarded iterator raised ``exc``: where one of its workers died, the
    epoch goes on in the training process (NOTE [a setting that fails]); False
    otherwise."""
    kept = it.__dict__.get("_iolens_sent")
    st = it.__dict__.get("_iolens_state")
    if (kept is None or st is None or not str(exc).startswith("DataLoader worker (pid")
            or not any(not w.is_alive() for w in it.__dict__.get("_workers") or ())):
        return False
    owed = collections.deque(kept.owed(it._send_idx))
    del it.__dict__["_iolens_sent"]
    _guarded.discard(it)
    sampler = it._sampler_iter
    with contextlib.suppress(Exception):
        it._shutdown_workers()
    torch_loader = _torch_loader()
    fetcher = torch_loader._DatasetKind.create_fetcher(
        it._dataset_kind, it._dataset, it._auto_collation, it._collate_fn, it._drop_last)
    pin, device = it._pin_memory, it._pin_memory_device

    def _next_data() -> Any:
        data = fetcher.fetch(owed.popleft() if owed else next(sampler))
        return torch_loader._utils.pin_memory.pin_memory(data, device) if pin else data

    it._next_data = _next_data
    it._iolens_rescued = True
    ref = it.__dict__.get("_iolens_loader")
    loader = ref() if ref is not None else None
    if loader is not None and loader.__dict__.get("_iterator") is it:
        loader._iterator = None
    _go_back(loader, st, str(exc).split(". ")[0].rstrip("."),
             "the epoch is finished in the training process")
    return True


def batch(tag: int, yielded: Any) -> None:
    """After a batch of loader ``tag`` (``yielded``: the iterator's count so far)."""
    st = _loaders.get(_alias.get(tag, tag))
    if st is not None and st.first is None and yielded == 1:
        st.first = time.monotonic()


def epoch_ends(tag: int, yielded: Any) -> None:
    """At the iterator's StopIteration: the epoch ran to its end."""
    st = _loaders.get(_alias.get(tag, tag))
    if st is not None and st.ended is None and type(yielded) is int:
        st.ended, st.batches = time.monotonic(), yielded


def current(loader: Any) -> dict[str, Any]:
    return {k: getattr(loader, k, None) for k in KEYS}


def apply(loader: Any, settings: dict[str, Any]) -> None:
    """Give ``loader`` ``settings`` (checked: whole numbers in range) for its next epoch."""
    want = {k: v for k, v in settings.items() if k in KEYS and type(v) is int}
    n = want.get("num_workers", loader.num_workers)
    if not 1 <= n <= 1024 or not 1 <= want.get("prefetch_factor", 1) <= 1024:
        return
    if all(getattr(loader, k, None) == v for k, v in want.items()):
        return
    it = loader.__dict__.get("_iterator")
    if it is not None:  # a persistent loader's workers: shut down, the next epoch starts new
        with contextlib.suppress(Exception):
            it._shutdown_workers()
        loader._iterator = None
    loader.num_workers = n
    if "prefetch_factor" in want:
        loader.prefetch_factor = want["prefetch_factor"]
    elif loader.prefetch_factor is None:  # a loader made with no workers has none
        loader.prefetch_factor = 2


def settings_text(settings: dict[str, Any]) -> str:
    """``num_workers=4, prefetch_factor=2``: settings as a DataLoader call takes them."""
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def _write(name: str, data: dict[str, Any]) -> bool:
    """Write an ask; False where it cannot be written."""
    if not _conf.folder:
        return False
    try:
        os.makedirs(_conf.folder, exist_ok=True)
        write_atomic(os.path.join(_conf.folder, name), json.dumps(data).encode())
    except OSError:
        return False
    return True


def _answer(name: str, seq: int) -> dict[str, Any] | None:
    """The answer to ask ``seq``, waited for at most ``_wait_s``; None without one."""
    path = os.path.join(_conf.folder, name)
    end = time.monotonic() + _conf.wait_s
    while True:
        with contextlib.suppress(OSError, ValueError):
            with open(path, "rb") as fh:
                got = json.loads(fh.read())
            if isinstance(got, dict) and got.get("seq") == seq:
                return got
        if time.monotonic() >= end:
            return None
        time.sleep(POLL_S)
