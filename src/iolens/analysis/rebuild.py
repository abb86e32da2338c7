"""Rollups rebuilt from records.jsonl, for a finished long run read without them (NOTE
[rollups rebuilt]).

Pure: it reads records.jsonl and returns the lines of each rollup file; the report writes
them (:func:`iolens.rundir.replace_rollups`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import IO, Any

from iolens.analysis.longrun import Seqs, apart, is_duplicate
from iolens.analysis.recordshape import ShapeCheck
from iolens.rundir import SCHEMA_VERSION
from iolens.rundir.rollup import ROLLUP_LEVELS, Bucket, Rolled, Rollups, loads

"""NOTE [rollups rebuilt]: the recorder writes rollups beside records.jsonl as it records
(NOTE [rollups] in iolens/rundir/rollup.py). A run without them (recorded by an iolens
from before them, or by a recorder that appended to an existing records.jsonl), or whose
rollups hold only its start (their writes failed), is read from its records on every
report: 13 s for a week, where its rollups give it in about 2. So the report of a
finished long run whose rollups are missing or leave over a tenth of its records.jsonl
(STALE) folds its records into the rollups of every slot length as the recorder would
have, writes them, and reads its buckets from them: this report pays the rollups' fold
(36-41 s for the week of bench/RESULTS.md, in 504 MiB), the next ones do not. Not where
the rollups end at a line that is not a record: rebuilt, they would end there again.

The records are read in parallel byte ranges, and each range begins and ends where every
slot length's slot changes (a span of _ALIGN seconds: the first change after its nominal
byte), so that every slot of every length is folded whole, in one process, in the order
of the file: the lines are byte for byte those the recorder writes. They stop at the
first line the report would not read as a record (torn, not JSON, not a record, a
duplicate, of a newer schema): the records from there on are read as the records past a
run's rollups are, with the note that says what was skipped."""

STALE = 0.1
"""Rollups that leave more than this share of records.jsonl's bytes after them are
rebuilt (NOTE [rollups rebuilt])."""
_ALIGN = float(math.lcm(*(int(s) for s in ROLLUP_LEVELS)))
"""Every slot of every length ends where a span of this many seconds does (3,000 s)."""


@dataclass
class Rebuilt:
    """The rollups folded from a run's records."""

    rolled: Rolled
    """The lines of the report's slot length, as :func:`read_rollups` would read them."""
    lines: dict[float, list[bytes]] = field(default_factory=dict)
    """Each slot length's lines, in order: the rollup files' contents."""


@dataclass
class _Part:
    lines: dict[float, list[bytes]]
    slots: list[tuple[int, Bucket]]
    to: int = 0
    """The end of the last record folded (0: none)."""
    records: int = 0
    stopped: bool = False
    """A line that is not a record ended the range."""
    seqs: Seqs = field(default_factory=Seqs)


def _slot(parse: Any, line: bytes) -> int | None:
    """The _ALIGN span of the record on ``line``, None where it is not one."""
    try:
        rec = parse(line)
        return int(float(rec.get("elapsed_s") or 0.0) // _ALIGN)
    except (ValueError, TypeError, AttributeError, OverflowError):
        return None


def _boundary(fh: IO[bytes], at: int, size: int, parse: Any) -> int:
    """Where a range that nominally begins at byte ``at`` begins: the first line after the
    first one that begins at or after ``at`` whose _ALIGN span is not its predecessor's."""
    if at <= 0:
        return 0
    fh.seek(at - 1)
    fh.readline()  # the line under way at ``at`` (or its newline)
    pos = fh.tell()
    line = fh.readline()
    prev = _slot(parse, line)
    pos += len(line)
    while pos < size:
        line = fh.readline()
        if not line:
            break
        slot = _slot(parse, line)
        if slot is None or slot != prev:
            return pos
        prev = slot
        pos += len(line)
    return size


def _fold_part(path: str, start: int, stop: int, keep_s: float) -> _Part:
    """The rollup lines of the records from :func:`_boundary` of ``start`` to that of
    ``stop``, and the buckets of the ``keep_s`` slots."""
    parse = loads()
    folds = [Rollups(slot_s) for slot_s in ROLLUP_LEVELS]
    part = _Part({slot_s: [] for slot_s in ROLLUP_LEVELS}, [])
    keep = folds[ROLLUP_LEVELS.index(keep_s)]
    check = ShapeCheck()
    seen: set[tuple[int, float]] = set()
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        pos = _boundary(fh, start, size, parse)
        end = _boundary(fh, stop, size, parse) if stop < size else size
        fh.seek(pos)
        while pos < end:
            line = fh.readline()
            if not line.endswith(b"\n") or not line.strip():
                part.stopped = True
                break
            try:
                rec = parse(line)
            except ValueError:
                part.stopped = True
                break
            schema = rec.get("schema", SCHEMA_VERSION) if isinstance(rec, dict) else None
            if (check.problem(line, rec) is not None or is_duplicate(rec, seen)
                    or (isinstance(schema, int) and schema > SCHEMA_VERSION)):
                part.stopped = True
                break
            pos += len(line)
            part.seqs.add(rec.get("seq"))
            for fold, out in zip(folds, part.lines.values(), strict=True):
                bucket, slot = fold.bucket, fold.slot
                got = fold.add(rec, line, pos)
                if got is not None:
                    out.append(got)
                    if fold is keep and bucket is not None:
                        part.slots.append((slot, bucket))
            part.to = pos
            part.records += 1
    for fold, out in zip(folds, part.lines.values(), strict=True):
        bucket, slot = fold.bucket, fold.slot
        got = fold.line()
        if got is not None:
            out.append(got)
            if fold is keep and bucket is not None:
                part.slots.append((slot, bucket))
    return part


def worth_rebuilding(path: str, rolled_to: int) -> bool:
    """Whether rollups that end at byte ``rolled_to`` of records.jsonl at ``path`` (0: none)
    are worth rebuilding: they leave over STALE of it, and the line there is a record."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            fh.seek(rolled_to)
            line = fh.readline(1 << 20)
        rec = loads()(line)
    except (OSError, ValueError):
        return False
    return (size - rolled_to > STALE * size and line.endswith(b"\n")
            and ShapeCheck().problem(line, rec) is None)


def rebuild_rollups(path: str, slot_s: float, jobs: int | None = None) -> Rebuilt | None:
    """The rollups of records.jsonl at ``path``, folded in ``jobs`` processes, and what
    they hold at ``slot_s`` (one of ROLLUP_LEVELS); None where they would hold nothing."""
    size = os.path.getsize(path)
    if jobs is None:  # a process per core, each with 8 MiB of records at least
        jobs = min(os.cpu_count() or 1, 16, size // (8 << 20) + 1)
    jobs = max(1, jobs)
    bounds = [size * i // jobs for i in range(jobs + 1)]
    if jobs == 1:
        parts = [_fold_part(path, 0, size, slot_s)]
    else:
        from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415 - rarely needed

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            parts = list(pool.map(_fold_part, [path] * jobs, bounds[:-1], bounds[1:],
                                  [slot_s] * jobs))
        used = parts[:next((i + 1 for i, p in enumerate(parts) if p.stopped), len(parts))]
        if not apart(p.seqs for p in used):  # NOTE [duplicates across ranges] in longrun
            parts = [_fold_part(path, 0, size, slot_s)]
    out = Rebuilt(Rolled())
    for part in parts:
        for level, lines in part.lines.items():
            out.lines.setdefault(level, []).extend(lines)
        out.rolled.slots.extend(part.slots)
        out.rolled.records += part.records
        out.rolled.to = part.to or out.rolled.to
        if part.stopped:
            break
    return out if out.rolled.slots else None
