"""Reading a run directory as far as it is valid, with a note of everything skipped."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from iolens._errors import IolensError
from iolens.recorder.rundir import META, RECORDS, SCHEMA_VERSION


@dataclass
class RunData:
    """One recorded run: its metadata, its interval records and what could not be read."""

    path: str
    meta: dict[str, Any]
    records: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    """What was skipped or suspect, in words for the report."""


def load_run(path: str) -> RunData:
    """Read ``path`` (a run directory, or its records.jsonl).

    Raises :class:`IolensError` when there is no run there at all. A missing
    or corrupt meta.json, torn or corrupt lines, records that are not
    objects and records of a newer schema are skipped or kept with a note.
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
    if isinstance(meta.get("lost_records"), int) and meta["lost_records"]:
        notes.append(f"the recorder could not save {meta['lost_records']} interval(s): "
                     f"{meta.get('write_error') or 'write error'}")
    return RunData(path, meta, records, notes)


def _elapsed(rec: dict[str, Any]) -> float:
    v = rec.get("elapsed_s")
    return float(v) if isinstance(v, (int, float)) else 0.0
