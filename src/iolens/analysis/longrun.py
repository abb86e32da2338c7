"""Long runs: their interval records folded into time buckets, read in parallel.

A week at a 1 s interval is 604,800 records, over a gigabyte of JSON lines:
as Python dicts it would take gigabytes of memory and minutes to judge. So
above LONG_RUN_RECORDS a run is read as buckets of BUCKET_S seconds (chosen
to give about TARGET_BUCKETS of them; :class:`iolens.rundir.rollup.Bucket`
says what a bucket holds), and only the buckets are kept. Where the
recorder's rollups hold the run (NOTE [rollups] in iolens/rundir/rollup.py),
the buckets are merged from them and only the records past them are read;
the records are read in parallel byte ranges, each folded as it is parsed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from iolens.analysis.recordshape import ShapeCheck, Skipped, record_problem
from iolens.rundir import SCHEMA_VERSION
from iolens.rundir.rollup import ROLLUP_LEVELS, Bucket, Rolled, loads, read_rollups

LONG_RUN_RECORDS = 50_000
"""More records than this (14 hours at 1 s) are read as buckets."""
TARGET_BUCKETS = 10_000
"""About this many buckets per run: enough for any chart or verdict window (a long run's
buckets are whole rollup slots, so there may be half as many: see bucket_seconds). At most
MADE_SLOTS (iolens.rundir.rollup): a run whose buckets are one slot each reads them as the
records its rollup lines hold."""


@dataclass
class Seqs:
    """The least and the greatest seq of the records a byte range folded.

    NOTE [duplicates across ranges]: a line written twice is told by its seq and end
    (:func:`is_duplicate`), but a byte range folded in its own process sees only its
    own lines (and the one before its first). The recorder numbers its records in the
    order it writes them, so where each range's seqs all lie above those of the ranges
    before it, no line of one repeats a line of another, and the parallel fold stands;
    else (a line copied far from where it was first written, a recorder that appended to
    another's records) the records are folded again in one process, which sees every
    line: slower, on a damaged file only, and the same as the short run's reading. The
    same holds past the rollups: a record after them whose seq is not above the last one
    they hold has the whole file folded again, without them."""

    lo: int | None = None
    hi: int | None = None

    def add(self, seq: Any) -> None:
        if type(seq) is int:
            if self.lo is None or seq < self.lo:
                self.lo = seq
            if self.hi is None or seq > self.hi:
                self.hi = seq


def apart(ranges: Iterable[Seqs]) -> bool:
    """True when each range's seqs (in the file's order) all lie above every earlier one's
    (NOTE [duplicates across ranges])."""
    top: int | None = None
    for r in ranges:
        if r.lo is None or r.hi is None:
            continue
        if top is not None and r.lo <= top:
            return False
        top = r.hi if top is None else max(top, r.hi)
    return True


@dataclass
class ChunkResult:
    """What one byte range of records.jsonl folded into."""

    buckets: dict[int, Bucket]
    lines: int = 0
    made: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Buckets read from the rollups as records (NOTE [a slot's record] in
    iolens/rundir/rollup.py), by index, where none of ``buckets`` has that index."""
    newer: int = 0
    skipped: Skipped = field(default_factory=Skipped)
    seqs: Seqs = field(default_factory=Seqs)

    @property
    def bad(self) -> int:
        """Lines skipped."""
        return self.skipped.total


def _fold_range(path: str, start: int, stop: int, bucket_s: float) -> ChunkResult:
    """Fold the whole lines that begin in [start, stop) of ``path`` into buckets."""
    parse = loads()
    out = ChunkResult({})
    buckets = out.buckets
    seen: set[tuple[int, float]] = set()
    check = ShapeCheck()
    with open(path, "rb") as fh:
        if start:
            fh.seek(start - 1)
            fh.readline()  # the line under way at ``start`` belongs to the range before
        pos = fh.tell()
        if pos:  # a line written twice across the range's first byte is seen as such
            _seen_before(fh, pos, parse, seen)
        while pos < stop:
            where = f"byte {pos}"  # line numbers are not known inside a byte range
            line = fh.readline()
            if not line:
                break
            pos += len(line)
            if not line.strip():
                continue
            out.lines += 1
            try:
                rec = parse(line)
            except ValueError as exc:  # orjson.JSONDecodeError is one
                out.skipped.add("not JSON", where, str(exc)[:80])
                continue
            why = check.problem(line, rec)
            if why is not None:
                out.skipped.add_problem(where, why)
                continue
            if is_duplicate(rec, seen):
                out.skipped.add("duplicate", where, f"seq {rec['seq']} again")
                continue
            out.seqs.add(rec.get("seq"))
            schema = rec.get("schema", SCHEMA_VERSION)
            if isinstance(schema, int) and schema > SCHEMA_VERSION:
                out.newer += 1
            idx = bucket_index(float(rec.get("elapsed_s") or 0.0), bucket_s)
            b = buckets.get(idx)
            if b is None:
                b = buckets[idx] = Bucket()
            b.add(rec)
    return out


def _seen_before(fh: Any, pos: int, parse: Any, seen: set[tuple[int, float]]) -> None:
    """Add the interval of the line that ends at byte ``pos`` of ``fh`` to ``seen`` (where
    it is one), and leave ``fh`` at ``pos``."""
    begin = max(0, pos - _LINE_MAX)
    fh.seek(begin)
    data = fh.read(pos - begin)
    cut = data.rfind(b"\n", 0, len(data) - 1)
    if cut >= 0 or begin == 0:
        try:
            rec = parse(data[cut + 1:])
            if isinstance(rec, dict):
                is_duplicate(rec, seen)
        except (ValueError, TypeError):
            pass
    fh.seek(pos)


_LINE_MAX = 1 << 20
"""The longest line looked back at for a duplicate across a range's start (a record is a
few KiB)."""


def is_duplicate(rec: dict[str, Any], seen: set[tuple[int, float]]) -> bool:
    """True when an interval of the same seq and end was seen before (a line written twice).

    Records without a seq are never called duplicates.
    """
    seq = rec.get("seq")
    if not isinstance(seq, int):
        return False
    key = (seq, float(rec.get("elapsed_s") or 0.0))
    if key in seen:
        return True
    seen.add(key)
    return False


def estimate_records(path: str) -> tuple[int, float]:
    """(about how many lines records.jsonl holds, the elapsed seconds of its last record:
    the latest in its last 64 KiB, so that a line written again at its end, an early
    record's copy, does not make a long run look short)."""
    parse = loads()
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0.0
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
        lines = head.count(b"\n") or 1
        estimate = int(size / (len(head) / lines)) if len(head) < size else lines
        fh.seek(max(0, size - (1 << 16)))
        tail = fh.read().splitlines()
    last = 0.0
    for line in tail:
        try:
            rec = parse(line)
        except ValueError:
            continue
        if record_problem(rec) is None:  # a finite, non-negative elapsed_s
            last = max(last, float(rec["elapsed_s"] or 0.0))
    return estimate, last


def fold_run(path: str, bucket_s: float, jobs: int | None = None, *,
             rolled: Rolled | bool | None = True) -> ChunkResult:
    """Every record of records.jsonl at ``path`` folded into buckets of ``bucket_s``: from
    the rollups beside it as far as they hold it (when the buckets are whole rollup slots)
    and from the records after them (NOTE [rollups] in iolens/rundir/rollup.py).
    ``rolled``: the rollups already read (None: there are none), else they are read (as
    records where a bucket is one slot: NOTE [a slot's record])."""
    slot_s = rollup_slot(bucket_s)
    per = round(bucket_s / slot_s) if slot_s else 0
    if rolled is True:
        rolled = (read_rollups(os.path.dirname(path) or ".", path, slot_s, made=per == 1)
                  if slot_s else None)
    if not isinstance(rolled, Rolled) or not slot_s:
        return fold_records(path, bucket_s, jobs)
    total = fold_records(path, bucket_s, jobs, start=rolled.to)
    if rolled.seq is not None and total.seqs.lo is not None and total.seqs.lo <= rolled.seq:
        # a line past the rollups that they hold already (NOTE [duplicates across ranges])
        return fold_records(path, bucket_s, jobs)
    total.lines += rolled.records
    buckets = total.buckets
    slots = rolled.slots
    try:
        if rolled.made and per != 1:  # (buckets of several slots: merged from their states)
            slots = _states(rolled.made)
        elif rolled.made:
            _take_made(rolled.made, total)
    except ValueError:  # (a state whose line's CRC was made anew after an edit)
        return fold_records(path, bucket_s, jobs)
    for slot, b in slots:
        idx = slot // per
        mine = buckets.get(idx)
        if mine is None:
            buckets[idx] = b
        else:
            mine.merge(b)
    return total


def _states(made: list[tuple[int, dict[str, Any], bytes]]) -> list[tuple[int, Bucket]]:
    parse = loads()
    return [(slot, Bucket.from_state(parse(state))) for slot, _, state in made]


def _take_made(made: list[tuple[int, dict[str, Any], bytes]], total: ChunkResult) -> None:
    """The rollups' records, each the bucket of its slot (buckets of one slot each), into
    ``total``: as they stand, but where records past the rollups fall in the slot, or a
    slot comes again (rollups rebuilt for a directory recorded into twice, its time
    begun anew), merged from the states (ValueError where one is not a bucket's)."""
    parse = loads()
    buckets = total.buckets
    first: dict[int, bytes] = {}
    for slot, rec, state in made:
        mine = buckets.get(slot)
        if mine is not None:  # (records past the rollups, or the slot's line before)
            mine.merge(Bucket.from_state(parse(state)))
        elif slot in total.made:
            del total.made[slot]
            mine = buckets[slot] = Bucket.from_state(parse(first[slot]))
            mine.merge(Bucket.from_state(parse(state)))
        else:
            total.made[slot], first[slot] = rec, state


def fold_records(path: str, bucket_s: float, jobs: int | None = None, *,
                 start: int = 0) -> ChunkResult:
    """The records of ``path`` from byte ``start`` folded into buckets of ``bucket_s``, in
    ``jobs`` processes."""
    size = os.path.getsize(path)
    if jobs is None:  # a process per core, each with 8 MiB of records at least
        jobs = min(os.cpu_count() or 1, 16, (size - start) // (8 << 20) + 1)
    jobs = max(1, jobs)
    bounds = [start + (size - start) * i // jobs for i in range(jobs + 1)]
    if jobs == 1:
        parts = [_fold_range(path, start, size, bucket_s)]
    else:
        from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415 - a short run's report needs none

        with ProcessPoolExecutor(max_workers=jobs) as pool:
            parts = list(pool.map(_fold_range, [path] * jobs, bounds[:-1], bounds[1:],
                                  [bucket_s] * jobs))
        if not apart(part.seqs for part in parts):  # NOTE [duplicates across ranges]
            parts = [_fold_range(path, start, size, bucket_s)]
    total = ChunkResult({})
    for part in parts:
        total.seqs.add(part.seqs.lo)
        total.seqs.add(part.seqs.hi)
        total.lines += part.lines
        total.skipped.merge(part.skipped)
        total.newer += part.newer
        for idx, b in part.buckets.items():
            mine = total.buckets.get(idx)
            if mine is None:
                total.buckets[idx] = b
            else:
                mine.merge(b)
    return total


def rollup_slot(bucket_s: float) -> float:
    """The longest rollup slot that a bucket of ``bucket_s`` holds whole; 0 for none."""
    for slot_s in reversed(ROLLUP_LEVELS):
        per = round(bucket_s / slot_s)
        if per >= 1 and per * slot_s == bucket_s:
            return slot_s
    return 0.0


def bucket_index(elapsed_s: float, bucket_s: float) -> int:
    """The bucket of a record that ended at ``elapsed_s``: by its rollup slot where buckets
    are whole slots, so that a record falls in the same bucket read from either."""
    slot_s = rollup_slot(bucket_s)
    if slot_s:
        return int(elapsed_s // slot_s) // round(bucket_s / slot_s)
    return int(elapsed_s // bucket_s)


def bucket_seconds(span_s: float, interval_s: float | None, target: int | None = None) -> float:
    """A bucket length giving about ``target`` (TARGET_BUCKETS) buckets, whole intervals.

    Where the longest rollup slot of twice that length or less is whole intervals, the
    length is rounded up to whole slots of it (at most twice as long: half as many
    buckets), which the report then merges from the rollups instead of reading every
    record (NOTE [rollups] in iolens/rundir/rollup.py)."""
    target = target or TARGET_BUCKETS
    step = interval_s if interval_s and interval_s > 0 else 1.0
    natural = max(step, math.ceil(span_s / target / step) * step)
    for slot_s in reversed(ROLLUP_LEVELS):
        per = slot_s / step
        if slot_s <= 2 * natural and abs(per - round(per)) < 1e-9:
            return math.ceil(natural / slot_s) * slot_s
    return natural


def bucket_records(result: ChunkResult) -> Iterator[dict[str, Any]]:
    """The buckets as records, in time order."""
    buckets, made = result.buckets, result.made
    for idx in sorted(buckets.keys() | made.keys()) if made else sorted(buckets):
        b = buckets.get(idx)
        yield made[idx] if b is None else b.record()
