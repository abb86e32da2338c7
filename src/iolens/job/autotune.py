"""``iolens run --autotune``, in the recorder: which loader settings each epoch runs with.

NOTE [autotune between epochs] in iolens/training/autotune.py says how the job asks at
each epoch's start and applies the answer. Here, each ask is answered from what the run
measured:

- The epoch that just ended is measured by the job (batches over its time). Its
  rate is the epoch's whole (batches per second from the loader's ``__iter__`` to
  its end) for a loader that starts its workers each epoch, and its steady part
  (from the first batch on) for a persistent one, whose workers start only once.
- An epoch on settings under trial keeps them when it was faster than the best epoch so
  far by KEEP_GAIN, and goes back to the best otherwise: the measurement decides,
  not the prediction. After a step back nothing more is tried. A trial kept runs one
  more epoch before the next proposal, which is made from that epoch.
- Otherwise the model proposes: the verdict over the last epoch's intervals (or all
  since the settings took effect, where the last epoch is too short for a model;
  iolens.analysis.verdict, the same advice ``iolens run`` prints at the end), whose
  first recommendation that is a change of num_workers or prefetch_factor, not tried
  yet, is tried next when it predicts at least MIN_GAIN over the measured rate, or
  predicts nothing ("raise prefetch_factor": the model cannot size it, the epoch
  measures it). The model holds the bounds: it does not add
  workers where the cores, the storage or the step bind, and its worker counts stop
  at the next limit; more workers are not tried where they would leave less than 10%
  of the memory available (NOTE [workers and memory]).
- At most MAX_TRIALS trials per loader; too few batches for a model: the settings stay
  and the next epoch adds to them.
- An epoch whose settings failed (a worker died: NOTE [a setting that fails] in
  iolens/training/autotune.py) goes back to the best settings that ran, or the code's
  own, and nothing more is tried.

Every epoch's settings, prediction, measured rate and decision go into meta.json
(``autotune``) and ``autotune/history.json`` as they happen, and the report shows them
with the settings the loader ended on, for the user to write into the code.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from iolens.rundir import write_atomic
from iolens.training.autotune import FOLDER, settings_text

KEEP_GAIN = 0.03
"""How much faster than the best epoch a trial epoch must be to be kept."""
MIN_GAIN = 0.05
"""The predicted gain a change must have to be tried."""
MAX_TRIALS = 4
MEMORY_FLOOR = 0.1
"""The share of the machine's memory more workers must leave available (NOTE [workers
and memory])."""
MODEL_RECORDS = 600
"""The most intervals a proposal is made from (the latest): the model's figures of a long
epoch's last ten minutes, in about a second, where the whole of an hour's epoch would keep
its next epoch waiting for the answer."""
MAX_RECORDS = 2 * MODEL_RECORDS


@dataclass
class _Tuning:
    """One loader's tuning: its epochs and where it stands."""

    pid: int
    tag: int
    dataset: str = "?"
    epochs: list[dict[str, Any]] = field(default_factory=list)
    best: tuple[dict[str, Any], float] | None = None
    trial: dict[str, Any] | None = None
    trial_prediction: dict[str, Any] | None = None
    tried: list[dict[str, Any]] = field(default_factory=list)
    settled: str | None = None
    """Why nothing more is tried, once nothing is."""
    since: int = 0
    """Records taken before the current settings began (an index into the tuner's)."""
    since_t: float | None = None
    """When the current settings began (Unix seconds), once autotune changed them."""
    seq: int = 0
    refused: str | None = None
    asked_at: int = 0
    """Records taken at the last ask: those after it are the last epoch's."""

    def to_dict(self) -> dict[str, Any]:
        ended = self.best[0] if self.best is not None else None
        return {"pid": self.pid, "tag": self.tag, "dataset": self.dataset,
                "epochs": self.epochs, "ended_on": ended, "settled": self.settled,
                "refused": self.refused, "since_t": self.since_t}


class Tuner:
    """Answers the job's asks (NOTE [autotune between epochs])."""

    def __init__(self, run_path: str, meta: Callable[[], dict[str, Any]],
                 say: Callable[[str], None]) -> None:
        self.folder = os.path.join(run_path, FOLDER)
        os.makedirs(self.folder, exist_ok=True)
        self.meta = meta
        """The verdict's metadata now (CPU count, storage, loaders)."""
        self.say = say
        self.records: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDS)
        self.taken = 0
        """Records taken in all."""
        self.loaders: dict[tuple[int, int], _Tuning] = {}
        self._seen: dict[str, int] = {}
        """Ask file -> its mtime in ns when last read."""
        self.pending: list[dict[str, Any]] = []
        try:
            self.total_memory: int | None = os.sysconf("SC_PHYS_PAGES") * os.sysconf(
                "SC_PAGE_SIZE")
        except (ValueError, OSError):
            self.total_memory = None

    # -- the recorder's loop ------------------------------------------------------------

    def asked(self) -> bool:
        """Whether a new ask has come (read into ``pending``): the recorder then takes a
        sample at once and answers it."""
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return False
        for e in entries:
            if not (e.name.startswith("ask-") and e.name.endswith(".json")):
                continue
            try:
                mtime = e.stat().st_mtime_ns
                if self._seen.get(e.name) == mtime:
                    continue
                self._seen[e.name] = mtime
                with open(e.path, "rb") as fh:
                    ask = json.loads(fh.read())
            except (OSError, ValueError):
                continue
            if isinstance(ask, dict):
                self.pending.append(ask)
        return bool(self.pending)

    def take(self, record: Mapping[str, Any]) -> None:
        """Each record the recorder writes; then the asks it was taken for are answered."""
        self.records.append(dict(record))
        self.taken += 1
        while self.pending:
            ask = self.pending.pop(0)
            try:
                self.answer(ask)
            except Exception as exc:  # noqa: BLE001 - NOTE [never hurt the job]
                self.say(f"autotune could not answer epoch {ask.get('epoch')}: {exc!r}; the "
                         "loader keeps its settings")

    # -- the decision -------------------------------------------------------------------

    def answer(self, ask: dict[str, Any]) -> None:
        pid, tag, seq = int(ask["pid"]), int(ask["tag"]), int(ask["seq"])
        t = self.loaders.get((pid, tag))
        if t is None:
            t = self.loaders[(pid, tag)] = _Tuning(pid, tag, str(ask.get("dataset", "?")))
        if ask.get("refused"):
            t.refused = str(ask["refused"])
            self._save()
            return
        if seq <= t.seq:
            return
        t.seq = seq
        last_epoch, t.asked_at = t.asked_at, self.taken
        settings = {k: v for k, v in dict(ask["settings"]).items() if v is not None}
        measured = _rate(ask)
        entry: dict[str, Any] = {"epoch": int(ask["epoch"]), "settings": settings,
                                 "steps_per_s": round(measured, 3) if measured else None,
                                 "prediction": t.trial_prediction,
                                 "available_bytes_min": self._least_available(last_epoch)}
        t.epochs.append(entry)
        nxt = dict(settings)
        kept_now = False
        failed = ask.get("failed")
        if isinstance(failed, dict):  # NOTE [a setting that fails] in training/autotune.py
            tried = {k: v for k, v in dict(failed.get("settings") or settings).items()
                     if v is not None}
            entry["settings"] = tried
            entry["steps_per_s"] = None  # (not an epoch of those settings)
            entry["failed"] = str(failed.get("what"))
            nxt = self._went_back(t, tried)
            entry["decision"] = (f"reverted: {entry['failed']}; {failed.get('then')}; back to "
                                 f"{settings_text(nxt)}")
            t.settled = f"{settings_text(tried)} failed"
            t.trial = t.trial_prediction = None
        elif t.settled is not None:
            entry["decision"] = "kept"
        elif measured is None:
            entry["decision"] = "not measured (too short): kept"
        elif t.trial is not None and t.best is not None:
            best_settings, best_rate = t.best
            if measured >= best_rate * (1 + KEEP_GAIN):
                entry["decision"] = (f"kept: {(measured / best_rate - 1) * 100:+.1f}% over the "
                                     "best epoch before")
                t.best = (settings, measured)
                kept_now = True
            else:
                entry["decision"] = (f"reverted: {(measured / best_rate - 1) * 100:+.1f}% against "
                                     f"the best epoch before ({settings_text(best_settings)})")
                nxt = dict(best_settings)
                t.settled = "a trial did not beat the best epoch"
            t.trial = t.trial_prediction = None
        elif t.best is None:
            t.best = (settings, measured)
            entry["decision"] = "measured: the code's own settings"
        else:
            if measured > t.best[1]:
                t.best = (settings, measured)
            entry["decision"] = "kept"
        # A trial just kept runs once more as it is before anything else is proposed, from
        # that epoch's intervals: a trial's epoch starts its new workers, and the first
        # epochs of a process hold its first full garbage collections.
        if not kept_now and t.settled is None and measured is not None:
            proposal = self._propose(t, settings, measured, last_epoch)
            if proposal is not None:
                change, prediction = proposal
                nxt = {**settings, **change}
                t.trial, t.trial_prediction = nxt, prediction
                t.tried.append(nxt)
                entry["next"] = nxt
        if nxt != settings:
            t.since = self.taken
            t.since_t = float(self.records[-1].get("t") or 0.0) if self.records else None
        self._write_answer(t, seq, nxt)
        self._save()

    @staticmethod
    def _went_back(t: _Tuning, failed: dict[str, Any]) -> dict[str, Any]:
        """The settings to go back to from ``failed``: the best that ran, or the code's
        own (the first epoch's), and the best becomes them."""
        ran = [(e["steps_per_s"], e["settings"]) for e in t.epochs
               if e["settings"] != failed and e.get("steps_per_s")]
        back = (t.best[0] if t.best is not None and t.best[0] != failed
                else max(ran, key=lambda r: r[0])[1] if ran
                else t.epochs[0]["settings"])
        rate = max((r for r, s in ran if s == back), default=0.0)
        t.best = (dict(back), rate)
        return dict(back)

    def _least_available(self, since: int) -> int | None:
        """The least memory available (MemAvailable) in the intervals taken after the
        ``since``-th."""
        skip = max(0, len(self.records) - (self.taken - since))
        got = [m["available_bytes"] for r in list(self.records)[skip:]
               if isinstance(m := r.get("mem"), dict)
               and isinstance(m.get("available_bytes"), int)]
        return min(got) if got else None

    def _memory_allows(self, t: _Tuning, settings: dict[str, Any],
                       want: dict[str, Any]) -> bool:
        """NOTE [workers and memory]: a worker holds memory of its own (what it copies of
        the training process and what its samples take); too many ends the job out of
        memory. Each worker costs what the least available memory fell by, per worker,
        between the epochs this loader ran with different counts (nothing known before
        two); more workers are tried only where the least available memory would stay
        above MEMORY_FLOOR of the machine's."""
        more = int(want.get("num_workers") or 0) - int(settings.get("num_workers") or 0)
        low = t.epochs[-1].get("available_bytes_min") if t.epochs else None
        if more <= 0 or self.total_memory is None or low is None:
            return True
        seen = [(int(e["settings"].get("num_workers") or 0), e["available_bytes_min"])
                for e in t.epochs if e.get("available_bytes_min") is not None]
        each = max([(m1 - m2) / (w2 - w1) for w1, m1 in seen for w2, m2 in seen if w2 > w1]
                   + [0.0])
        return bool(low - more * each >= MEMORY_FLOOR * self.total_memory)

    def _propose(self, t: _Tuning, settings: dict[str, Any], measured: float,
                 last_epoch: int) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """The change to try next and its prediction, from the last epoch's intervals (or,
        too few there for a model, from all since the settings began); None for none."""
        from iolens.analysis.verdict import diagnose  # noqa: PLC0415 - heavy, only here

        if len(t.tried) >= MAX_TRIALS:
            t.settled = f"{MAX_TRIALS} trials made"
            return None
        v = None
        for start in dict.fromkeys((max(last_epoch, t.since), t.since)):
            skip = max(0, len(self.records) - (self.taken - start), len(self.records)
                       - MODEL_RECORDS)
            v = diagnose(list(self.records)[skip:], self.meta())
            if v.model is not None and v.model.unavailable is None:
                break
        if v is None or v.model is None or v.model.unavailable is not None:
            return None  # too few batches yet: the next epoch adds to them
        for r in v.recommendations:
            change = {k: x for k, x in (r.change or {}).items() if k in KEYS}
            if not change or any(k not in KEYS_OR_KEPT for k in r.change or {}):
                continue
            want = {**settings, **change}
            if want == settings or want in t.tried:
                continue
            if not self._memory_allows(t, settings, want):
                t.settled = (f"{settings_text(want)} would leave less than "
                             f"{MEMORY_FLOOR * 100:.0f}% of the memory available")
                return None
            pred = r.prediction
            if pred is None:  # (a deeper prefetch: the epoch measures it)
                return change, None
            if pred.steps_per_s >= measured * (1 + MIN_GAIN):
                return change, pred.to_dict()
        t.settled = "the model predicts no gain from num_workers or prefetch_factor"
        return None

    # -- files --------------------------------------------------------------------------

    def _write_answer(self, t: _Tuning, seq: int, settings: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            write_atomic(os.path.join(self.folder, f"answer-{t.pid}-{t.tag}.json"),
                         json.dumps({"seq": seq, "settings": settings}).encode())

    def _save(self) -> None:
        with contextlib.suppress(OSError):
            write_atomic(os.path.join(self.folder, "history.json"),
                         json.dumps(self.to_meta()).encode())

    def to_meta(self) -> dict[str, Any]:
        """What meta.json keeps (``autotune``)."""
        changed = [t.since_t for t in self.loaders.values() if t.since_t is not None]
        return {"loaders": [t.to_dict() for t in self.loaders.values()],
                "since_t": max(changed) if changed else None}


KEYS = ("num_workers", "prefetch_factor")
KEYS_OR_KEPT = (*KEYS, "persistent_workers")
"""A recommendation may also ask for persistent workers (from none): its worker count is
tried, on the loader's own persistence."""


def _rate(ask: dict[str, Any]) -> float | None:
    """The epoch's rate as compared between epochs (see the module's docstring)."""
    batches, seconds, first = int(ask["batches"]), float(ask["seconds"]), float(ask["first_s"])
    if ask.get("persistent"):
        batches, seconds = batches - 1, seconds - first
    return batches / seconds if batches >= 1 and seconds > 0 else None

