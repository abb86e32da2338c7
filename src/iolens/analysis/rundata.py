"""Reading a run directory as far as it is valid, with a note of everything skipped."""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from iolens._errors import IolensError
from iolens.analysis.columns import (
    CpuColumns,
    DeviceColumns,
    GpuColumns,
    RankColumns,
    RoleColumns,
    RunView,
    SeriesColumns,
    StageColumns,
    StoreColumns,
)
from iolens.analysis.longrun import (
    LONG_RUN_RECORDS,
    bucket_records,
    bucket_seconds,
    estimate_records,
    fold_run,
    is_duplicate,
    rollup_slot,
)
from iolens.analysis.recordshape import ShapeCheck, Skipped
from iolens.rundir import META, RECORDS, SCHEMA_VERSION, STORAGE_PROBE
from iolens.rundir.rollup import read_rollups, rollups_file


@dataclass
class RunData:
    """One recorded run: its metadata, its interval records and what could not be read."""

    path: str
    meta: dict[str, Any]
    records: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    """What was skipped or suspect, in words for the report."""
    bucket_s: float | None = None
    """For a long run read in buckets (iolens.analysis.longrun), their length."""
    rollups: dict[float, list[bytes]] | None = None
    """The lines of each rollup file, where they were rebuilt from the records for the
    caller to write (``load_run(rebuild=True)``: NOTE [rollups rebuilt] in
    iolens/analysis/rebuild.py)."""

    @functools.cached_property
    def columns(self) -> StageColumns:
        """The records' figures as columns, read once (NOTE [columns] in
        iolens/analysis/columns/__init__.py)."""
        return StageColumns.of(self.records)

    @functools.cached_property
    def devices(self) -> dict[str, DeviceColumns]:
        """Each device's figures as columns, read once, in the order the records name the
        devices."""
        return DeviceColumns.of(self.records)

    @functools.cached_property
    def roles(self) -> dict[str, RoleColumns]:
        """Each role's figures (the job's processes by role) as columns, read once."""
        return RoleColumns.of(self.records)

    @functools.cached_property
    def stores(self) -> dict[str, StoreColumns]:
        """Each storage entry's figures (a FUSE mount's, a network store's) as columns,
        read once."""
        return StoreColumns.of(self.records)

    @property
    def view(self) -> RunView:
        """What the verdict reads of the run (its columns, its devices', storage entries'
        and ranks'), each read once."""
        return RunView(self.columns, self.devices, self.stores, self.ranks)

    @functools.cached_property
    def ranks(self) -> dict[str, RankColumns]:
        """Each rank's figures (a multi-rank job's) as columns, read once."""
        return RankColumns.of(self.records)

    @functools.cached_property
    def cpu(self) -> CpuColumns:
        """The machine's CPU shares as columns, read once."""
        return CpuColumns.of(self.records)

    @functools.cached_property
    def series(self) -> SeriesColumns:
        """The figures its charts draw, as recorded (None where an interval has none), read
        once."""
        return SeriesColumns.of(self.records)

    @functools.cached_property
    def gpus(self) -> dict[int, GpuColumns]:
        """Each GPU's figures as columns, read once, by its index."""
        return GpuColumns.of(self.records)


def load_run(path: str, *, max_records: int | None = LONG_RUN_RECORDS,
             rebuild: bool | Callable[[str], None] = False) -> RunData:
    """Read ``path`` (a run directory, or its records.jsonl).

    Raises :class:`IolensError` when there is no run there at all, or neither a
    usable meta.json nor one usable record. A missing
    or corrupt meta.json, torn or corrupt lines, records that are not
    objects and records of a newer schema are skipped or kept with a note.
    A run of more than ``max_records`` intervals is read as time buckets
    (:mod:`iolens.analysis.longrun`); ``rebuild``: where such a run has ended and has no
    rollups that match its records, they are folded from the records and returned in
    :attr:`RunData.rollups` (NOTE [rollups rebuilt] in iolens/analysis/rebuild.py); a
    function is told, in words, when that begins.
    """
    if os.path.isfile(path) and os.path.basename(path) == RECORDS:
        path = os.path.dirname(path) or "."
    if not os.path.isdir(path):
        if os.path.exists(path):  # (a file: the report of a run, a script, a dataset)
            raise IolensError(f"{path}: not a run directory (a folder that `iolens run` "
                              f"wrote, holding {META} and {RECORDS})")
        raise IolensError(f"{path}: no such run directory")
    notes: list[str] = []
    meta: dict[str, Any] = {}
    meta_path = os.path.join(path, META)
    try:
        with open(meta_path, "rb") as fh:
            loaded = json.loads(fh.read(), parse_constant=_no_constant)
        if isinstance(loaded, dict):
            meta = _checked_meta(loaded, notes)
        else:
            notes.append(f"{META} is not a JSON object; ignored")
    except FileNotFoundError:
        notes.append(f"{META} is missing (the recorder did not start, or it was removed)")
    except (OSError, ValueError, RecursionError) as exc:
        notes.append(f"{META} could not be read ({_short(exc)}); ignored")
    _add_probe(path, meta, notes)
    if meta:
        meta["run_dir"] = os.path.abspath(path)  # (where it is now, if it was moved)
    rec_path = os.path.join(path, RECORDS)
    if not os.path.exists(rec_path) and not meta:
        if os.path.exists(meta_path):  # there, but unusable: say so, not "no meta.json"
            raise _nothing_usable(path, f"no {RECORDS}", notes)
        raise IolensError(f"{path}: not a run directory (no {META}, no {RECORDS})")
    if max_records is not None and os.path.isfile(rec_path):
        estimate, last = estimate_records(rec_path)
        if estimate > max_records:
            return _load_long(path, rec_path, meta, notes, last, estimate=estimate,
                              rebuild=rebuild)
    records: list[dict[str, Any]] = []
    skipped = Skipped()
    seen: set[tuple[int, float]] = set()
    check = ShapeCheck()
    newer = backwards = 0
    last = -math.inf
    try:
        with open(rec_path, "rb") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line, parse_constant=_no_constant)
                except (ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
                    skipped.add("not JSON", f"line {n}", _short(exc))
                    continue
                why = check.problem(line, rec)
                if why is not None:
                    skipped.add_problem(f"line {n}", why)
                    continue
                if is_duplicate(rec, seen):
                    skipped.add("duplicate", f"line {n}", f"seq {rec['seq']} again")
                    continue
                schema = rec.get("schema", SCHEMA_VERSION)
                if isinstance(schema, int) and schema > SCHEMA_VERSION:
                    newer += 1
                if _elapsed(rec) < last:
                    backwards += 1
                last = max(last, _elapsed(rec))
                records.append(rec)
    except FileNotFoundError:
        notes.append(f"{RECORDS} is missing: no interval was recorded")
    except OSError as exc:
        notes.append(f"{RECORDS} could not be read completely ({exc.strerror or exc})")
    note = skipped.note(RECORDS)
    if not records and not meta:
        raise _nothing_usable(path, note, notes)
    if note:
        notes.append(note)
    if backwards:
        notes.append(f"{backwards} record(s) of {RECORDS} were out of time order; "
                     "read in order of elapsed_s")
    if newer:
        notes.append(f"{newer} record(s) come from a newer iolens (schema above "
                     f"{SCHEMA_VERSION}); read as far as their fields are known")
    records.sort(key=_elapsed)
    _note_lost(meta, notes)
    return RunData(path, meta, records, notes)


def _load_long(path: str, rec_path: str, meta: dict[str, Any], notes: list[str],
               last: float, *, estimate: int,
               rebuild: bool | Callable[[str], None]) -> RunData:
    interval = meta.get("interval_s")
    bucket_s = bucket_seconds(last, interval if isinstance(interval, (int, float)) else None)
    slot_s = rollup_slot(bucket_s)
    made = bool(slot_s) and round(bucket_s / slot_s) == 1  # NOTE [a slot's record]
    rolled = read_rollups(path, rec_path, slot_s, made=made) if slot_s else None
    rebuilt = None
    failed = None
    if rebuild and slot_s and meta.get("end"):
        from iolens.analysis import rebuild as rb  # noqa: PLC0415 - rarely needed

        had = rolled.to if rolled is not None else 0
        if rb.worth_rebuilding(rec_path, had):
            if callable(rebuild):
                there = os.path.exists(os.path.join(path, rollups_file(slot_s)))
                why = ("stale" if rolled else "of another iolens or damaged" if there
                       else "missing")
                rebuild(f"its rollups are {why}: folding its records (about {estimate:,}) "
                        "into new ones, once")
            try:
                rebuilt = rb.rebuild_rollups(rec_path, slot_s)
            except (OSError, RuntimeError, ValueError) as exc:  # (a pool that broke)
                failed = (f"its rollups could not be rebuilt ({_short(exc)}): read from "
                          f"{RECORDS}")
            if rebuilt is not None and rebuilt.rolled.to > had:
                rolled = rebuilt.rolled
            else:  # (a line the recorder folded that is not a record: no further)
                rebuilt = None
    folded = fold_run(rec_path, bucket_s, rolled=rolled)
    records = list(bucket_records(folded))
    note = folded.skipped.note(RECORDS)
    if not records and not meta:
        raise _nothing_usable(path, note, notes)
    notes.append(f"a long run: its {folded.lines} intervals are read as {len(records)} "
                 f"buckets of {bucket_s:g} s (each bucket's p50 and p95 approximate)")
    if failed:
        notes.append(failed)
    if note:
        notes.append(note)
    if folded.newer:
        notes.append(f"{folded.newer} record(s) come from a newer iolens (schema above "
                     f"{SCHEMA_VERSION}); read as far as their fields are known")
    _note_lost(meta, notes)
    return RunData(path, meta, records, notes, bucket_s,
                   rebuilt.lines if rebuilt is not None else None)


def _nothing_usable(path: str, note: str | None, notes: list[str]) -> IolensError:
    """The error for a run with neither metadata nor one usable record: one line, saying why
    (an empty report would only hide what is wrong with the folder)."""
    why = "; ".join([note or f"{RECORDS} holds no record", *notes])
    return IolensError(f"{path}: no usable run ({why})")


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def _is_seconds(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and 0 <= v < math.inf)  # NaN fails too


def _is_text_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


# The meta.json fields the verdict and the reports use, and what each must be; one of
# another shape (a hand edit, another tool's file) is dropped with a note rather than
# left to fail deep inside a report.
_META_CHECKS: dict[str, Callable[[Any], bool]] = {
    "cpus": _is_count,
    "interval_s": lambda v: _is_seconds(v) and v > 0,
    "duration_s": _is_seconds,
    "lost_records": _is_count,
    "exit_code": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    "instrumented": lambda v: isinstance(v, bool),
    "devices": _is_text_map,
    "gpu": lambda v: isinstance(v, dict),
    "notes": lambda v: isinstance(v, list),
    "timing": lambda v: isinstance(v, list),
    "command": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    **{k: lambda v: v is None or isinstance(v, str)
       for k in ("host", "cwd", "start", "end", "disk_source", "write_error", "kernel",
                 "iolens_version", "mode", "timing_spare")},
}


def _checked_meta(meta: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """``meta`` less the fields of the wrong shape, each named in a note."""
    wrong = [k for k, ok in _META_CHECKS.items() if k in meta and not ok(meta[k])]
    if wrong:
        notes.append(f"{META}: {', '.join(wrong)} of the wrong type or value; ignored")
        meta = {k: v for k, v in meta.items() if k not in wrong}
    return meta


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def _note_lost(meta: dict[str, Any], notes: list[str]) -> None:
    if isinstance(meta.get("lost_records"), int) and meta["lost_records"]:
        notes.append(f"the recorder could not save {meta['lost_records']} interval(s): "
                     f"{meta.get('write_error') or 'write error'}")


def _elapsed(rec: dict[str, Any]) -> float:
    v = rec.get("elapsed_s")
    return float(v) if isinstance(v, (int, float)) else 0.0


def _no_constant(name: str) -> Any:
    # The recorder never writes NaN or Infinity (and orjson, on the long-run path,
    # refuses them); the json module would accept them, so refuse them here too.
    raise ValueError(f"{name} is not JSON")


def _add_probe(path: str, meta: dict[str, Any], notes: list[str]) -> None:
    """The storage probe's result beside the run (``iolens probe --storage PATH --run
    DIR``) into ``meta["storage_probe"]``, for the verdict; a damaged one is noted."""
    if not meta:
        return
    try:
        with open(os.path.join(path, STORAGE_PROBE), "rb") as fh:
            probe = json.loads(fh.read(), parse_constant=_no_constant)
    except FileNotFoundError:
        return
    except (OSError, ValueError, RecursionError) as exc:
        notes.append(f"{STORAGE_PROBE} could not be read ({_short(exc)}); ignored")
        return
    if isinstance(probe, dict):
        meta["storage_probe"] = probe
    else:
        notes.append(f"{STORAGE_PROBE} is not a JSON object; ignored")
