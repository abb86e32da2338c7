"""Rates from two snapshots: each formula of METRICS.md on hand-computed figures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iolens import DiskCounters, DiskSnapshot, device_rates, snapshot_rates
from iolens.core.rates import interval_cs, was_reset
from iolens.sources.counters import COUNT_MOD, TIME_MOD


def dc(name: str = "sda", **kw: int) -> DiskCounters:
    base = dict.fromkeys(
        ["reads", "reads_merged", "sectors_read", "read_ms", "writes", "writes_merged",
         "sectors_written", "write_ms", "in_flight", "io_ms", "weighted_ms"], 0)
    base.update(kw)
    return DiskCounters(8, 0, name, **base)


def test_every_column_on_a_worked_example() -> None:
    prev = dc(reads=100, reads_merged=10, sectors_read=1000, read_ms=500, writes=50,
              writes_merged=50, sectors_written=800, write_ms=300, io_ms=1000, weighted_ms=2000,
              discards=1, discards_merged=0, sectors_discarded=8, discard_ms=1, flushes=2,
              flush_ms=4)
    cur = dc(reads=300, reads_merged=60, sectors_read=3048, read_ms=1500, writes=150,
             writes_merged=150, sectors_written=2848, write_ms=1100, io_ms=1800, weighted_ms=5000,
             discards=5, discards_merged=4, sectors_discarded=4104, discard_ms=9, flushes=12,
             flush_ms=24)
    r = device_rates(prev, cur, 200)  # 2 seconds
    assert (r.r_s, r.rkB_s, r.rrqm_s) == (100.0, 512.0, 25.0)
    assert r.rrqm_pct == pytest.approx(20.0)  # 50 merged of 250 requests
    assert r.r_await == 5.0 and r.rareq_sz == 5.12
    assert (r.w_s, r.wkB_s, r.wrqm_s, r.wrqm_pct) == (50.0, 512.0, 50.0, 50.0)
    assert r.w_await == 8.0 and r.wareq_sz == 10.24
    assert (r.d_s, r.dkB_s, r.drqm_s, r.drqm_pct) == (2.0, 1024.0, 2.0, 50.0)
    assert r.d_await == 2.0 and r.dareq_sz == 512.0
    assert (r.f_s, r.f_await) == (5.0, 2.0)
    assert r.aqu_sz == 1.5 and r.avgqu_sz == 1.5
    assert r.util == 40.0
    assert r.rMB_s == 0.5 and r.wMB_s == 0.5 and r.dMB_s == 1.0
    # The seed article's older fields.
    assert r.tps == 152.0
    assert r.avgrq_sz == pytest.approx(4096 / 300)
    assert r.await_ms == pytest.approx(1800 / 300)
    assert r.svctm == pytest.approx(800 / 300)
    assert not r.reset


def test_no_io_gives_zeros_not_errors() -> None:
    r = device_rates(dc(), dc(), 100)
    assert all(getattr(r, f) == 0.0 for f in ("r_await", "rareq_sz", "rrqm_pct", "f_await",
                                              "await_ms", "svctm", "util"))


def test_32_bit_time_wrap_gives_the_true_delta() -> None:
    prev = dc(reads=10, read_ms=TIME_MOD - 100, io_ms=TIME_MOD - 10, weighted_ms=TIME_MOD - 1)
    cur = dc(reads=20, read_ms=100, io_ms=90, weighted_ms=999)
    r = device_rates(prev, cur, 100)
    assert r.r_await == 20.0 and r.util == 10.0 and r.aqu_sz == 1.0


def test_64_bit_count_wrap() -> None:
    # Written sectors still grow, so this is a wrap, not a reset.
    r = device_rates(dc(reads=COUNT_MOD - 5, sectors_read=COUNT_MOD - 40, sectors_written=100),
                     dc(reads=5, sectors_read=40, sectors_written=200), 100)
    assert r.r_s == 10.0 and r.rkB_s == 40.0 and not r.reset


def test_wrap_of_every_count_looks_like_a_reset_as_in_iostat() -> None:
    r = device_rates(dc(reads=COUNT_MOD - 5, sectors_read=COUNT_MOD - 40),
                     dc(reads=5, sectors_read=40), 100)
    assert r.reset and r.r_s == 5.0


def test_reset_compares_against_zeros() -> None:
    prev = dc(reads=500, sectors_read=4000, io_ms=60)
    cur = dc(reads=20, sectors_read=160, io_ms=5)
    assert was_reset(prev, cur)
    r = device_rates(prev, cur, 200)
    assert r.reset and r.r_s == 10.0 and r.rkB_s == 40.0


def test_fewer_ios_but_more_sectors_is_not_a_reset() -> None:
    assert not was_reset(dc(reads=500, sectors_read=10), dc(reads=20, sectors_read=160))


def test_new_device_is_compared_against_zeros() -> None:
    r = device_rates(None, dc(reads=50, sectors_read=100), 100)
    assert r.r_s == 50.0 and not r.reset


def test_snapshot_rates_new_vanished_and_order() -> None:
    prev = DiskSnapshot(1000, {"sda": dc(reads=1), "sdb": dc("sdb", reads=1)})
    cur = DiskSnapshot(1100, {"sdc": dc("sdc", reads=4), "sda": dc(reads=3)})
    rates = snapshot_rates(prev, cur)
    assert list(rates) == ["sdc", "sda"]
    assert rates["sda"].r_s == 2.0 and rates["sdc"].r_s == 4.0


def test_first_report_is_since_boot() -> None:
    cur = DiskSnapshot(50000, {"sda": dc(reads=1000)})
    assert snapshot_rates(DiskSnapshot.zero(), cur)["sda"].r_s == 2.0


def test_interval_zero_counts_as_one_and_backwards_raises() -> None:
    a, b = DiskSnapshot(500, {}), DiskSnapshot(400, {})
    assert interval_cs(a, a) == 1
    with pytest.raises(ValueError, match="backwards"):
        interval_cs(a, b)


values = st.integers(min_value=0, max_value=COUNT_MOD - 1)
times = st.integers(min_value=0, max_value=TIME_MOD - 1)


@st.composite
def counters(draw: st.DrawFn) -> DiskCounters:
    return DiskCounters(8, 0, "sda", draw(values), draw(values), draw(values), draw(times),
                        draw(values), draw(values), draw(values), draw(times), draw(values),
                        draw(times), draw(times), draw(values), draw(values), draw(values),
                        draw(times), draw(values), draw(times))


@settings(max_examples=400, deadline=None)
@given(prev=counters(), cur=counters(), itv=st.integers(min_value=1, max_value=10**12))
def test_rates_never_raise_never_negative_never_nan(prev: DiskCounters, cur: DiskCounters,
                                                    itv: int) -> None:
    r = device_rates(prev, cur, itv)
    for name in r.__dataclass_fields__:
        value = getattr(r, name)
        if isinstance(value, float):
            assert math.isfinite(value) and value >= 0.0, (name, value)


@settings(max_examples=200, deadline=None)
@given(prev=counters(), growth=st.lists(st.integers(min_value=0, max_value=10**9), min_size=17,
                                        max_size=17), itv=st.integers(min_value=1, max_value=10**6))
def test_growing_counters_give_the_plain_formulas(prev: DiskCounters, growth: list[int],
                                                  itv: int) -> None:
    cur = DiskCounters(8, 0, "sda", prev.reads + growth[0], prev.reads_merged + growth[1],
                       prev.sectors_read + growth[2], prev.read_ms + growth[3],
                       prev.writes + growth[4], prev.writes_merged + growth[5],
                       prev.sectors_written + growth[6], prev.write_ms + growth[7], 0,
                       prev.io_ms + growth[9], prev.weighted_ms + growth[10],
                       prev.discards + growth[11], prev.discards_merged + growth[12],
                       prev.sectors_discarded + growth[13], prev.discard_ms + growth[14],
                       prev.flushes + growth[15], prev.flush_ms + growth[16])
    # Values past the kernel's widths wrap exactly as the kernel's would.
    cur = DiskCounters(*[
        getattr(cur, f) % (TIME_MOD if f.endswith("_ms") else COUNT_MOD)
        if f not in ("major", "minor", "name", "fields") else getattr(cur, f)
        for f in DiskCounters.__dataclass_fields__
    ])
    r = device_rates(prev, cur, itv)
    if r.reset:
        return
    assert r.r_s == pytest.approx(growth[0] / itv * 100)
    assert r.rkB_s == pytest.approx(growth[2] / itv * 100 / 2)
    assert r.util == pytest.approx(growth[9] / itv * 100 / 10)
    assert r.r_await == (pytest.approx(growth[3] / growth[0]) if growth[0] else 0.0)


@settings(max_examples=100, deadline=None)
@given(rec=counters(), itv=st.integers(min_value=1, max_value=10**6))
def test_idle_fast_path_equals_the_full_computation(rec: DiskCounters, itv: int) -> None:
    import copy

    assert device_rates(rec, rec, itv) == device_rates(copy.copy(rec), rec, itv)
