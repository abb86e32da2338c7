"""The machine's pace for Python's own work (NOTE [the machine's pace] in
iolens/recorder/pace.py): timed on the thread's CPU clock, at most once a second through a
run, its median kept with a bounded number of measurements."""

from __future__ import annotations

import gc

import pytest

from iolens.recorder import pace as pace_mod
from iolens.recorder.pace import PaceClock, python_pace


def test_the_pace_is_a_few_milliseconds_at_most_and_leaves_the_collector_as_it_was() -> None:
    took = python_pace(3)
    assert took is not None and 0 < took < 0.005
    assert gc.isenabled()
    gc.disable()
    try:
        python_pace(1)
        assert not gc.isenabled()  # (not turned on behind the caller's back)
    finally:
        gc.enable()


def test_the_clock_measures_once_a_period_and_gives_the_median(
        monkeypatch: pytest.MonkeyPatch) -> None:
    paces = iter([3.0, 1.0, 2.0, 5.0])
    monkeypatch.setattr(pace_mod, "python_pace", lambda *rounds: next(paces))
    clock = PaceClock(every_s=1.0)
    assert clock.seconds() is None
    for now in (0.0, 0.4, 0.9, 1.0, 1.5, 2.2):  # due at 0, then 1.0, then 2.2
        clock.tick(now)
    assert clock.paces == [3.0, 1.0, 2.0] and clock.seconds() == 2.0
    clock.tick(3.5)
    assert clock.seconds() == 2.5  # (an even count: the mean of the middle two)


def test_a_long_run_keeps_a_bounded_even_spread_of_paces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = PaceClock(every_s=1.0)
    monkeypatch.setattr(pace_mod, "python_pace", lambda *rounds: float(len(clock.paces)))
    for second in range(10 * pace_mod.KEEP):
        clock.tick(float(second))
    assert len(clock.paces) < pace_mod.KEEP
    assert clock.every_s > 1.0  # it measures less often as the run grows


def test_a_clock_too_coarse_to_time_the_work_gives_no_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pace_mod, "python_pace", lambda *rounds: None)
    clock = PaceClock()
    clock.tick(0.0)
    assert clock.paces == [] and clock.seconds() is None
