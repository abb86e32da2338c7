"""Bad input, fuzzed: the /proc parsers, the rate code, the run-directory reader, the CLI.

Each property runs a fixed, derandomized set of Hypothesis examples (no example
database), so CI sees the same inputs on every run. Inputs are both wholly random
text and structured mutations of realistic lines: field counts changed, tokens
made non-numeric, negative or beyond 2**64, NULs and other unicode, a torn last
line, names with spaces and parentheses.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iolens._errors import IolensError
from iolens.analysis import compare as C
from iolens.analysis.longrun import fold_records
from iolens.analysis.rundata import RunData, load_run
from iolens.core.rates import device_rates, snapshot_rates
from iolens.report.build import build_report
from iolens.rundir import records as trecords
from iolens.rundir.timing import TimingReader, TrainingAggregator
from iolens.sources.counters import COUNT_MOD, TIME_MOD, DiskCounters, DiskSnapshot
from iolens.sources.devmap import parse_mountinfo
from iolens.sources.diskstats import DiskstatsParser, parse_diskstats, parse_stat_file
from iolens.sources.procfs import (
    cpu_percentages,
    parse_cpu_times,
    parse_meminfo,
    parse_proc_io,
    parse_proc_stat,
)
from iolens.sources.uptime import parse_uptime_cs
from tests.test_verdict import SLOW_LOOP, rec

Record = Callable[[str, object], None]  # pytest's record_property fixture


def fuzz(n: int) -> settings:
    """Hypothesis settings of this file: ``n`` examples, reproducible, no database."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- shared strategies ---------------------------------------------------------------------

# Text as a broken file may hold it: any code point (NUL and lone surrogates included).
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=400)
# Tokens that must not be read as a counter.
BAD_TOKENS = st.sampled_from(["x", "1.5", "0x10", "--", "1e3", "NaN", "\x00", "é", "½", "²",
                              "١٢", "12a", ""])
HUGE = st.integers(min_value=COUNT_MOD, max_value=1 << 200)


def numbers_of(obj: Any) -> Iterator[tuple[str, float]]:
    """Every number inside ``obj`` (a parsed JSON value), with its path."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{path}.{k}", x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield path, v


def assert_finite_non_negative(obj: Any, allow_negative: tuple[str, ...] = ()) -> None:
    for path, v in numbers_of(obj):
        assert math.isfinite(v), f"{path} = {v}"
        if not path.endswith(allow_negative):
            assert v >= 0, f"{path} = {v}"


# -- /proc/diskstats -------------------------------------------------------------------------


def non_blank_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.split())


@st.composite
def mutated_diskstats(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    """A diskstats text of mutated lines and what its lines should come to (by expect_of)."""
    lines: list[str] = []
    for i in range(draw(st.integers(1, 12))):
        name = f"d{i:03d}x"  # no name is a prefix of another, even when torn
        values = draw(st.lists(st.integers(0, TIME_MOD - 1), min_size=17, max_size=17))
        tokens = [str(8), str(i), name, *map(str, values)]
        kind = draw(st.sampled_from(["ok", "fields", "bad", "negative", "huge", "name",
                                     "extra", "duplicate"]))
        if kind == "fields":
            tokens = tokens[:draw(st.integers(1, 13))]
        elif kind == "bad":
            tokens[draw(st.sampled_from([0, 1, *range(3, 20)]))] = draw(BAD_TOKENS) or "x"
        elif kind == "negative":
            tokens[draw(st.sampled_from([0, 1, *range(3, 20)]))] = str(-draw(st.integers(1)))
        elif kind == "huge":
            tokens[draw(st.integers(3, 19))] = str(draw(HUGE))
        elif kind == "name":
            tokens[2] = name + draw(st.sampled_from(["\x00", "é", "(", ")", "💾", "\ufeff"]))
        elif kind == "extra":
            tokens += ["7"] * draw(st.integers(1, 5))
        elif kind == "duplicate" and lines:
            lines.append(lines[-1])
        lines.append(" ".join(tokens))
    if draw(st.booleans()):  # a torn last line: it may still hold 14 numbers or more
        lines[-1] = lines[-1][:draw(st.integers(0, len(lines[-1])))]
        text = "\n".join(lines)
    else:
        text = "\n".join(lines) + "\n"
    expect = {"devices": 0, "skipped": 0, "old": 0}
    for i, line in enumerate(lines):
        if kind := expect_of(line, lines[:i]):
            expect[kind] += 1
    return text, expect


def expect_of(line: str, before: list[str]) -> str:
    """The oracle for one line of a mutated text: blank, devices, skipped or old."""
    tokens = line.split()
    if not tokens:
        return ""
    if len(tokens) < 14 and len(tokens) != 7:
        return "skipped"
    if not all(t.isascii() and t.isdigit() for t in tokens[:2] + tokens[3:20]):
        return "skipped"
    if len(tokens) == 7:
        return "old"
    if any(expect_of(b, []) == "devices" and b.split()[2] == tokens[2] for b in before):
        return "skipped"  # a second line for a name already read
    return "devices"


def assert_rates_sane(prev: DiskSnapshot, cur: DiskSnapshot) -> None:
    for r in snapshot_rates(prev, cur).values():
        for field in r.__slots__:
            v = getattr(r, field)
            if isinstance(v, float):
                assert math.isfinite(v) and v >= 0, (r.device, field, v)


def test_diskstats_random_text(record_property: Record) -> None:
    """Random /proc/diskstats text: no exception, every non-blank line is a device, skipped
    or old-format, and rates of any two parses are finite and non-negative."""
    seen = [0]

    @fuzz(300)
    @given(ANY_TEXT, ANY_TEXT)
    def check(a: str, b: str) -> None:
        seen[0] += 1
        pa, pb = parse_diskstats(a), parse_diskstats(b)
        for text, p in ((a, pa), (b, pb)):
            assert len(p.devices) + p.skipped_lines + p.old_format_lines == non_blank_lines(text)
        assert_rates_sane(DiskSnapshot(100, pa.devices), DiskSnapshot(300, pb.devices))

    check()
    record_property("measured", f"{seen[0]} pairs of random texts")


def test_diskstats_mutated_lines(record_property: Record) -> None:
    """Mutated /proc/diskstats lines (field counts, non-numeric, negative, > 2**64, NUL and unicode
    names, repeats, torn last line): each line lands where the oracle says and no rate is negative,
    NaN or infinite."""
    totals = {"devices": 0, "skipped": 0, "old": 0}

    @fuzz(250)
    @given(mutated_diskstats(), mutated_diskstats(), st.integers(0, 10_000),
           st.integers(0, 10_000))
    def check(a: tuple[str, dict[str, int]], b: tuple[str, dict[str, int]], t0: int,
              dt: int) -> None:
        pa, pb = parse_diskstats(a[0]), parse_diskstats(b[0])
        parser = DiskstatsParser()  # reusing unchanged lines' records gives the same counts
        for text, p in ((a[0], pa), (b[0], pb), (a[0], pa)):
            again = parser.parse(text)
            assert (again.devices, again.skipped_lines, again.old_format_lines) == (
                p.devices, p.skipped_lines, p.old_format_lines)
        for (_, want), p in ((a, pa), (b, pb)):
            got = {"devices": len(p.devices), "skipped": p.skipped_lines,
                   "old": p.old_format_lines}
            assert got == want
            for k in totals:
                totals[k] += got[k]
        # b after a: counters that go back, devices that vanish and return, wraps.
        first, second = DiskSnapshot(t0, pa.devices), DiskSnapshot(t0 + dt, pb.devices)
        assert_rates_sane(first, second)
        assert_rates_sane(second, DiskSnapshot(t0 + 2 * dt, pa.devices))
        assert_rates_sane(DiskSnapshot.zero(), second)
        with pytest.raises(ValueError, match="backwards"):  # the one documented error
            snapshot_rates(DiskSnapshot(t0 + 1, {}), DiskSnapshot(t0, {}))

    check()
    record_property("measured", ", ".join(f"{v} {k}" for k, v in totals.items()) + " lines")


COUNTS = st.integers(0, COUNT_MOD - 1)
TIMES = st.integers(0, TIME_MOD - 1)


@st.composite
def counters(draw: st.DrawFn) -> DiskCounters:
    """Counters as the parser makes them: counts below 2**64, times below 2**32."""
    v = [draw(TIMES if i in (3, 7, 9, 10, 14, 16) else COUNTS) for i in range(17)]
    return DiskCounters(8, 0, "sda", *v)


def test_device_rates_of_any_counters(record_property: Record) -> None:
    """Any two counter sets of one device (backwards, wrapped, reset, equal) at any interval: every
    rate is finite and non-negative."""
    seen = [0]

    @fuzz(400)
    @given(counters() | st.none(), counters(), st.integers(1, 1 << 40))
    def check(prev: DiskCounters | None, cur: DiskCounters, itv: int) -> None:
        seen[0] += 1
        r = device_rates(prev, cur, itv)
        for name in r.__slots__:
            v = getattr(r, name)
            if isinstance(v, float):
                assert math.isfinite(v) and v >= 0, (name, v)

    check()
    record_property("measured", f"{seen[0]} counter pairs")


def test_sysfs_stat_file_text() -> None:
    """Random and mutated /sys/block/<dev>/stat text: no exception; counters only from 11 or more
    non-negative integers."""

    @fuzz(200)
    @given(ANY_TEXT | st.lists(st.integers(-5, 1 << 70) | BAD_TOKENS, max_size=20).map(
        lambda xs: " ".join(map(str, xs))))
    def check(text: str) -> None:
        got = parse_stat_file("sda", text)
        tokens = text.split()
        if got is not None:
            assert len(tokens) >= 11
            assert all(t.isascii() and t.isdigit() for t in tokens[:17])

    check()


# -- /proc/uptime ------------------------------------------------------------------------------


def test_uptime_text() -> None:
    """Random and mutated /proc/uptime text: a non-negative centisecond count, or the documented
    ValueError."""

    @fuzz(300)
    @given(ANY_TEXT | st.builds(lambda a, b, rest: f"{a}.{b} {rest}",
                                st.integers(-10, 1 << 70), st.integers(0, 99), ANY_TEXT)
           | st.sampled_from(["²", "١٢.٣٤ 5.00", "12.", ".5", "+1.00", "1_0.00", "12.34.56",
                              "\x0012.00", "", " \n"]))
    def check(text: str) -> None:
        try:
            cs = parse_uptime_cs(text)
        except ValueError as exc:
            assert str(exc).startswith("not an uptime")  # noqa: PT017 - any input, no raises()
            return
        assert isinstance(cs, int) and cs >= 0
        sec, _, frac = text.split(maxsplit=1)[0].partition(".")
        assert cs == int(sec) * 100 + int(frac or 0)

    check()


# -- /proc/<pid>/stat, /proc/stat, /proc/<pid>/io, /proc/meminfo -------------------------------


def pid_stat(pid: int, comm: str, fields: list[str]) -> str:
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


REAL_STAT_TAIL = ("S 1 4242 4242 0 -1 4194560 5120 0 12 0 250 75 3 4 20 0 5 0 123456 "
                  "1048576 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")


def test_pid_stat_names_and_mutations() -> None:
    """/proc/<pid>/stat with any process name (spaces, parentheses, NUL, newlines) and mutated
    fields: the name comes back whole, and no negative or non-numeric counter gets through."""

    @fuzz(300)
    @given(st.integers(0, 1 << 22), ANY_TEXT.filter(lambda s: ")" not in s[-1:]),
           st.lists(st.sampled_from(["drop", "bad", "negative", "huge"]), max_size=3),
           st.randoms(use_true_random=False))
    def check(pid: int, comm: str, mutations: list[str], rnd: random.Random) -> None:
        fields = REAL_STAT_TAIL.split()
        for m in mutations:
            if not fields:
                break
            i = rnd.randrange(len(fields))
            if m == "drop":
                del fields[rnd.randrange(len(fields)):]
            elif m == "bad":
                fields[i] = "x("
            elif m == "negative":
                fields[i] = "-" + fields[i].lstrip("-")
            else:
                fields[i] = str(1 << 80)
        st_ = parse_proc_stat(pid_stat(pid, comm, fields))
        if not mutations:
            assert st_ is not None and (st_.pid, st_.comm, st_.ppid) == (pid, comm, 1)
            assert (st_.utime_ticks, st_.stime_ticks, st_.children_ticks) == (250, 75, 7)
        if st_ is not None:
            assert st_.comm == comm
            assert min(st_.pid, st_.ppid, st_.utime_ticks, st_.stime_ticks,
                       st_.children_ticks) >= 0

    check()


def test_pid_stat_random_text() -> None:
    """Random /proc/<pid>/stat text: no exception, and a parsed one has no negative counter."""

    @fuzz(300)
    @given(ANY_TEXT)
    def check(text: str) -> None:
        got = parse_proc_stat(text)
        if got is not None:
            assert min(got.pid, got.ppid, got.utime_ticks, got.stime_ticks) >= 0

    check()


CPU_LINE = "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 175628 0"


@st.composite
def proc_stat_text(draw: st.DrawFn) -> str:
    """/proc/stat with a mutated aggregate cpu line among random ones."""
    tokens = CPU_LINE.split()
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(1, len(tokens) - 1))
        tokens[i] = str(draw(st.sampled_from(["x", "-1", str(1 << 70), "٣", "1.0"])))
    tokens = tokens[: draw(st.integers(1, len(tokens)))]
    return draw(ANY_TEXT) + "\n" + " ".join(tokens) + "\ncpu0 1 2 3 4\n" + draw(ANY_TEXT)


def test_proc_stat_cpu_shares(record_property: Record) -> None:
    """Random and mutated /proc/stat: no exception, no negative counter parsed, and CPU shares of
    any two parses are finite and within 0-100 %."""
    parsed = [0]

    @fuzz(300)
    @given(proc_stat_text() | ANY_TEXT, proc_stat_text() | ANY_TEXT)
    def check(a: str, b: str) -> None:
        ta, tb = parse_cpu_times(a), parse_cpu_times(b)
        for t in (ta, tb):
            if t is not None:
                parsed[0] += 1
                assert min(t.user, t.nice, t.system, t.idle, t.iowait, t.irq, t.softirq,
                           t.steal) >= 0
        if ta is not None and tb is not None:
            for k, v in cpu_percentages(ta, tb).items():
                assert math.isfinite(v) and 0 <= v <= 100, (k, v)

    check()
    record_property("measured", f"{parsed[0]} cpu lines parsed")


IO_TEXT = ("rchar: 323934931\nwchar: 323929600\nsyscr: 632687\nsyscw: 632675\n"
           "read_bytes: 4096\nwrite_bytes: 323932160\ncancelled_write_bytes: 0\n")


@st.composite
def mutated_lines(draw: st.DrawFn, text: str) -> str:
    """``text`` with some of its values replaced, lines dropped, repeated or torn."""
    lines = text.splitlines()
    out = []
    for line in lines:
        key, _, value = line.partition(":")
        m = draw(st.sampled_from(["keep", "keep", "bad", "negative", "huge", "drop", "twice"]))
        if m == "bad":
            value = " " + draw(BAD_TOKENS)
        elif m == "negative":
            value = " -" + value.strip()
        elif m == "huge":
            value = " " + str(draw(HUGE))
        if m != "drop":
            out.append(f"{key}:{value}")
        if m == "twice":
            out.append(f"{key}:{value}")
    joined = "\n".join(out)
    return joined[: draw(st.integers(0, len(joined)))] if draw(st.booleans()) else joined


def test_proc_io_text() -> None:
    """Random and mutated /proc/<pid>/io: no exception, every counter read is non-negative, and an
    unmutated file reads exactly."""
    assert parse_proc_io(IO_TEXT) is not None

    @fuzz(300)
    @given(mutated_lines(IO_TEXT) | ANY_TEXT)
    def check(text: str) -> None:
        io = parse_proc_io(text)
        if io is not None:
            assert min(io.rchar, io.wchar, io.read_bytes, io.write_bytes,
                       io.cancelled_write_bytes) >= 0

    check()


MEMINFO = ("MemTotal:       32827216 kB\nMemFree:         1204220 kB\n"
           "MemAvailable:   24193044 kB\nBuffers:          512412 kB\n"
           "Cached:         20334060 kB\nDirty:               128 kB\n"
           "Writeback:             0 kB\n")


def test_meminfo_text() -> None:
    """Random and mutated /proc/meminfo (values non-numeric, negative, unicode digits, > 2**64): no
    exception, only known keys, whole non-negative kB."""

    @fuzz(300)
    @given(mutated_lines(MEMINFO) | ANY_TEXT)
    def check(text: str) -> None:
        got = parse_meminfo(text)
        assert set(got) <= {"MemTotal", "MemAvailable", "Cached", "Buffers", "Dirty",
                            "Writeback"}
        assert all(v >= 0 and v % 1024 == 0 for v in got.values())

    check()


# -- /proc/self/mountinfo ---------------------------------------------------------------------

MOUNTINFO_LINES = [
    "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw",
    "35 22 0:31 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw,size=4096k",
    r"120 22 7:0 /sub /mnt/my\040data rw,relatime - ext4 /dev/loop0 rw",
    "130 22 0:52 / /merged rw - overlay overlay rw,lowerdir=/l1:/l2,upperdir=/u,workdir=/w",
    "140 22 0:60 / /net rw - nfs4 server:/export rw,vers=4.2",
]


@st.composite
def mutated_mountinfo(draw: st.DrawFn) -> tuple[bytes, int]:
    """A mountinfo text of mutated real lines and how many of them still fit the format."""
    lines: list[bytes] = []
    good = 0
    for _ in range(draw(st.integers(0, 8))):
        fields = draw(st.sampled_from(MOUNTINFO_LINES)).split(" ")
        m = draw(st.sampled_from(["ok", "nosep", "short", "devnum", "negative", "escape",
                                  "binary"]))
        fits = True
        if m == "nosep":
            fields = [f for f in fields if f != "-"]
            fits = False
        elif m == "short":
            cut = draw(st.integers(1, 5))
            fields = fields[:cut]
            fits = False
        elif m == "devnum":
            fields[2] = draw(st.sampled_from(["x:1", "8", "8:", ":", "8:1a"]))
            fits = False
        elif m == "negative":
            fields[2] = "-8:1"
            fits = False
        elif m == "escape":  # octal escapes, one of them a NUL
            fields[4] = fields[4] + draw(st.sampled_from([r"\000", r"\134", r"\777", "\\"]))
        line = " ".join(fields).encode()
        if m == "binary":
            line = line.replace(b"/", b"\xff/", 1)
        lines.append(line)
        good += fits
    return b"\n".join(lines), good


def test_mountinfo_text(record_property: Record) -> None:
    """Random and mutated /proc/self/mountinfo (no separator, short, bad or negative device numbers,
    octal escapes and NUL, non-UTF-8): no exception, each line an entry or counted as skipped."""
    entries = [0]

    @fuzz(300)
    @given(mutated_mountinfo())
    def check(case: tuple[bytes, int]) -> None:
        data, good = case
        got = parse_mountinfo(data)
        assert len(got) == good
        assert len(got) + got.skipped == sum(1 for x in data.splitlines() if x.strip())
        entries[0] += len(got)

    check()

    @fuzz(200)
    @given(ANY_TEXT | st.binary(max_size=300))
    def check_random(data: str | bytes) -> None:
        got = parse_mountinfo(data)
        raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
        assert len(got) + got.skipped == sum(1 for x in raw.splitlines() if x.strip())
        assert all(e.devnum[0] >= 0 and e.devnum[1] >= 0 for e in got)

    check_random()
    record_property("measured", f"{entries[0]} mount entries parsed from mutated lines")


# -- records.jsonl, meta.json, timing/ --------------------------------------------------------

# A record's figures, and what each may be replaced with; the kind of skip it makes.
FIGURE_PATHS = [("devices", "vda", "util"), ("job", "read_bytes_s"),
                ("job", "roles", "worker", "cpu_pct"), ("cpu", "idle"),
                ("train", "data_wait", "sum_s"), ("train", "batches"), ("elapsed_s",),
                ("interval_s",), ("job", "states", "S"), ("train", "step_source"),
                ("devices", "vda"), ("devices",), ("job", "roles"), ("train",), ("cpu",)]
SECTIONS = {("devices", "vda"), ("devices",), ("job", "roles"), ("train",), ("cpu",)}
BAD_VALUES: list[tuple[str, Any]] = [
    ("with a bad figure", "1.0"), ("with a bad figure", {"x": 1}), ("with a bad figure", [1]),
    ("with a bad figure", -1), ("with a bad figure", -0.5), ("with a bad figure", 10**30),
    ("with a bad figure", True), ("not JSON", math.nan), ("not JSON", math.inf),
    ("not JSON", -math.inf)]
FOREIGN = ["[1, 2]", '"text"', "3", "null", "true", "{}",
           '{"level": "info", "msg": "epoch 1 done", "ts": 1700000000}',
           '{"seq": 1, "devices": {"vda": {"util": 5}}}']


def set_path(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


@st.composite
def damaged_records(draw: st.DrawFn) -> tuple[bytes, dict[str, int], int]:
    """records.jsonl lines, damaged: (text, expected skips by kind, expected records)."""
    n = draw(st.integers(0, 25))
    lines: list[bytes] = []
    skips: dict[str, int] = {}
    good: list[bytes] = []

    def skip(kind: str) -> None:
        skips[kind] = skips.get(kind, 0) + 1

    for i in range(n):
        r = rec(i, wait=0.03, devices={"vda": dict(SLOW_LOOP["loop0"])}, job_read=1e6)
        m = draw(st.sampled_from(["ok", "ok", "ok", "torn", "garbage", "foreign", "figure",
                                  "duplicate", "blank", "no-end"]))
        line = json.dumps(r).encode()
        if m == "torn":
            line = line[: draw(st.integers(1, len(line) - 1))]
            skip("not JSON")
        elif m == "garbage":
            junk = draw(st.binary(max_size=40)).replace(b"\n", b"")
            line = b"\xff" + junk
            skip("not JSON")
        elif m == "foreign":
            line = draw(st.sampled_from(FOREIGN)).encode()
            skip("not an iolens record")
        elif m == "figure":
            path = draw(st.sampled_from(FIGURE_PATHS))
            kind, value = draw(st.sampled_from(BAD_VALUES))
            if isinstance(value, dict) and path in SECTIONS:
                value = {"batches": "y", "x": "y"}  # an object where one belongs, bad inside
            elif isinstance(value, str) and path == ("train", "step_source"):
                value = 5  # any text is a step source (a newer one, perhaps); a number not
            set_path(r, path, value)
            line = json.dumps(r).encode()
            skip(kind)
        elif m == "no-end":  # null is a figure not measured, but every interval ends
            r["elapsed_s"] = None
            line = json.dumps(r).encode()
            skip("with a bad figure")
        elif m == "duplicate" and good:
            line = draw(st.sampled_from(good))
            skip("duplicate")
        elif m == "blank":
            line = b"   "
        else:
            good.append(line)
        lines.append(line)
    # Time going backwards: the lines in any order (which copy of a duplicate is kept
    # changes, not how many are skipped).
    order = draw(st.permutations(range(len(lines))))
    lines = [lines[i] for i in order]
    newline_at_end = draw(st.booleans())
    text = b"\n".join(lines) + (b"\n" if lines and newline_at_end else b"")
    if draw(st.booleans()):  # a torn last line, from a run that was killed
        text += (b"\n" if text and not text.endswith(b"\n") else b"")
        text += b'{"schema": 1, "seq": 99, "elapsed_s": 1'
        skip("not JSON")
    return text, skips, len(good)


def skip_note(notes: list[str]) -> str:
    found = [n for n in notes if "line(s) of records.jsonl" in n]
    assert len(found) <= 1, notes
    return found[0] if found else ""


def check_report(run: RunData) -> dict[str, Any]:
    """The report of ``run``: built without an exception, JSON without NaN, figures >= 0."""
    report = build_report(run)
    json.dumps(report, allow_nan=False)
    assert_finite_non_negative(report, allow_negative=("exit_code",))
    share = report["verdict"].get("data_wait_share")
    assert share is None or 0 <= share <= 1
    return report


def write_dir(folder: Path, records: bytes | None, meta: bytes | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if records is not None:
        (folder / "records.jsonl").write_bytes(records)
    if meta is not None:
        (folder / "meta.json").write_bytes(meta)
    return folder


META = json.dumps({"command": ["python", "train.py"], "host": "box", "cpus": 8,
                   "interval_s": 1.0, "devices": {"vda": "serves the dataset"}}).encode()


def test_records_jsonl_damaged(record_property: Record) -> None:
    """Damaged records.jsonl (torn, binary, foreign JSON, wrong-typed, negative, NaN and huge
    figures, duplicates, any order, torn last line), with and without meta.json: load_run keeps
    exactly the valid records, counts every skipped line by kind in one note, and the report's
    figures are finite and non-negative."""
    totals = {"examples": 0, "kept": 0, "skipped": 0}

    @fuzz(60)
    @given(damaged_records(), st.booleans())
    def check(case: tuple[bytes, dict[str, int], int], with_meta: bool) -> None:
        text, skips, good = case
        with tempfile.TemporaryDirectory() as tmp:
            folder = write_dir(Path(tmp) / "run", text, META if with_meta else None)
            if not good and not with_meta:
                with pytest.raises(IolensError, match="no usable run"):
                    load_run(str(folder))
                return
            run = load_run(str(folder), max_records=None)
            assert len(run.records) == good
            note = skip_note(run.notes)
            total = sum(skips.values())
            if total:
                assert note.startswith(f"{total} line(s) of records.jsonl"), run.notes
                for kind, k in skips.items():
                    assert f"{k} {kind}" in note, (skips, note)
            else:
                assert not note
            elapsed = [r["elapsed_s"] for r in run.records]
            assert elapsed == sorted(elapsed)
            assert_finite_non_negative(run.records)
            check_report(run)
            totals["examples"] += 1
            totals["kept"] += good
            totals["skipped"] += total

    check()
    record_property("measured", f"{totals['examples']} damaged runs read: {totals['kept']} "
                                f"records kept, {totals['skipped']} lines skipped and counted")


def test_long_run_path_counts_the_same(record_property: Record) -> None:
    """The long-run (parallel orjson) path over the same damaged records.jsonl: as many lines
    skipped as the plain reader, every other line folded into a bucket, in one process or three."""
    seen = [0]

    @fuzz(40)
    @given(damaged_records())
    def check(case: tuple[bytes, dict[str, int], int]) -> None:
        text, skips, good = case
        with tempfile.TemporaryDirectory() as tmp:
            folder = write_dir(Path(tmp) / "run", text, META)
            run = load_run(str(folder), max_records=0 if text.strip() else None)
            total = sum(skips.values())
            note = skip_note(run.notes)
            assert note.startswith(f"{total} line(s)") if total else not note
            assert sum(r.get("merged", 1) for r in run.records) == good
            assert_finite_non_negative(run.records)
            check_report(run)
            # In three byte ranges: a duplicate whose copies fall in two ranges is
            # folded twice, but no line is lost: each is folded or counted.
            folded = fold_records(str(folder / "records.jsonl"), 1.0, jobs=3)
            assert sum(b.n for b in folded.buckets.values()) + folded.bad == folded.lines
            seen[0] += 1

    check()
    record_property("measured", f"{seen[0]} damaged runs read as buckets")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats()
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)
META_KEYS = ["cpus", "interval_s", "duration_s", "lost_records", "exit_code", "instrumented",
             "devices", "gpu", "notes", "timing", "command", "host", "start", "disk_source"]


def test_meta_json_damaged(record_property: Record) -> None:
    """Damaged meta.json (any JSON value for its fields, NaN, a list, binary, empty, torn): load_run
    and the report raise nothing, and a dropped field is named in a note."""
    dropped = [0]

    @fuzz(80)
    @given(st.dictionaries(st.sampled_from(META_KEYS), JSON_VALUES, max_size=6)
           .map(lambda d: json.dumps(d).encode())
           | st.sampled_from([b"", b"[]", b"null", b"\xff\xfe", b'{"cpus": 8', b"NaN",
                              b"[" * 100_000])
           | st.binary(max_size=60))
    def check(meta: bytes) -> None:
        records = b"".join(json.dumps(rec(i)).encode() + b"\n" for i in range(5))
        with tempfile.TemporaryDirectory() as tmp:
            run = load_run(str(write_dir(Path(tmp) / "run", records, meta)))
            assert len(run.records) == 5
            if any("of the wrong type" in n for n in run.notes):
                dropped[0] += 1
            check_report(run)

    check()
    record_property("measured", f"{dropped[0]} meta.json files had fields dropped with a note")


def timing_bytes(recs: list[tuple[int, int, int]]) -> bytes:
    return b"".join(struct.pack("=qqq", *r) for r in recs)


@st.composite
def timing_stream(draw: st.DrawFn) -> tuple[list[tuple[int, int, int]], int, int]:
    """One process's timing records: valid batches with damaged ones among them.

    Returns the records, how many batches are valid, how many records are damaged.
    """
    t = draw(st.integers(0, 1 << 40))
    out: list[tuple[int, int, int]] = [(trecords.EPOCH, t, 2)]
    valid = bad = 0
    for _ in range(draw(st.integers(0, 30))):
        m = draw(st.sampled_from(["ok", "ok", "ok", "early", "back", "type", "epoch",
                                  "stage"]))
        a = t + draw(st.integers(0, 10**7))
        b = a + draw(st.integers(0, 10**8))
        if m == "early":  # returned before it was asked for
            out.append((trecords.BATCH, b + 1, b - draw(st.integers(1, 1 << 30))))
            bad += 1
        elif m == "back":  # handed over before the batch before it
            out.append((trecords.BATCH, t - 10, t - draw(st.integers(1, 9))))
            bad += 1
        elif m == "type":
            out.append((draw(st.sampled_from([0, 11, 0x77, -1])), a, b))
            bad += 1
        elif m == "stage":  # a worker's stage record with a negative time
            out.append((draw(st.sampled_from([trecords.FETCH, trecords.STAGE, trecords.COUNT])),
                        -1 - a, b))
            bad += 1
        elif m == "epoch":
            out.append((trecords.EPOCH, a, -draw(st.integers(1, 1 << 62))))
            bad += 1
        else:
            out.append((trecords.BATCH, a, b))
            valid += 1
            t = b
    return out, valid, bad


def test_timing_records_damaged(record_property: Record) -> None:
    """Damaged timing/<pid>.bin records (batches that end before they start or before the last,
    unknown types, negative worker counts, torn tail, random bytes): every damaged record is
    counted, no wait or step is negative, and the report's figures stay finite and >= 0."""
    counted = [0]

    @fuzz(60)
    @given(timing_stream(), st.binary(max_size=200), st.integers(0, 23))
    def check(stream: tuple[list[tuple[int, int, int]], int, int], junk: bytes,
              torn: int) -> None:
        recs, valid, bad = stream
        agg = TrainingAggregator()
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "run"
            tdir = folder / "timing"
            tdir.mkdir(parents=True)
            (tdir / "100.bin").write_bytes(timing_bytes(recs) + b"\x01" * torn)
            (tdir / "101.bin").write_bytes(junk)
            (tdir / "².bin").write_bytes(timing_bytes(recs))  # not a pid: ignored
            (tdir / "notes.txt").write_text("x")
            reader = TimingReader(str(tdir))
            reader.poll(agg)
            assert reader.pids <= {100, 101}
            only = TrainingAggregator()  # the valid stream alone, for exact counts
            arr = array("q")
            arr.frombytes(timing_bytes(recs))
            only.feed(100, arr)
            assert (len(only.waits), only.skipped) == (valid, bad)
            assert all(w >= 0 for w in agg.waits) and all(s >= 0 for s in agg.steps)
            out = agg.take()
            assert_finite_non_negative(out)
            assert out["data_wait_share"] is None or out["data_wait_share"] >= 0
            records = b"".join(json.dumps(rec(i)).encode() + b"\n" for i in range(5))
            write_dir(folder, records, META)
            run = load_run(str(folder))
            report = check_report(run)
            if agg.skipped:
                assert any("damaged timing record" in n for n in report["notes"])
            batches = C.read_batches(str(folder))
            if batches is not None:
                assert min(batches.steps + batches.waits) >= 0
            counted[0] += only.skipped

    check()
    record_property("measured", f"{counted[0]} damaged timing records counted")


# -- end to end: iolens report and iolens compare ----------------------------------------------


def iolens(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iolens", *args], capture_output=True,
                          text=True, timeout=300, check=False, cwd=cwd)


TRAIN = textwrap.dedent("""
    import time, torch
    from torch.utils.data import DataLoader, Dataset
    class Slow(Dataset):
        def __len__(self): return 24
        def __getitem__(self, i):
            time.sleep(0.02)
            return torch.zeros(4)
    for x in DataLoader(Slow(), batch_size=4, num_workers=1):
        pass
""")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real run recorded by `iolens run` (a torch DataLoader loop)."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("real")
    (base / "train.py").write_text(TRAIN)
    out = iolens("run", "--interval", "0.2", "--out", "run", "--no-live", "--",
                 sys.executable, "train.py", cwd=base)
    assert out.returncode == 0, out.stderr
    return base / "run"


def damage(src: Path, dst: Path, how: str) -> Path:
    """A copy of run ``src`` damaged as ``how`` says."""
    shutil.copytree(src, dst)
    path = dst / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    if how == "torn":
        path.write_bytes(b"".join(lines) + lines[0][: len(lines[0]) // 2])
    elif how == "corrupt":
        path.write_bytes(b"".join(b"{corrupt\n" if i % 3 == 1 else x
                                  for i, x in enumerate(lines)))
    elif how == "reordered":
        path.write_bytes(b"".join(reversed(lines)))
    elif how == "duplicated":
        path.write_bytes(b"".join(x + x for x in lines))
    elif how == "foreign":
        path.write_bytes(b"".join(lines) + b'[1, 2]\n"x"\n{"level": "warn"}\n'
                         b'{"elapsed_s": "3"}\n{"elapsed_s": NaN}\n')
    elif how == "no-meta":
        (dst / "meta.json").unlink()
    elif how == "bad-meta":
        (dst / "meta.json").write_bytes(b'{"cpus": "eight", "devices": [1], "interval_s": -1}')
    elif how == "timing-garbage":
        for f in (dst / "timing").iterdir():
            f.write_bytes(os.urandom(24 * 7 + 5))
    elif how == "other-tool":  # a records.jsonl of another tool, no meta.json
        (dst / "meta.json").unlink()
        path.write_text('{"ts": 1, "level": "info", "msg": "x"}\n[1]\nnull\n')
    elif how == "binary":
        (dst / "meta.json").write_bytes(os.urandom(64))
        path.write_bytes(b"\xff" + os.urandom(4096).replace(b"\n", b""))
    elif how == "empty":
        (dst / "meta.json").unlink()
        path.write_bytes(b"")
    elif how == "meta-only-garbage":
        (dst / "meta.json").write_bytes(b"\x00" * 10)
        path.unlink()
    return dst


SOFT = {"torn": "1 line(s)", "corrupt": "line(s) of records.jsonl", "reordered": "time order",
        "duplicated": "duplicate", "foreign": "5 line(s)", "no-meta": "meta.json is missing",
        "bad-meta": "cpus, interval_s, devices of the wrong type", "timing-garbage": ""}
HARD = ("other-tool", "binary", "empty", "meta-only-garbage")


def test_cli_on_damaged_real_runs(real_run: Path, tmp_path: Path,
                                  record_property: Record) -> None:
    """`iolens report` (text, json, html) and `iolens compare` on damaged copies of a real run: exit
    0 with a note of what was skipped and why, or exit 2 with one clear line when nothing is usable;
    never a traceback."""
    from iolens.cli import main

    outcomes: list[str] = []
    for how in [*SOFT, *HARD]:
        run = damage(real_run, tmp_path / how, how)
        for fmt in ("json", "text", "html"):
            out_file = tmp_path / f"{how}.{fmt}"
            code = main(["report", str(run), "--format", fmt, "-o", str(out_file)])
            if how in HARD:
                assert code == 2, (how, fmt)
                continue
            assert code == 0, (how, fmt)
            if fmt == "json":
                rep = json.loads(out_file.read_text())
                assert SOFT[how] in " | ".join(rep["notes"]), (how, rep["notes"])
                assert_finite_non_negative(rep, allow_negative=("exit_code",))
        code = main(["compare", str(real_run), str(run), "--format", "json"])
        assert code == (2 if how in HARD else 0) or (how not in HARD and code == 1), how
        outcomes.append(f"{how}: {'exit 2' if how in HARD else 'exit 0'}")
    # As a user sees it, in a fresh process: stderr holds one line and no traceback.
    for how in ("corrupt", "binary", "meta-only-garbage"):
        for args in (["report", str(tmp_path / how)],
                     ["compare", str(real_run), str(tmp_path / how)]):
            out = iolens(*args)
            assert "Traceback" not in out.stderr
            if how != "corrupt":
                assert out.returncode == 2
                assert len(out.stderr.strip().splitlines()) == 1, out.stderr
                assert "no usable run" in out.stderr
            else:
                assert out.returncode == 0, out.stderr
    record_property("measured", "; ".join(outcomes))


def test_cli_on_synthetic_damaged_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       record_property: Record) -> None:
    """`iolens report` (json, text) and `iolens compare` over randomly damaged synthetic runs: exit
    0 with the skip note, or exit 2 with one line on stderr; no exception escapes."""
    from iolens.cli import main

    base = write_dir(tmp_path / "base", b"".join(json.dumps(rec(i)).encode() + b"\n"
                                                 for i in range(10)), META)
    codes: dict[int, int] = {}
    n = [0]

    @fuzz(25)
    @given(damaged_records(), st.booleans(), st.sampled_from(["json", "text"]))
    def check(case: tuple[bytes, dict[str, int], int], with_meta: bool, fmt: str) -> None:
        text, skips, good = case
        n[0] += 1
        folder = write_dir(tmp_path / f"d{n[0]}", text, META if with_meta else None)
        capsys.readouterr()
        code = main(["report", str(folder), "--format", fmt])
        out, err = capsys.readouterr()
        codes[code] = codes.get(code, 0) + 1
        total = sum(skips.values())
        if not good and not with_meta:
            assert code == 2 and len(err.strip().splitlines()) == 1, err
        elif fmt == "json":
            assert code == 0, err
            notes = json.loads(out)["notes"]
            assert not total or any(f"{total} line(s)" in x for x in notes), notes
        else:
            assert code == 0, err
            assert not total or f"{total} line(s)" in " ".join(out.split()), out
        code = main(["compare", str(base), str(folder)])
        assert code in (0, 1, 2)
        capsys.readouterr()

    check()
    record_property("measured", f"exit codes of {n[0]} damaged runs: {codes}")


def test_cli_on_a_folder_of_damaged_node_runs(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`iolens report` over a folder of node runs, some unusable: the usable ones are reported and
    each unusable one is named in a note; none usable exits 2 with one line."""
    from iolens.cli import main

    good = b"".join(json.dumps(rec(i)).encode() + b"\n" for i in range(10))
    write_dir(tmp_path / "job" / "node0", good, META)
    write_dir(tmp_path / "job" / "node1", b"\xff" + os.urandom(200).replace(b"\n", b""), None)
    write_dir(tmp_path / "job" / "node2", b"", None)
    assert main(["report", str(tmp_path / "job"), "--format", "json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert [n.split(":")[0] for n in notes if "left out" in n] == ["node1", "node2"]
    shutil.rmtree(tmp_path / "job" / "node0")
    assert main(["report", str(tmp_path / "job")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no usable run directory" in err


def test_newer_records_with_unknown_fields_still_read(tmp_path: Path) -> None:
    """Records of a newer schema with fields this version does not know (nested objects, text):
    kept, with the newer-schema note, and nothing counted as skipped."""
    lines = []
    for i in range(5):
        r = rec(i)
        r["schema"] = 99
        r["job"]["cgroup"] = {"path": "/job", "limits": [1, 2]}
        r["train"]["loader"] = "torch"
        r["gpu"] = [{"index": 0, "util_pct": 50.0, "name": "H200", "clocks": {"sm": 1980}}]
        lines.append(json.dumps(r).encode())
    run = load_run(str(write_dir(tmp_path / "run", b"\n".join(lines) + b"\n", META)))
    assert len(run.records) == 5 and not skip_note(run.notes)
    assert any("newer iolens" in n for n in run.notes)
    check_report(run)


def test_every_record_the_recorder_writes_reads_back(tmp_path: Path) -> None:
    """Records a real recorder writes, flags included, pass the reader's shape check.

    Real samples of this test's own process tree, one with a role whose
    /proc/<pid>/io could not be read (the recorder writes ``io_readable: false``
    then): none may be dropped by the reader, on the plain or the long-run path.
    """
    from iolens.analysis.recordshape import record_problem
    from iolens.recorder.sampler import Recorder, RoleTotals
    from iolens.rundir import RunDir

    run = RunDir(str(tmp_path / "run"))
    recorder = Recorder(None, os.getpid(), 0.05, {})  # samples only: written below
    try:
        samples = []
        for _ in range(3):
            samples.append(recorder.sample())
        unreadable = RoleTotals(pids=1, io_readable=False).record(1.0)
        assert unreadable["io_readable"] is False
        samples[-1]["job"]["roles"]["other"] = unreadable
        for sample in samples:
            assert record_problem(json.loads(json.dumps(sample))) is None, sample
            run.append(sample)
    finally:
        recorder.close()
        run.close()
    for limit in (None, 0):  # the plain reader, then the long-run fold
        data = load_run(str(tmp_path / "run"), max_records=limit)
        assert not [n for n in data.notes if "skipped" in n], data.notes


def test_the_shape_fast_path_agrees_with_the_whole_check() -> None:
    """Lines of a shape seen before, changed only where the shape cannot see: same verdict.

    NOTE [known shapes]: after a valid record has taught the shape, variants that keep
    the shape but are not records (a number where an empty list was, a 25-digit figure,
    a figure's name with digits added standing in for it) still get the whole check's
    answer, and valid variants pass.
    """
    from iolens.analysis.recordshape import ShapeCheck, record_problem

    good: dict[str, Any] = {
        "time": "2026-12-01T01:00:00.000+00:00", "t": 1.5, "elapsed_s": 1.0,
        "interval_s": 1.0, "seq": 0,
        "devices": {"sda": {"util": 12.5, "r_s": 3.0}}, "cpu": {"user": 1.0},
        "job": {"pids": 2, "roles": {"main": {"pids": 1, "cpu_pct": 9.0}}},
        "gpu": [{"index": 0, "util_pct": 40.0, "pids": []}],
    }
    variants = [
        json.dumps(good).replace('"pids": []', '"pids": [7]'),  # valid, shape of the empty list?
        json.dumps(good).replace('"gpu": [{', '"gpu": [5, {'),  # not an object
        json.dumps(good).replace('"util": 12.5', '"util": 1234567890123456789012345'),
        json.dumps(good).replace('"util": 12.5', '"util": 18446744073709551616'),
        json.dumps(good).replace('"seq": 0', '"seq": 42'),  # valid
        json.dumps(good).replace('"sda"', '"sda1"'),  # valid: a device's name
        json.dumps({**good, "gpu": []}),
        json.dumps({**good, "gpu": [5]}),
    ]
    for first in (json.dumps(good), json.dumps({**good, "gpu": []})):
        check = ShapeCheck()
        assert check.problem(first.encode(), json.loads(first)) is None
        for line in variants:
            rec = json.loads(line)
            assert check.problem(line.encode(), rec) == record_problem(rec), line
    # A record with a name this version does not know teaches no shape.
    odd = {**good, "t1": 5}
    check = ShapeCheck()
    assert check.problem(json.dumps(odd).encode(), odd) is None and not check.known
