"""iolens iostat against sysstat's iostat on the same counters, digit for digit.

Real iostat runs in a private mount namespace where /proc/uptime,
/proc/diskstats and /sys/block are fixtures (see kernelfake.FedIostat);
iolens replays the same snapshots. Every line after the banner must match.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernelfake import FakeDevice, FakeSnapshot, FedIostat, counters, write_snapshot_dir


def iolens_replay(tmp_path: Path, snaps: list[FakeSnapshot], args: list[str]) -> str:
    dirs = [str(write_snapshot_dir(s, tmp_path / f"snap{i}")) for i, s in enumerate(snaps)]
    proc = subprocess.run(
        [sys.executable, "-m", "iolens", "iostat", *args, "--replay", *dirs],
        capture_output=True, text=True, check=False, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def compare(tmp_path: Path, snaps: list[FakeSnapshot], args: list[str],
            iolens_args: list[str] | None = None) -> str:
    expected = FedIostat(tmp_path / "fed", snaps).run(args)
    got = iolens_replay(tmp_path, snaps, iolens_args if iolens_args is not None else args)
    exp_banner, _, exp_body = expected.partition("\n")
    got_banner, _, got_body = got.partition("\n")
    # The banner holds today's date in both; compare all but the date.
    assert exp_banner.split("\t")[0] == got_banner.split("\t")[0]
    assert exp_banner.split("\t")[2:] == got_banner.split("\t")[2:]
    assert got_body == exp_body
    return expected


def disk(major: int, minor: int, name: str, nfields: int = 17, parent: str | None = None,
         **kw: int) -> FakeDevice:
    return FakeDevice(major, minor, name, counters(**kw), nfields, parent)


def machine(t: int, nfields: int = 17) -> FakeSnapshot:
    """A small machine after t seconds of work: a busy disk with partitions, an SSD, idle loops."""
    return FakeSnapshot(
        uptime=f"{1000 + 2 * t}.{(37 * t) % 100:02d}",
        devices=[
            disk(7, 0, "loop0", nfields),
            disk(7, 1, "loop1", nfields, rd=12 + t, rd_s=96 + 8 * t, rd_t=3 + t, io_t=4 + t,
                 rq_t=4 + t),
            disk(8, 0, "sda", nfields, rd=5000 + 913 * t, rd_m=100 + 41 * t, rd_s=80000 + 12345 * t,
                 rd_t=9000 + 2777 * t, wr=300 + 77 * t, wr_m=20 + 9 * t, wr_s=4000 + 999 * t,
                 wr_t=700 + 333 * t, inflight=t % 3, io_t=20000 + 1601 * t, rq_t=30000 + 4711 * t,
                 dc=3 + t, dc_m=1, dc_s=800 + 160 * t, dc_t=2 + t, fl=40 + 7 * t, fl_t=90 + 3 * t),
            disk(8, 1, "sda1", nfields, parent="sda", rd=4000 + 900 * t, rd_s=70000 + 12000 * t,
                 rd_t=8000 + 2700 * t, wr=250 + 70 * t, wr_s=3500 + 900 * t, wr_t=600 + 300 * t,
                 io_t=19000 + 1500 * t, rq_t=29000 + 4600 * t),
            disk(8, 2, "sda2", nfields, parent="sda"),
            disk(259, 0, "nvme0n1", nfields, rd=10**6 + 52345 * t, rd_m=17 * t,
                 rd_s=2 * 10**7 + 6_400_000 * t, rd_t=50000 + 9999 * t, wr=777 * t,
                 wr_s=7770 * t, wr_t=131 * t, io_t=7000 + 999 * t, rq_t=60000 + 12000 * t),
        ],
    )


SCENARIO_FLAGS = [
    pytest.param([], id="default"),
    pytest.param(["-m"], id="m"),
    pytest.param(["-z"], id="z"),
    pytest.param(["-y"], id="y"),
    pytest.param(["-p", "ALL"], id="p-ALL"),
    pytest.param(["-p"], id="p-bare"),
    pytest.param(["-m", "-z", "-p", "ALL"], id="m-z-p"),
    pytest.param(["ALL"], id="ALL"),
    pytest.param(["sda", "loop0"], id="named"),
    pytest.param(["-p", "sda"], id="p-named"),
]


@pytest.mark.usefixtures("iostat_ns")
@pytest.mark.parametrize("flags", SCENARIO_FLAGS)
def test_modes_on_kernel_5_5(tmp_path: Path, flags: list[str]) -> None:
    compare(tmp_path, [machine(t) for t in range(3)], flags)


@pytest.mark.usefixtures("iostat_ns")
@pytest.mark.parametrize("nfields", [11, 15, 17], ids=["14-token", "18-token", "20-token"])
@pytest.mark.parametrize("flags", [[], ["-p", "ALL"]], ids=["sysfs", "diskstats"])
def test_kernel_line_formats(tmp_path: Path, nfields: int, flags: list[str]) -> None:
    out = compare(tmp_path, [machine(t, nfields) for t in range(3)], flags)
    assert "sda" in out


@pytest.mark.usefixtures("iostat_ns")
@pytest.mark.parametrize("flags", [[], ["-p", "ALL"]], ids=["sysfs", "diskstats"])
def test_32bit_time_wrap(tmp_path: Path, flags: list[str]) -> None:
    near = 2**32 - 500
    snaps = [
        FakeSnapshot("500.00", [disk(8, 0, "sda", rd=100, rd_s=800, rd_t=near, wr=10, wr_s=80,
                                     wr_t=near, io_t=near, rq_t=near, fl=1, fl_t=near)]),
        FakeSnapshot("501.00", [disk(8, 0, "sda", rd=200, rd_s=1600, rd_t=300, wr=20, wr_s=160,
                                     wr_t=100, io_t=400, rq_t=1200, fl=3, fl_t=20)]),
    ]
    out = compare(tmp_path, snaps, flags)
    # 800 ms of reads over 100 reads: the wrapped delta, not 4 billion.
    assert "   8.00" in out


@pytest.mark.usefixtures("iostat_ns")
@pytest.mark.parametrize("flags", [[], ["-p", "ALL"]], ids=["sysfs", "diskstats"])
def test_reset_new_and_vanished_devices(tmp_path: Path, flags: list[str]) -> None:
    snaps = [
        FakeSnapshot("100.00", [disk(8, 0, "sda", rd=500, rd_s=4000, rd_t=50, io_t=60, rq_t=70),
                                disk(8, 16, "sdb", rd=50, rd_s=400, io_t=5, rq_t=5)]),
        # sda re-registered: every counter went back.
        FakeSnapshot("102.00", [disk(8, 0, "sda", rd=20, rd_s=160, rd_t=4, io_t=5, rq_t=6),
                                disk(8, 16, "sdb", rd=90, rd_s=720, io_t=9, rq_t=9),
                                disk(8, 32, "sdc", rd=7, rd_s=56, io_t=1, rq_t=1)]),
        # sdb vanished; sdc is new since the last report.
        FakeSnapshot("104.00", [disk(8, 0, "sda", rd=60, rd_s=480, rd_t=12, io_t=15, rq_t=16),
                                disk(8, 32, "sdc", rd=9, rd_s=72, io_t=2, rq_t=2)]),
    ]
    compare(tmp_path, snaps, flags)


@pytest.mark.usefixtures("iostat_ns")
@pytest.mark.parametrize("flags", [["-z"], ["-z", "-p", "ALL"], []], ids=["z", "z-p", "plain"])
def test_zero_io_interval_and_zero_length_interval(tmp_path: Path, flags: list[str]) -> None:
    busy = machine(1)
    same_time = FakeSnapshot(busy.uptime, busy.devices)  # uptime did not move: interval 1 cs
    compare(tmp_path, [machine(0), busy, same_time, machine(2)], flags)


@pytest.mark.usefixtures("iostat_ns")
def test_malformed_and_old_lines_are_skipped_like_iostat(tmp_path: Path) -> None:
    snaps = [machine(t) for t in range(3)]
    for s in snaps:
        s.extra_diskstats_lines = [
            "   8      3 sda3 10 20 30 40",  # pre-2.6.25 partition line
            "   8      4 sda4 1 2 3",  # truncated
            "garbage line",
        ]
    compare(tmp_path, snaps, ["-p", "ALL"])


@pytest.mark.usefixtures("iostat_ns")
@pytest.mark.parametrize("flags", [[], ["-p", "ALL"], ["-m"]], ids=["sysfs", "diskstats", "m"])
def test_long_names_slashes_and_wide_values(tmp_path: Path, flags: list[str]) -> None:
    def snap(t: int) -> FakeSnapshot:
        return FakeSnapshot(f"{50 + t}.00", [
            disk(104, 0, "cciss/c0d0", rd=10 + 5 * t, rd_s=80 + 40 * t, io_t=3 * t, rq_t=3 * t),
            disk(252, 0, "a-very-long-device-name-0", rd=1 + t, rd_s=8 * t, io_t=t, rq_t=t),
            disk(8, 0, "sda", rd=10**12 + 10**11 * t, rd_s=10**14 + 10**13 * t,
                 rd_t=10**9 + 1000 * t, io_t=100 * t, rq_t=10**9 + 10**8 * t),
        ])
    compare(tmp_path, [snap(t) for t in range(3)], flags)


@pytest.mark.usefixtures("iostat_ns")
@pytest.mark.parametrize("seed", range(4))
def test_random_counters(tmp_path: Path, seed: int) -> None:
    """Random growth of every counter: catches rounding differences on ties."""
    rng = random.Random(seed)
    names = [(8, 0, "sda"), (8, 16, "sdb"), (253, 0, "dm-0"), (259, 0, "nvme0n1")]
    state = {n: [rng.randrange(0, 10**6) for _ in range(17)] for _, _, n in names}
    uptime_cs = rng.randrange(10**4, 10**7)
    snaps = []
    for _ in range(4):
        uptime_cs += rng.choice([1, 7, 100, 101, 199, 200, 333, 1000])
        devs = []
        for major, minor, name in names:
            vals = state[name]
            for i in range(17):
                if i == 8:
                    vals[i] = rng.randrange(0, 64)
                elif rng.random() < 0.8:
                    vals[i] += rng.choice([0, 1, 2, 3, 5, 8, rng.randrange(0, 10**5)])
            devs.append(FakeDevice(major, minor, name, list(vals)))
        snaps.append(FakeSnapshot(f"{uptime_cs // 100}.{uptime_cs % 100:02d}", devs))
    compare(tmp_path, snaps, rng.choice([[], ["-m"], ["-p", "ALL"], ["-z"]]))


@pytest.mark.usefixtures("iostat_ns")
def test_live_counters_from_this_kernel(tmp_path: Path) -> None:
    """Real /proc/diskstats and /proc/uptime text, taken while this machine does I/O."""
    import os
    import time

    snaps = []
    for i in range(3):
        uptime = Path("/proc/uptime").read_text().split()[0]
        text = Path("/proc/diskstats").read_text()
        devices = []
        for line in text.splitlines():
            tok = line.split()
            devices.append(FakeDevice(int(tok[0]), int(tok[1]), tok[2],
                                      [int(v) for v in tok[3:]], len(tok) - 3))
        snaps.append(FakeSnapshot(uptime, devices))
        with open(tmp_path / f"load{i}", "wb") as fh:
            fh.write(os.urandom(1 << 20))
            fh.flush()
            os.fsync(fh.fileno())
        time.sleep(0.3)
    for flags in ([], ["-p", "ALL"]):
        compare(tmp_path / f"cmp{len(flags)}", snaps, flags)
