"""The /proc and /sys parsers on fixture text, one test per branch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from iolens import StatsUnavailableError
from iolens.sources.counters import TIME_MOD
from iolens.sources.diskstats import (
    DiskstatsParser,
    DiskstatsReader,
    parse_diskstats,
    parse_diskstats_line,
    parse_stat_file,
)
from iolens.sources.sysblock import SysBlockReader, guess_topology, read_topology
from iolens.sources.uptime import UptimeReader, parse_uptime_cs

LINE_20 = (" 254       0 vda 5104 3065 359530 1034 304 1333 13656 157 0 452 1313"
           " 3004 27 37488 120 4 0")
LINE_18 = "   8       0 sda 10 2 80 5 4 1 32 7 1 9 12 3 1 24 2"
LINE_14 = "   8      16 sdb 10 2 80 5 4 1 32 7 0 9 12"


def test_20_token_line_has_flushes() -> None:
    rec = parse_diskstats_line(LINE_20)
    assert not isinstance(rec, str) and rec is not None
    assert (rec.major, rec.minor, rec.name) == (254, 0, "vda")
    assert (rec.reads, rec.reads_merged, rec.sectors_read, rec.read_ms) == (
        5104, 3065, 359530, 1034)
    assert (rec.writes, rec.writes_merged, rec.sectors_written, rec.write_ms) == (
        304, 1333, 13656, 157)
    assert (rec.in_flight, rec.io_ms, rec.weighted_ms) == (0, 452, 1313)
    assert (rec.discards, rec.discards_merged, rec.sectors_discarded, rec.discard_ms) == (
        3004, 27, 37488, 120)
    assert (rec.flushes, rec.flush_ms, rec.fields) == (4, 0, 17)


def test_18_token_line_has_discards_but_no_flushes() -> None:
    rec = parse_diskstats_line(LINE_18)
    assert not isinstance(rec, str) and rec is not None
    assert (rec.discards, rec.sectors_discarded, rec.discard_ms) == (3, 24, 2)
    assert (rec.flushes, rec.flush_ms, rec.fields) == (0, 0, 15)


def test_14_token_line_has_neither() -> None:
    rec = parse_diskstats_line(LINE_14)
    assert not isinstance(rec, str) and rec is not None
    assert (rec.discards, rec.flushes, rec.fields) == (0, 0, 11)
    assert rec.weighted_ms == 12


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("   8    1 sda1 10 20 30 40", "old"),
        ("   8    1 sda1 10 20 30", "malformed"),
        ("8 0 sda 1 2 3 4 5 6 7 8 9 x 11", "malformed"),
        ("8 0 sda 1 2 3 4 5 6 7 8 9 -1 11", "malformed"),
        ("eight 0 sda 1 2 3 4 5 6 7 8 9 10 11", "malformed"),
    ],
)
def test_unusable_lines_give_a_reason(line: str, reason: str) -> None:
    assert parse_diskstats_line(line) == reason


def test_blank_line_is_nothing() -> None:
    assert parse_diskstats_line("   \n") is None


def test_time_fields_are_32_bit_and_counts_64_bit() -> None:
    rec = parse_diskstats_line(f"8 0 sda {2**64 + 5} 0 0 {TIME_MOD + 7} 0 0 0 0 0 {TIME_MOD} 3")
    assert not isinstance(rec, str) and rec is not None
    assert rec.reads == 5 and rec.read_ms == 7 and rec.io_ms == 0 and rec.weighted_ms == 3


def test_newer_kernels_extra_fields_are_ignored() -> None:
    rec = parse_diskstats_line(LINE_20 + " 99 98")
    assert not isinstance(rec, str) and rec is not None
    assert rec.flushes == 4 and rec.fields == 17


def test_whole_file_counts_what_it_skips() -> None:
    text = "\n".join([LINE_20, "garbage", "   8    1 sda1 10 20 30 40", "", LINE_14]) + "\n"
    result = parse_diskstats(text)
    assert list(result.devices) == ["vda", "sdb"]
    assert (result.skipped_lines, result.old_format_lines) == (1, 1)


def test_parser_cache_returns_same_record_for_unchanged_line() -> None:
    parser = DiskstatsParser()
    first = parser.parse(LINE_20 + "\n" + LINE_14)
    second = parser.parse(LINE_20 + "\n" + LINE_14.replace(" 12", " 13"))
    assert second.devices["vda"] is first.devices["vda"]
    assert second.devices["sdb"].weighted_ms == 13


def test_stat_file_formats() -> None:
    eleven = parse_stat_file("sdb", "      10        2       80        5        4        1"
                                    "       32        7        0        9       12\n")
    assert eleven is not None and eleven.fields == 11 and eleven.weighted_ms == 12
    assert parse_stat_file("x", "garbage") is None
    assert parse_stat_file("x", "1 2 3 4") is None


@pytest.mark.parametrize(
    ("text", "cs"),
    [("12345.67 999.00\n", 1234567), ("0.00 0.00", 0), ("1000.5 3", 100005), ("77 1", 7700)],
)
def test_uptime_is_read_as_sysstat_does(text: str, cs: int) -> None:
    assert parse_uptime_cs(text) == cs


@pytest.mark.parametrize("text", ["", "abc 1", "12.x 3", "-5.00 1"])
def test_bad_uptime_raises(text: str) -> None:
    with pytest.raises(ValueError, match="uptime"):
        parse_uptime_cs(text)


def test_readers_reread_the_open_file(tmp_path: Path) -> None:
    (tmp_path / "diskstats").write_text(LINE_14 + "\n")
    (tmp_path / "uptime").write_text("10.00 1.00\n")
    reader, clock = DiskstatsReader(str(tmp_path)), UptimeReader(str(tmp_path))
    assert reader.read().devices["sdb"].reads == 10
    assert clock.read_cs() == 1000
    # Rewritten in place (same inode, as the kernel's files are): the open descriptor sees it.
    with open(tmp_path / "diskstats", "r+") as fh:
        fh.write(LINE_14.replace("sdb 10", "sdb 11"))
    (tmp_path / "uptime").write_text("11.00 1.00\n")
    assert reader.read().devices["sdb"].reads == 11
    assert clock.read_cs() == 1100
    reader.close()
    reader.close()


def test_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StatsUnavailableError, match=r"cannot read .*diskstats \(No such file"):
        DiskstatsReader(str(tmp_path)).read()


def test_reader_handles_files_longer_than_one_chunk(tmp_path: Path) -> None:
    lines = [f"   7 {i:7d} loop{i} 1 0 8 0 0 0 0 0 0 1 1 0 0 0 0 0 0" for i in range(2000)]
    (tmp_path / "diskstats").write_text("\n".join(lines) + "\n")
    assert len(DiskstatsReader(str(tmp_path)).read().devices) == 2000


def make_sys(root: Path) -> Path:
    block = root / "block"
    for disk, parts in {"sda": ["sda1", "sda2"], "nvme0n1": ["nvme0n1p1"], "cciss!c0d0": [],
                        "loop0": []}.items():
        (block / disk).mkdir(parents=True)
        (block / disk / "stat").write_text("1 0 8 0 0 0 0 0 0 1 1\n")
        (block / disk / "dev").write_text("8:0\n")
        for part in parts:
            (block / disk / part).mkdir()
            (block / disk / part / "partition").write_text("1\n")
            (block / disk / part / "stat").write_text("2 0 16 0 0 0 0 0 0 1 1\n")
    return root


def test_topology_from_sysfs(tmp_path: Path) -> None:
    topo = read_topology(str(make_sys(tmp_path)))
    assert topo is not None
    assert topo.disks == {"sda", "nvme0n1", "cciss/c0d0", "loop0"}
    assert topo.parent == {"sda1": "sda", "sda2": "sda", "nvme0n1p1": "nvme0n1"}
    assert read_topology(str(tmp_path / "nothing")) is None


def test_sysblock_reader_reads_disks_and_partitions(tmp_path: Path) -> None:
    reader = SysBlockReader(str(make_sys(tmp_path)))
    result = reader.read()
    assert set(result.devices) == {"sda", "sda1", "sda2", "nvme0n1", "nvme0n1p1", "cciss/c0d0",
                                   "loop0"}
    assert result.devices["sda1"].reads == 2 and result.devices["sda"].major == 8
    # A device that vanishes is dropped on the next read.
    import shutil

    shutil.rmtree(tmp_path / "block" / "loop0")
    assert "loop0" not in reader.read().devices
    reader.close()


def test_guessed_topology_from_names() -> None:
    text = "\n".join(
        f"{maj} {mi} {name} 1 0 8 0 0 0 0 0 0 1 1"
        for maj, mi, name in [(8, 0, "sda"), (8, 1, "sda1"), (8, 16, "sdb"), (259, 0, "nvme0n1"),
                              (259, 1, "nvme0n1p1"), (179, 0, "mmcblk0"), (179, 1, "mmcblk0p1"),
                              (7, 0, "loop0"), (7, 1, "loop1"), (7, 10, "loop10"),
                              (7, 11, "loop1p1"), (253, 0, "dm-0"),
                              (253, 1, "dm-1")]
    )
    topo = guess_topology(parse_diskstats(text).devices)
    assert topo.parent == {"sda1": "sda", "nvme0n1p1": "nvme0n1", "mmcblk0p1": "mmcblk0",
                           "loop1p1": "loop1"}
    assert {"loop1", "loop10", "dm-1"} <= topo.disks


def test_procfs_files_longer_than_one_page_are_read_whole() -> None:
    from iolens.sources._files import PreadFile

    path = "/proc/kallsyms" if os.access("/proc/kallsyms", os.R_OK) else "/proc/self/mountinfo"
    with open(path) as fh:
        expected = len(fh.read())
    assert len(PreadFile(path).read()) == expected


def test_endless_file_is_refused() -> None:
    from iolens.sources._files import PreadFile, read_text

    with pytest.raises(StatsUnavailableError, match="larger than 16 MiB"):
        PreadFile("/dev/zero").read()
    with pytest.raises(StatsUnavailableError, match="larger than 16 MiB"):
        read_text("/dev/zero")
