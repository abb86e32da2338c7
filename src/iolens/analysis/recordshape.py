"""What a line of records.jsonl may hold, and the lines left out (NOTE [record shape]).

Every reader of records.jsonl (the short run's, the long run's fold, the rollups'
rebuild) refuses the same lines, for the same reasons, and counts them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# NOTE [record shape]: the verdict, the reports and the long run's fold do arithmetic on a
# record's figures without checking each one, so a line that parses as JSON but is not a
# record of ours (another tool's log, a hand edit, a number as a string, NaN, a negative
# rate) is refused whole, with its reason, before anything reads it. Keys this version does
# not know in the job, train and GPU objects are left alone, so that records of a newer
# schema still read; the maps of figures (a device's, a role's, CPU, memory) hold nothing
# but figures.
_TOO_BIG = 1 << 64
"""No counter or figure the recorder writes comes near this (18 EB/s, 5e17 years): larger is
garbage. Floats too: orjson reads an int beyond 64 bits as a float."""
_FIGURES = ("devices", "cpu", "mem")
"""Sections whose every value is a figure (per device: a map of figures)."""
_JOB_FIGURES = frozenset({"pids", "cpu_pct", "read_bytes_s", "write_bytes_s", "rchar_s",
                          "wchar_s", "cache_hit", "run_delay_pct"})
_TRAIN_FIGURES = frozenset({"batches", "epochs_started", "data_wait_share", "num_workers",
                            "world_size"})
_TRAIN_MAPS = ("data_wait", "step", "epoch_start_wait", "epoch_start_step", "pause_wait",
               "pause_step")
_GPU_FIGURES = frozenset({"index", "util_pct", "mem_util_pct", "mem_used_bytes",
                          "mem_total_bytes"})
_GPU_LISTS = frozenset({"pids", "proc_mem_bytes", "job_pids"})


def _not_figure(v: Any) -> bool:
    """True unless ``v`` is None or a finite, non-negative number (a bool is not one)."""
    if v is None:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return not 0 <= v < _TOO_BIG  # NaN fails too
    return True


_FLAGS = frozenset({"io_readable", "in_process"})
"""Keys the recorder writes as true/false among figures (a role's /proc/<pid>/io that
could not be read)."""


def _bad_map(d: Any, where: str) -> str | None:
    """Why ``d`` is not a map of figures (and flags), or None when it is one."""
    if not isinstance(d, dict):
        return f"{where} is not an object"
    for k, v in d.items():
        if k in _FLAGS and isinstance(v, bool):
            continue
        if _not_figure(v):
            return f"{where}.{k} is {_show(v)}"
    return None


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def record_problem(rec: Any) -> str | None:
    """Why ``rec`` (a parsed JSON line) cannot be read as an interval record; None if it can.

    See NOTE [record shape].
    """
    if not isinstance(rec, dict):
        return f"not a JSON object ({type(rec).__name__})"
    if "elapsed_s" not in rec:
        return "no elapsed_s (not an iolens record)"
    if rec["elapsed_s"] is None:  # every interval has an end; records are ordered by it
        return "elapsed_s is None"
    for key in ("elapsed_s", "interval_s", "seq", "t", "merged"):
        if _not_figure(rec.get(key)):
            return f"{key} is {_show(rec[key])}"
    if not isinstance(rec.get("time", ""), (str, type(None))):
        return f"time is {_show(rec['time'])}"
    for key in _FIGURES:
        sec = rec.get(key)
        if sec is None:
            continue
        if not isinstance(sec, dict):
            return f"{key} is not an object"
        if key == "devices":
            for name, d in sec.items():
                if why := _bad_map(d, f"devices.{name}"):
                    return why
        elif why := _bad_map(sec, key):
            return why
    job = rec.get("job")
    if job is not None:
        if not isinstance(job, dict):
            return "job is not an object"
        for k, v in job.items():
            if v is None:
                continue
            if k == "roles":
                if not isinstance(v, dict):
                    return "job.roles is not an object"
                for role, d in v.items():
                    if why := _bad_map(d, f"job.roles.{role}"):
                        return why
            elif k == "states":
                if why := _bad_map(v, "job.states"):
                    return why
            elif k in _JOB_FIGURES and _not_figure(v):
                return f"job.{k} is {_show(v)}"
    train = rec.get("train")
    if train is not None:
        if not isinstance(train, dict):
            return "train is not an object"
        for k, v in train.items():
            if v is None:
                continue
            if k in _TRAIN_MAPS:
                if why := _bad_map(v, f"train.{k}"):
                    return why
            elif k == "pipeline":
                if not isinstance(v, dict):
                    return "train.pipeline is not an object"
                if why := _bad_map({x: y for x, y in v.items() if x != "handover"},
                                   "train.pipeline") or _bad_map(v.get("handover", {}),
                                                                 "train.pipeline.handover"):
                    return why
            elif k == "ranks":
                if not isinstance(v, dict):
                    return "train.ranks is not an object"
                for rank, d in v.items():
                    if why := _bad_map(d, f"train.ranks.{rank}"):
                        return why
            elif k == "step_source":
                if not isinstance(v, str):
                    return f"train.step_source is {_show(v)}"
            elif k == "iterable_loader":
                if not isinstance(v, bool):
                    return f"train.iterable_loader is {_show(v)}"
            elif k in _TRAIN_FIGURES and _not_figure(v):
                return f"train.{k} is {_show(v)}"
    storage = rec.get("storage")
    if storage is not None:
        if not isinstance(storage, dict):
            return "storage is not an object"
        for mount, d in storage.items():
            if why := _bad_map(d, f"storage.{mount}"):
                return why
    gpus = rec.get("gpu")
    if gpus is not None:
        if not isinstance(gpus, list):
            return "gpu is not a list"
        for i, g in enumerate(gpus):
            if not isinstance(g, dict):
                return f"gpu[{i}] is not an object"
            for k, v in g.items():
                if k == "error":
                    if not isinstance(v, str):
                        return f"gpu[{i}].error is {_show(v)}"
                elif k in _GPU_LISTS:
                    if not isinstance(v, list) or any(_not_figure(x) for x in v):
                        return f"gpu[{i}].{k} is {_show(v)}"
                elif k in _GPU_FIGURES and _not_figure(v):
                    return f"gpu[{i}].{k} is {_show(v)}"
    return None


# NOTE [known shapes]: checking every figure of a record costs about four times its
# parsing, and a week of records at 1 s is 604,800 of them. But a recorder writes the
# same shape again and again: the same keys, the same kind of value at each place, only
# the digits change. A line with its digits (and decimal points) taken out is that shape:
# a number leaves nothing behind, or its sign and exponent, which stay; a string keeps
# its quotes, true/false/null their letters. "[]" is marked first, so that an empty list
# is not the shape of a list of one number. Once a line of a shape has passed the whole
# check, another line of that shape can differ from it only in the digits of its numbers
# and of its names; so it passes too, unless one of its digit runs is 20 long (a figure
# that may reach 2**64: the whole check decides). Shapes are remembered only from records
# whose every key at the levels that ignore unknown keys is known, so that a name with
# digits added cannot stand in for a figure's name.
_DIGITS = b"0123456789."
_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 20
_TOP_KEYS = frozenset({"time", "t", "elapsed_s", "interval_s", "seq", "merged", "schema",
                       *_FIGURES, "job", "train", "gpu", "storage"})
_JOB_KEYS = _JOB_FIGURES | {"roles", "states"}
_TRAIN_KEYS = _TRAIN_FIGURES | set(_TRAIN_MAPS) | {"ranks", "step_source", "pipeline",
                                                   "iterable_loader"}
_GPU_KEYS = _GPU_FIGURES | _GPU_LISTS | {"error"}


def _known_keys(rec: dict[str, Any]) -> bool:
    """Every key of ``rec`` where unknown keys are let through is one this version knows."""
    job, train, gpus = rec.get("job") or {}, rec.get("train") or {}, rec.get("gpu") or []
    return (rec.keys() <= _TOP_KEYS and job.keys() <= _JOB_KEYS
            and train.keys() <= _TRAIN_KEYS and all(g.keys() <= _GPU_KEYS for g in gpus))


class ShapeCheck:
    """:func:`record_problem` of a parsed line, fast for shapes seen before (NOTE
    [known shapes])."""

    LIMIT = 64
    """Shapes remembered at most: a run has a handful (a device or a GPU coming or going)."""

    __slots__ = ("known",)

    def __init__(self) -> None:
        self.known: set[bytes] = set()

    def problem(self, line: bytes, rec: Any) -> str | None:
        """Why ``rec``, parsed from ``line``, is not a record; None when it is one."""
        shape = line.replace(b"[]", b"[@]").translate(None, _DIGITS)
        if shape in self.known and _LONG_DIGITS not in line.translate(_TO_ZERO):
            return None
        why = record_problem(rec)
        if why is None and len(self.known) < self.LIMIT and _known_keys(rec):
            self.known.add(shape)
        return why


@dataclass
class Skipped:
    """Lines of records.jsonl left out, counted by why."""

    counts: dict[str, int] = field(default_factory=dict)
    """Lines skipped, by kind: ``not JSON``, ``not an iolens record``, ``with a bad figure``,
    ``duplicate``."""
    first_at: str = ""
    """Where the first was, e.g. ``line 7`` (``byte 4096`` on the long-run path)."""
    first_why: str = ""
    """Why the first was skipped, e.g. ``devices.vda.util is -1.0``."""

    @property
    def total(self) -> int:
        """All lines skipped."""
        return sum(self.counts.values())

    def add(self, kind: str, where: str, why: str = "") -> None:
        """Count one skipped line."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if not self.first_at:
            self.first_at, self.first_why = where, why or kind

    def add_problem(self, where: str, why: str) -> None:
        """Count a line that :func:`record_problem` refused."""
        kind = ("not an iolens record" if why.startswith(("not a JSON object", "no elapsed_s"))
                else "with a bad figure")
        self.add(kind, where, why)

    def merge(self, other: Skipped) -> None:
        """Add another range's counts (``other`` comes later in the file)."""
        for kind, n in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        if not self.first_at:
            self.first_at, self.first_why = other.first_at, other.first_why

    def note(self, name: str) -> str | None:
        """The report's note, or None when nothing was skipped."""
        if not self.counts:
            return None
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts.items()))
        return (f"{self.total} line(s) of {name} were not valid records and were skipped "
                f"(the first at {self.first_at}): {kinds}; {self.first_at}: {self.first_why}")
