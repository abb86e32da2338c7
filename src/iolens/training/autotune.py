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

Pure standard library: imported inside the training process, only with ``--autotune``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import time
import weakref
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


@dataclass
class _Config:
    folder: str = ""
    wait_s: float = WAIT_S


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


def configure(folder: str | None) -> bool:
    """``iolens.monitor(autotune=True)``: tune through ``folder`` from now on (None: no
    more). Each recording's tuning starts anew."""
    _conf.folder = folder or ""
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
    tag = _tuning_tag(loader, tag)
    st = _loaders.get(tag)
    if st is None:
        st = _loaders[tag] = _Loader()
        st.refused = refusal(loader)
        if st.refused is not None:
            print(f"iolens: --autotune leaves the DataLoader of {type(loader.dataset).__name__} "
                  f"as it is: {st.refused}", file=sys.stderr, flush=True)
            _write(f"ask-{os.getpid()}-{tag}.json", {
                "pid": os.getpid(), "tag": tag, "seq": 0, "refused": st.refused,
                "dataset": type(loader.dataset).__name__})
    if st.refused is None and st.epoch and st.ended is not None and st.batches >= 2:
        st.asked += 1
        ask = {"pid": os.getpid(), "tag": tag, "seq": st.asked, "epoch": st.epoch,
               "batches": st.batches, "seconds": st.ended - st.started,
               "first_s": (st.first or st.ended) - st.started,
               "persistent": bool(getattr(loader, "persistent_workers", False)),
               "dataset": type(loader.dataset).__name__, "settings": st.ran}
        if not _write(f"ask-{os.getpid()}-{tag}.json", ask):
            st.refused = "the ask could not be written (the run directory takes no writes)"
        else:
            answer = _answer(f"answer-{os.getpid()}-{tag}.json", st.asked)
            if answer is not None:
                apply(loader, answer.get("settings") or {})
            else:  # iolens is gone, or stuck: the epochs no longer wait for it
                st.refused = f"iolens did not answer within {_conf.wait_s:g} s"
                print(f"iolens: --autotune stops for the DataLoader of "
                      f"{type(loader.dataset).__name__}: {st.refused}; it keeps "
                      f"{settings_text(current(loader))}", file=sys.stderr, flush=True)
    elif st.refused is None and st.ran:  # a loader made anew: the settings reached so far
        apply(loader, st.ran)
    st.epoch += 1
    st.ran = current(loader)
    st.started, st.first, st.ended, st.batches = time.monotonic(), None, None, 0


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
