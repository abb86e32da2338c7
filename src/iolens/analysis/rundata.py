"""Reading a run directory as far as it is valid, with a note of everything skipped."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from iolens._errors import IolensError
from iolens.analysis.longrun import (
    LONG_RUN_RECORDS,
    bucket_records,
    bucket_seconds,
    estimate_records,
    fold_records,
)
from iolens.recorder.rundir import META, RECORDS, SCHEMA_VERSION


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


def load_run(path: str, *, max_records: int | None = LONG_RUN_RECORDS) -> RunData:
    """Read ``path`` (a run directory, or its records.jsonl).

    Raises :class:`IolensError` when there is no run there at all. A missing
    or corrupt meta.json, torn or corrupt lines, records that are not
    objects and records of a newer schema are skipped or kept with a note.
    A run of more than ``max_records`` intervals is read as time buckets
    (:mod:`iolens.analysis.longrun`).
    """
    if os.path.isfile(path) and os.path.basename(path) == RECORDS:
        path = os.path.dirname(path) or "."
    if not os.path.isdir(path):
        raise IolensError(f"{path}: no such run directory")
    notes: list[str] = []
    meta: dict[str, Any] = {}
    meta_path = os.path.join(path, META)
    try:
        with open(meta_path, encoding="utf-8") as fh:
            loaded = json.load(fh)
        if isinstance(loaded, dict):
            meta = loaded
        else:
            notes.append(f"{META} is not a JSON object; ignored")
    except FileNotFoundError:
        notes.append(f"{META} is missing (the recorder did not start, or it was removed)")
    except (OSError, ValueError) as exc:
        notes.append(f"{META} could not be read ({exc}); ignored")
    rec_path = os.path.join(path, RECORDS)
    if not os.path.exists(rec_path) and not meta:
        raise IolensError(f"{path}: not a run directory (no {META}, no {RECORDS})")
    if max_records is not None and os.path.isfile(rec_path):
        estimate, last = estimate_records(rec_path)
        if estimate > max_records:
            return _load_long(path, rec_path, meta, notes, last)
    records: list[dict[str, Any]] = []
    bad = newer = 0
    first_bad: int | None = None
    try:
        with open(rec_path, "rb") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    rec = None
                if not isinstance(rec, dict):
                    bad += 1
                    first_bad = first_bad or n
                    continue
                schema = rec.get("schema", SCHEMA_VERSION)
                if isinstance(schema, int) and schema > SCHEMA_VERSION:
                    newer += 1
                records.append(rec)
    except FileNotFoundError:
        notes.append(f"{RECORDS} is missing: no interval was recorded")
    except OSError as exc:
        notes.append(f"{RECORDS} could not be read completely ({exc.strerror or exc})")
    if bad:
        notes.append(f"{bad} line(s) of {RECORDS} were not valid records and were skipped "
                     f"(the first at line {first_bad})")
    if newer:
        notes.append(f"{newer} record(s) come from a newer iolens (schema above "
                     f"{SCHEMA_VERSION}); read as far as their fields are known")
    records.sort(key=_elapsed)
    _note_lost(meta, notes)
    return RunData(path, meta, records, notes)


def _load_long(path: str, rec_path: str, meta: dict[str, Any], notes: list[str],
               last: float) -> RunData:
    interval = meta.get("interval_s")
    bucket_s = bucket_seconds(last, interval if isinstance(interval, (int, float)) else None)
    folded = fold_records(rec_path, bucket_s)
    records = list(bucket_records(folded))
    notes.append(f"a long run: its {folded.lines} intervals are read as {len(records)} "
                 f"buckets of {bucket_s:g} s (each bucket's p50 and p95 approximate)")
    if folded.bad:
        notes.append(f"{folded.bad} line(s) of {RECORDS} were not valid records and were "
                     "skipped")
    if folded.newer:
        notes.append(f"{folded.newer} record(s) come from a newer iolens (schema above "
                     f"{SCHEMA_VERSION}); read as far as their fields are known")
    _note_lost(meta, notes)
    return RunData(path, meta, records, notes, bucket_s)


def _note_lost(meta: dict[str, Any], notes: list[str]) -> None:
    if isinstance(meta.get("lost_records"), int) and meta["lost_records"]:
        notes.append(f"the recorder could not save {meta['lost_records']} interval(s): "
                     f"{meta.get('write_error') or 'write error'}")


def _elapsed(rec: dict[str, Any]) -> float:
    v = rec.get("elapsed_s")
    return float(v) if isinstance(v, (int, float)) else 0.0
