"""`iolens compare`: the block bootstrap, the --fail-on gate, the JSON object, real runs."""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys
import textwrap
from array import array
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis import compare as C
from iolens.analysis import rules
from iolens.analysis.compare import blocks as C_blocks
from iolens.analysis.proof import _released
from iolens.analysis.rundata import load_run
from iolens.analysis.verdict import Verdict
from iolens.rundir import records as trecords
from iolens.rundir.timing import TimingReader, TrainingAggregator
from tests.test_report import write_run
from tests.test_verdict import dev, rec


def iolens(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "iolens", *args], capture_output=True,
                          text=True, timeout=300, check=False, cwd=cwd)


def series(n: int, seed: int, *, scale: float = 1.0, phi: float = 0.0, sd: float = 0.1,
           wait: float = 0.3) -> C.BatchSamples:
    """``n`` batches of about 10 ms * scale, log-normal noise, AR(1) with ``phi`` in time."""
    r = random.Random(seed)
    x = 0.0
    steps, waits = [], []
    for _ in range(n):
        x = phi * x + r.gauss(0, sd * math.sqrt(1 - phi * phi))
        s = int(1e7 * scale * math.exp(x))
        steps.append(s)
        waits.append(int(s * wait * (0.5 + r.random())))
    return C.BatchSamples(steps, waits, n)


def by_id(results: list[C.MetricResult], mid: str) -> C.MetricResult:
    return next(m for m in results if m.spec.id == mid)


# -- the statistics ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4, 5, 19, 20, 24, 25, 100, 1000, 40_000, 1_000_000])
def test_blocks_are_contiguous_equal_and_bounded(n: int) -> None:
    bounds = C.block_bounds(n)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert min(n, C.MIN_BLOCKS) <= len(bounds) <= C.MAX_BLOCKS
    if n >= 25:
        assert min(sizes) >= math.floor(math.sqrt(n)) - 1  # about sqrt(n) per block


def test_fast_median_is_the_median_of_the_resample() -> None:
    r = random.Random(7)
    for n in (30, 700, 5000):
        values = [r.choice((r.randrange(100), r.randrange(10**6))) for _ in range(n)]
        bounds = C.block_bounds(n)
        med = C.Median(values, bounds)
        assert med.value() == sorted(values)[math.ceil(n / 2) - 1]
        for _ in range(50):
            picks = r.choices(range(len(bounds)), k=len(bounds))
            pooled = sorted(v for i in picks for v in values[bounds[i][0]:bounds[i][1]])
            assert med.resampled(picks) == pooled[math.ceil(len(pooled) / 2) - 1]


def test_ratio_of_sums_on_a_resample() -> None:
    num, den = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.0] * 6
    stat = C.RatioOfSums(num, den, C.block_bounds(6))
    assert stat.value() == pytest.approx(3.5)
    assert stat.resampled([0, 0]) == pytest.approx(num[0])  # blocks of one here
    assert stat.resampled([5]) == pytest.approx(6.0)


def test_identical_runs_are_within_noise() -> None:
    s = series(500, 1)
    for m in C.compare_batches(s, s):
        assert m.real is False and m.change == 0
        assert m.ci_low is not None and m.ci_high is not None
        assert m.ci_low <= 0 <= m.ci_high
        assert m.outcome == "within-noise" and m.statement().endswith("within noise")


def test_runs_of_the_same_distribution_are_mostly_within_noise() -> None:
    real = [by_id(C.compare_batches(series(400, 2 * i), series(400, 2 * i + 1),
                                    resamples=500), "step-time").real for i in range(20)]
    assert real.count(True) <= 3  # a 95% interval: about 1 in 20 by chance


def test_a_shift_is_real_and_the_interval_holds_the_true_ratio() -> None:
    covered = 0
    for i in range(20):
        got = C.compare_batches(series(400, 2 * i), series(400, 2 * i + 1, scale=1.10),
                                resamples=500)
        step = by_id(got, "step-time")
        assert step.real and step.outcome == "worse" and step.regression is not None
        assert step.ci_low is not None and step.ci_high is not None
        covered += step.ci_low <= 10.0 <= step.ci_high
        thr = by_id(got, "throughput")
        assert thr.real and thr.outcome == "worse" and thr.change is not None
        assert thr.change < -5
    assert covered >= 16  # a 95% interval over 20 trials


def test_the_statement_says_how_much_with_the_interval() -> None:
    step = by_id(C.compare_batches(series(400, 1), series(400, 2, scale=1.25)), "step-time")
    assert step.change is not None and 20 < step.change < 30
    text = step.statement()
    assert text.startswith(f"NEW is slower by {step.change:.1f}% (95% CI +")
    assert text.endswith("): real")
    faster = by_id(C.compare_batches(series(400, 1), series(400, 2, scale=0.8)), "step-time")
    assert faster.statement().startswith("NEW is faster by") and faster.outcome == "better"


def test_small_samples_give_wide_intervals_and_tiny_ones_none() -> None:
    def width(n: int) -> float:
        m = by_id(C.compare_batches(series(n, 3), series(n, 4)), "step-time")
        assert m.ci_low is not None and m.ci_high is not None
        return m.ci_high - m.ci_low

    assert width(25) > 3 * width(2500)
    tiny = by_id(C.compare_batches(series(10, 3), series(500, 4, scale=2)), "step-time")
    assert tiny.real is None and tiny.ci_low is None and tiny.outcome == "unknown"
    assert tiny.change is not None and tiny.change > 50  # the figure is still shown
    assert "too few batches (10 in BASE, 500 in NEW" in tiny.statement()


def test_the_bootstrap_is_deterministic_given_its_seed() -> None:
    a, b = series(300, 5), series(300, 6, scale=1.02)
    one = [m.to_dict() for m in C.compare_batches(a, b)]
    two = [m.to_dict() for m in C.compare_batches(a, b)]
    assert one == two
    other = [m.to_dict() for m in C.compare_batches(a, b, seed=1)]
    assert [m["ci_low"] for m in other] != [m["ci_low"] for m in one]


def test_blocks_keep_slow_stretches_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """With neighbouring batches alike (AR(1)), resampling single batches is overconfident."""
    a, b = series(1000, 8, phi=0.9), series(1000, 9, phi=0.9)
    block = by_id(C.compare_batches(a, b, resamples=500), "step-time")
    with monkeypatch.context() as mp:
        # strata() reads block_bounds from the module that defines it
        mp.setattr(C_blocks, "block_bounds", lambda n: [(i, i + 1) for i in range(n)])
        single = by_id(C.compare_batches(a, b, resamples=500), "step-time")
    assert block.ci_low is not None and block.ci_high is not None
    assert single.ci_low is not None and single.ci_high is not None
    assert block.ci_high - block.ci_low > 2 * (single.ci_high - single.ci_low)
    false_alarms = sum(bool(by_id(C.compare_batches(series(1000, 2 * i, phi=0.9),
                                                    series(1000, 2 * i + 1, phi=0.9),
                                                    resamples=300), "step-time").real)
                       for i in range(10))
    assert false_alarms <= 3


def epochs(n: int, seed: int, *, stalls: list[float], every: int = 100) -> C.BatchSamples:
    """``n`` steady batches of about 22 ms; the batch opening epoch k takes ``stalls[k]`` s."""
    b = series(n, seed, scale=2.2, sd=0.05, wait=0.1)
    b.firsts = list(range(0, n, every))
    for k, i in enumerate(b.firsts):
        b.steps[i] = b.waits[i] = int(stalls[k] * 1e9)
    return b


def test_epoch_starts_are_resampled_apart_from_the_steady_batches() -> None:
    """Workers that start again each epoch (2.5 s) against persistent ones (the run's first
    start only): a 60% gain. Blocks that happen to hold epoch starts drawn as often as chance
    gives call it noise; the epoch starts kept as many as the run had call it real."""
    base = epochs(400, 1, stalls=[2.5, 2.5, 2.5, 2.5])
    new = epochs(400, 2, stalls=[2.5, 0.02, 0.02, 0.02])
    thr = by_id(C.compare_batches(base, new), "throughput")
    assert thr.real and thr.change is not None and thr.change > 40
    assert thr.ci_low is not None and thr.ci_high is not None
    assert thr.ci_low > 20 and thr.ci_high - thr.ci_low < 40
    base.firsts, new.firsts = [], []  # as before: epoch starts somewhere in the blocks
    blind = by_id(C.compare_batches(base, new), "throughput")
    assert blind.ci_low is not None and blind.ci_high is not None
    assert blind.ci_high - blind.ci_low > 2 * (thr.ci_high - thr.ci_low)


def test_strata_keep_every_sample_once_and_the_run_start_alone() -> None:
    st = C.strata(100, [0, 50, 99])
    assert sorted(st.order) == list(range(100))
    assert st.order[-3:] == [0, 50, 99] and st.sizes[-2:] == [1, 2]
    assert sum(st.sizes) == len(st.bounds) and st.bounds[-1][1] == 100
    # epoch starts that are most of the batches are the run's ordinary pace
    assert C.strata(10, [0, 1, 2, 4, 6, 8]) == C.strata(10)


# -- reading the timing files ----------------------------------------------------------------


def write_bin(path: Path, recs: list[tuple[int, int, int]], torn: bool = False) -> None:
    data = array("q", [x for r in recs for x in r]).tobytes()
    path.write_bytes(data + (b"\x01\x02" if torn else b""))


def test_batches_of_several_processes_merge_in_time_order(tmp_path: Path) -> None:
    tdir = tmp_path / "timing"
    tdir.mkdir()
    ep, bt = trecords.EPOCH, trecords.BATCH
    write_bin(tdir / "100.bin", [(ep, 0, 2), (bt, 10, 30), (bt, 50, 60)], torn=True)
    write_bin(tdir / "200.bin", [(ep, 5, 0), (bt, 15, 40)])
    (tdir / "200.json").write_text("{}")
    got = C.read_batches(str(tmp_path))
    assert got is not None
    assert (got.steps, got.waits, got.total, got.every) == ([30, 35, 30], [20, 25, 10], 3, 1)
    thin = C.read_batches(str(tmp_path), cap=2)
    assert thin is not None and thin.total == 3 and thin.every == 3
    assert thin.steps == [30, 35]  # the first batch of each process
    assert C.read_batches(str(tmp_path / "nothing")) is None


# -- the gate --------------------------------------------------------------------------------


def test_fail_on_parses_metrics_and_thresholds() -> None:
    got = C.parse_fail_on(["step-time:5%,data-wait:10%", "throughput:2.5%",
                           "data-wait-share:5"])
    assert [(b.metric, b.threshold, b.unit) for b in got] == [
        ("step-time", 5.0, "%"), ("data-wait", 10.0, "%"), ("throughput", 2.5, "%"),
        ("data-wait-share", 5.0, "points")]
    assert C.parse_fail_on(["data-wait-share:3pp"])[0].threshold == 3.0
    assert C.parse_fail_on([" Step-Time : 0 "])[0].text() == "step-time:0%"


@pytest.mark.parametrize("spec", ["latency:5%", "step-time", "step-time:", "step-time:-5%",
                                  "step-time:five", "step-time:5pp", "step-time:5%,",
                                  "step-time:5%,step-time:6%", ""])
def test_bad_fail_on_names_the_accepted_metrics(spec: str) -> None:
    with pytest.raises(ValueError, match=r"accepted metrics|bounded twice|not points") as exc:
        C.parse_fail_on([spec])
    if "latency" in spec:
        assert "step-time" in str(exc.value) and "data-wait-share" in str(exc.value)


def result(mid: str, change: float | None, real: bool | None, *, base: float = 1.0
           ) -> C.MetricResult:
    m = C.MetricResult(C.TRAINING_METRICS[mid], C.BATCHES, base, base, (100, 100))
    m.change, m.real = change, real
    if real is not None and change is not None:
        m.ci_low, m.ci_high = change - 1, change + 1
    return m


@pytest.mark.parametrize(("mid", "change", "real", "status"), [
    ("step-time", 20.0, True, "crossed"),
    ("step-time", 12.0, True, "passed"),       # real in the run, not beyond runs' drift
    ("step-time", 12.0, False, "passed"),      # above the bound, but noise
    ("step-time", 4.0, True, "passed"),        # real, but within the bound
    ("step-time", -30.0, True, "passed"),      # faster
    ("throughput", -12.0, True, "crossed"),    # lower throughput is the regression
    ("throughput", 12.0, True, "passed"),
    ("data-wait-share", 6.0, True, "crossed"),  # points
    ("data-wait-share", 4.0, True, "passed"),
    ("step-time", 50.0, None, "too-short"),
])
def test_a_bound_is_crossed_only_when_real_and_above(mid: str, change: float, real: bool | None,
                                                     status: str) -> None:
    bound = C.parse_fail_on([f"{mid}:5"])
    got = C.evaluate_gate([result(mid, change, real)], bound)
    assert got[0].status == status
    assert got[0].to_dict()["crossed"] is (status == "crossed")
    assert C.regressed(got) is (status == "crossed")
    assert C.regressed(got, strict=True) is (status in ("crossed", "too-short"))


def test_a_real_change_within_the_run_to_run_drift_passes_and_says_so() -> None:
    """NOTE [run-to-run noise]: a step time 12% longer with an interval of 11-13% is real
    within the two runs, yet same-configuration runs drift up to RUN_NOISE apart."""
    got = C.evaluate_gate([result("step-time", 12.0, True)], C.parse_fail_on(["step-time:5%"]))
    assert got[0].status == "passed"
    assert "within the run-to-run variation" in got[0].reason
    assert f"differ by up to {C.RUN_NOISE['step-time']:g}%" in got[0].reason


def test_a_bound_on_a_missing_figure_has_no_data() -> None:
    m = C.MetricResult(C.TRAINING_METRICS["step-time"], C.BATCHES, 0.01, None, (100, 0))
    got = C.evaluate_gate([m], C.parse_fail_on(["step-time:5%"]))
    assert got[0].status == "no-data" and "NEW" in got[0].reason


# -- the command, on constructed runs ----------------------------------------------------------


def noisy_run(folder: Path, *, n: int = 30, step: float = 0.1, seed: int = 0,
              **kw: Any) -> Path:
    r = random.Random(seed)
    recs = []
    for i in range(n):
        s = step * (1 + 0.05 * r.gauss(0, 1))
        recs.append(rec(i, step=s, wait=s * 0.3 * (1 + 0.1 * r.gauss(0, 1)),
                        devices={"vda": dev(util=40 + r.random(), r_s=100, rkb=6400,
                                            r_await=2 + r.random())}, job_read=6e6, **kw))
    return write_run(folder, recs, {"cpus": 8, "exit_code": 0})


def test_json_object_has_the_documented_fields(tmp_path: Path) -> None:
    base = noisy_run(tmp_path / "base", seed=1)
    new = noisy_run(tmp_path / "new", seed=2, step=0.13)
    out = iolens("compare", str(base), str(new), "--format", "json",
                 "--fail-on", "step-time:5%", "--fail-on", "data-wait-share:5")
    assert out.returncode == 1, out.stderr
    assert "regression: step-time:5%" in out.stderr
    o = json.loads(out.stdout)
    assert set(o) == {"compare_schema", "base", "new", "method", "metrics", "verdicts",
                      "prediction", "fail_on", "strict", "warnings", "regressed"}
    assert o["compare_schema"] == 1 and o["regressed"] is True and o["strict"] is False
    assert o["base"]["path"] == str(base) and o["new"]["intervals"] == 30
    assert o["base"]["batches"] == 300
    assert o["method"]["samples"] == C.INTERVALS and o["method"]["resamples"] == 2000
    assert set(o["base"]["distributions"]) == {"source", "step", "data_wait", "steps_per_s",
                                               "same_kind", "note"}
    assert o["base"]["samples"] == C.INTERVALS and o["base"]["distributions"]["same_kind"]
    ids = [m["id"] for m in o["metrics"]]
    assert ids == ["throughput", "step-time", "data-wait", "data-wait-share",
                   "device:vda:util", "device:vda:r_await", "device:vda:read_MBps", "job-read"]
    for m in o["metrics"]:
        assert {"id", "label", "unit", "statistic", "source", "base", "new", "samples", "change",
                "change_unit", "ci_low", "ci_high", "real", "better", "direction", "outcome",
                "statement"} <= set(m)
    step = o["metrics"][1]
    assert step["statistic"] == "mean"  # per-interval figures: no median
    assert step["real"] is True and step["outcome"] == "worse" and step["direction"] == "higher"
    assert step["change"] == pytest.approx(30, abs=5)
    assert step["ci_low"] < step["change"] < step["ci_high"]
    share = o["metrics"][3]
    assert share["unit"] == "%" and share["change_unit"] == "points"
    assert share["base"] == pytest.approx(30, abs=2)
    assert o["metrics"][4]["better"] is None
    assert o["verdicts"]["base"]["class"] == o["verdicts"]["new"]["class"]
    assert o["verdicts"]["class_changed"] is False
    gates = {g["bound"]: g for g in o["fail_on"]}
    assert gates["step-time:5%"]["status"] == "crossed"
    assert gates["data-wait-share:5"]["status"] == "passed"
    assert gates["data-wait-share:5"]["unit"] == "points"


def test_no_bound_or_a_passed_one_exits_0(tmp_path: Path) -> None:
    base = noisy_run(tmp_path / "base", seed=1)
    again = noisy_run(tmp_path / "again", seed=2)
    assert iolens("compare", str(base), str(again)).returncode == 0
    out = iolens("compare", str(base), str(again), "--fail-on", "step-time:5%,throughput:5%")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no bound crossed" in out.stdout


def test_a_run_compared_with_itself_is_told_so(tmp_path: Path) -> None:
    """The same directory twice (a copy-paste slip in a CI script) compares every figure
    with itself: the comparison says so, however the two paths are spelt."""
    run = noisy_run(tmp_path / "run", seed=1)
    (tmp_path / "link").symlink_to(run)
    out = iolens("compare", str(run), str(tmp_path / "link") + "/", "--format", "json")
    assert out.returncode == 0, out.stderr
    assert any("the same run directory" in w for w in json.loads(out.stdout)["warnings"])
    other = noisy_run(tmp_path / "other", seed=1)  # the same figures, another run
    out = iolens("compare", str(run), str(other), "--format", "json")
    assert not any("the same run directory" in w for w in json.loads(out.stdout)["warnings"])


def test_text_output_prints_run_strings_as_they_are(tmp_path: Path) -> None:
    base = noisy_run(tmp_path / "[red]base[/red]", seed=1)
    new = noisy_run(tmp_path / "new", seed=2, step=0.2)
    out = iolens("compare", str(base), str(new), "--fail-on", "step-time:5%")
    assert out.returncode == 1
    assert "[red]base[/red]" in out.stdout and "\x1b[" not in out.stdout
    assert "REGRESSED" in out.stdout and "slower by" in out.stdout
    assert "step time (mean)" in out.stdout and "vda %util" in out.stdout


def test_too_short_runs_warn_and_fail_only_when_strict(tmp_path: Path) -> None:
    base = noisy_run(tmp_path / "base", n=10, seed=1)
    new = noisy_run(tmp_path / "new", n=10, seed=2, step=0.2)
    out = iolens("compare", str(base), str(new), "--fail-on", "step-time:5%")
    assert out.returncode == 0
    assert "cannot be judged" in out.stderr and "too few timed intervals" in out.stderr
    strict = iolens("compare", str(base), str(new), "--fail-on", "step-time:5%", "--strict")
    assert strict.returncode == 1


def test_bad_input_exits_2(tmp_path: Path) -> None:
    run = noisy_run(tmp_path / "run", seed=1)
    missing = iolens("compare", str(run), str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such run directory" in missing.stderr
    both = iolens("compare", str(tmp_path / "nope1"), str(tmp_path / "nope2"))
    assert both.returncode == 2 and "nope1: no such" in both.stderr  # each wrong path told
    assert "nope2: no such" in both.stderr
    empty = write_run(tmp_path / "empty", [], {"cpus": 8})
    out = iolens("compare", str(run), str(empty))
    assert out.returncode == 2 and "empty" in out.stderr
    bad = iolens("compare", str(run), str(run), "--fail-on", "latency:5%")
    assert bad.returncode == 2 and "accepted metrics" in bad.stderr
    assert iolens("compare", str(run)).returncode == 2
    untimed = write_run(tmp_path / "untimed", [rec(i, batches=0) for i in range(30)], {})
    assert iolens("compare", str(run), str(untimed)).returncode == 0  # nothing to gate
    gated = iolens("compare", str(run), str(untimed), "--fail-on", "step-time:5%",
                   "--allow-failed")
    assert gated.returncode == 2 and "not measured in NEW" in gated.stderr


def test_a_crossed_bound_wins_over_one_that_cannot_be_judged() -> None:
    bounds = C.parse_fail_on(["step-time:5%,data-wait:5%"])
    lacking = C.MetricResult(C.TRAINING_METRICS["data-wait"], C.BATCHES, 0.01, None, (100, 0))
    crossed = C.evaluate_gate([result("step-time", 20.0, True), lacking], bounds)
    assert [g.status for g in crossed] == ["crossed", "no-data"]
    assert C.gate_exit(crossed) == 1 and C.gate_exit(crossed, strict=True) == 1
    passed = C.evaluate_gate([result("step-time", 1.0, False), lacking], bounds)
    assert C.gate_exit(passed) == 2 and C.gate_exit(passed, strict=True) == 2
    assert C.regressed(passed, strict=True) is False  # cannot judge is not a regression
    assert C.gate_exit(passed[:1]) == 0


# -- one run with per-batch timing, one without ------------------------------------------------


def timed_run(folder: Path, *, n: int = 300, step: float = 0.08, wait: float = 0.02,
              interval_p95: float = 1.173, seed: int = 3) -> Path:
    """A run with every batch in timing/ and per-interval records whose step p95 (as a
    recorder that saw one slow batch per interval would write it) is far from the batches'."""
    folder = noisy_run(folder, seed=seed)
    lines = [json.loads(x) for x in (folder / "records.jsonl").read_text().splitlines()]
    for r in lines:
        r["train"]["step"]["p95_s"] = interval_p95
        r["train"]["data_wait"]["p95_s"] = interval_p95 / 4
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rnd = random.Random(seed)
    t = 1_000_000_000
    recs = [(trecords.EPOCH, t, 0)]
    for _ in range(n):
        s = int(step * 1e9 * (1 + 0.1 * rnd.gauss(0, 1)))
        w = int(wait * 1e9 * (0.5 + rnd.random()))
        recs.append((trecords.BATCH, t + s - w, t + s))  # called at end - wait, handed at end
        t += s
    (folder / "timing").mkdir()
    write_bin(folder / "timing" / "4242.bin", recs)
    return folder


def test_a_run_with_batches_keeps_its_own_figures_against_one_without(tmp_path: Path) -> None:
    base = timed_run(tmp_path / "base")
    new = noisy_run(tmp_path / "new", seed=2)
    rep = iolens("report", str(base), "--format", "json")
    assert rep.returncode == 0, rep.stderr
    train = json.loads(rep.stdout)["training"]
    assert train["distribution_source"] == C.BATCHES
    out = iolens("compare", str(base), str(new), "--format", "json")
    assert out.returncode == 0, out.stderr
    o = json.loads(out.stdout)
    bd = o["base"]["distributions"]
    # the figures `iolens report` gives for BASE, not the per-interval 1173 ms
    assert bd["step"]["p95_s"] == pytest.approx(train["step"]["p95_s"], abs=1e-6)
    assert bd["source"] == C.BATCHES and bd["step"]["count"] == 300 == o["base"]["batches"]
    assert o["method"]["samples"] == C.MIXED
    assert (o["base"]["samples"], o["new"]["samples"]) == (C.BATCHES, C.INTERVALS)
    assert bd["step"]["p50_s"] == pytest.approx(train["step"]["p50_s"], abs=1e-6)
    assert bd["data_wait"]["p95_s"] == pytest.approx(train["data_wait"]["p95_s"], abs=1e-6)
    assert bd["step"]["p95_s"] < 0.2
    assert o["new"]["distributions"]["source"] == C.INTERVALS
    # compared of one kind: the mean step time, BASE's over its every batch
    step = next(m for m in o["metrics"] if m["id"] == "step-time")
    assert step["statistic"] == "mean" and step["source"] == C.MIXED
    assert step["base"] == pytest.approx(train["step"]["mean_s"], abs=1e-6)
    assert step["samples"] == {"base": 300, "new": 30} and step["real"] is not None


def test_figures_of_different_kinds_say_so_next_to_them(tmp_path: Path) -> None:
    base = timed_run(tmp_path / "base")
    new = noisy_run(tmp_path / "new", seed=2)
    o = json.loads(iolens("compare", str(base), str(new), "--format", "json").stdout)
    for key in ("base", "new"):
        d = o[key]["distributions"]
        assert d["same_kind"] is False
        assert "not the same kind" in d["note"] and "NEW has no per-batch timing" in d["note"]
    assert any("NEW has no per-batch timing files" in w for w in o["warnings"])
    text = iolens("compare", str(base), str(new))
    assert text.returncode == 0, text.stderr
    flat = " ".join(text.stdout.split())
    assert "training (from BASE every batch, NEW per-interval figures;" in flat
    assert "per-interval figures: p50, p95 approximate" in flat
    assert ("note: BASE's p50 and p95 are over every batch, NEW's approximate from its "
            "per-interval figures") in flat and "not the same kind" in flat
    # two runs of one kind: no such note
    same = json.loads(iolens("compare", str(new), str(new), "--format", "json").stdout)
    assert same["new"]["distributions"]["same_kind"] is True
    assert same["new"]["distributions"]["note"] is None


def test_a_bound_a_run_cannot_give_exits_2_and_says_why(tmp_path: Path) -> None:
    base = timed_run(tmp_path / "base")
    untimed = write_run(tmp_path / "untimed", [rec(i, batches=0) for i in range(30)], {})
    out = iolens("compare", str(base), str(untimed), "--fail-on", "step-time:5%",
                 "--allow-failed")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no bound crossed" not in out.stdout + out.stderr
    assert "result: cannot judge step-time:5%" in " ".join(out.stdout.split())
    lines = [x for x in out.stderr.splitlines() if "cannot be judged" in x]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("iolens compare: step-time:5% cannot be judged: ")
    assert "not measured in NEW" in lines[0] and "no timed DataLoader batches" in lines[0]
    assert "`iolens run`" in lines[0]
    js = iolens("compare", str(base), str(untimed), "--format", "json",
                "--fail-on", "step-time:5%", "--strict", "--allow-failed")
    assert js.returncode == 2, js.stderr
    o = json.loads(js.stdout)
    assert o["fail_on"][0]["status"] == "no-data" and o["regressed"] is False
    helptext = " ".join(iolens("compare", "--help").stdout.split())
    assert "2 bad input or cannot judge" in helptext and "exits 2, unless another" in helptext


# -- real runs -------------------------------------------------------------------------------

TRAIN = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset

    class Data(Dataset):
        def __len__(self):
            return 60
        def __getitem__(self, i):
            time.sleep(float(sys.argv[1]))  # the input pipeline: 2 ms or 10 ms a sample
            return torch.zeros(4)

    for epoch in range(2):
        for x in DataLoader(Data(), batch_size=2, num_workers=0):
            time.sleep(0.005)  # the training step
""")


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("compare")
    (tmp / "train.py").write_text(TRAIN)
    runs = {}
    for name, delay in (("base", "0.002"), ("again", "0.002"), ("slow", "0.010")):
        out = iolens("run", "--interval", "0.2", "--out", name, "--no-live", "--",
                     sys.executable, "train.py", delay, cwd=tmp)
        assert out.returncode == 0, out.stderr
        runs[name] = tmp / name
    return runs


def test_a_slower_dataset_fails_the_gate(real_runs: dict[str, Path]) -> None:
    out = iolens("compare", str(real_runs["base"]), str(real_runs["slow"]), "--format", "json",
                 "--fail-on", "step-time:5%")
    assert out.returncode == 1, out.stdout + out.stderr
    o = json.loads(out.stdout)
    assert o["method"]["samples"] == C.BATCHES and o["base"]["batches"] == 60
    step = next(m for m in o["metrics"] if m["id"] == "step-time")
    assert step["statistic"] == "median" and step["real"] is True
    assert step["outcome"] == "worse" and step["change"] > 50  # 2 x 8 ms more a batch
    assert step["statement"].startswith("NEW is slower by") and step["statement"].endswith("real")
    assert o["fail_on"][0]["status"] == "crossed" and o["regressed"] is True
    text = iolens("compare", str(real_runs["base"]), str(real_runs["slow"]),
                  "--fail-on", "step-time:5%")
    assert text.returncode == 1 and "slower by" in text.stdout and "REGRESSED" in text.stdout


def test_the_same_script_twice_passes_the_gate(real_runs: dict[str, Path]) -> None:
    out = iolens("compare", str(real_runs["base"]), str(real_runs["again"]),
                 "--fail-on", "step-time:5%")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no bound crossed" in out.stdout


def test_batches_read_as_the_report_reads_them(real_runs: dict[str, Path]) -> None:
    run = str(real_runs["base"])
    agg = TrainingAggregator()
    TimingReader(f"{run}/timing").poll(agg)
    got = C.read_batches(run)
    assert got is not None
    assert sorted(got.steps) == sorted(agg.steps) and sorted(got.waits) == sorted(agg.waits)
    thin = C.read_batches(run, cap=20)
    assert thin is not None and thin.total == 60 and thin.every > 1
    assert len(thin.steps) <= 20
    cmp = C.compare_runs(load_run(run), load_run(str(real_runs["slow"])), cap=20)
    assert any("one in every" in w for w in cmp.warnings)


@pytest.mark.parametrize(("meta", "batches", "why"), [
    ({"cpus": 8, "exit_code": 1}, 10, "its job exited with code 1"),
    ({"cpus": 8, "notes": ["the recording did not finish, or is still going on: iolens was "
                           "stopped"]}, 10, "its recording did not finish"),
    ({"cpus": 8, "exit_code": 0}, 0, "it timed no batch and marked no step"),
])
def test_a_new_run_that_did_not_finish_cleanly_fails_the_gate(
        tmp_path: Path, meta: dict[str, Any], batches: int, why: str) -> None:
    """A crashed NEW (the review's: exit 1 at step 150 passed with "no bound crossed") fails
    the gate with its own message and exit 3, whatever its figures; --allow-failed judges
    them anyway."""
    base = noisy_run(tmp_path / "base", seed=1)
    new = write_run(tmp_path / "new", [rec(i, batches=batches) for i in range(30)], meta)
    out = iolens("compare", str(base), str(new), "--fail-on", "step-time:5%")
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"iolens compare: NEW did not finish cleanly: {why}" in out.stderr
    assert iolens("compare", str(base), str(new)).returncode == 0  # no gate: a comparison
    allowed = iolens("compare", str(base), str(new), "--fail-on", "step-time:5%",
                     "--allow-failed", "--format", "json")
    assert allowed.returncode in (0, 1, 2) and json.loads(allowed.stdout)["new_failed"]
    assert why in json.loads(allowed.stdout)["new_failed"]


def test_batches_pickled_then_tensors_are_proved_with_the_release_of_their_memory() -> None:
    """NOTE [a tensor's release], NOTE [a tensor's write]: the proof of a hand-over made
    from pickled batches to tensors adds the loop's freeing of the tensors' shared memory
    and the workers' writing it, at the run after's pace; batches of tensors before and
    after free the same memory either way."""
    def run(types: str, pace: float | None = None) -> Verdict:
        v = Verdict("handover-bound", "high", 0.5,
                    loaders=[{"batch_types": types, "batch_bytes": 4 << 20}])
        v.pace = pace
        return v

    assert _released(run("list"), run("torch.Tensor", 2.0)) == pytest.approx(
        (4 * rules.HANDOVER_RELEASE_MIB_S * 2.0, 4 * rules.HANDOVER_WRITE_MIB_S * 2.0))
    assert _released(run("list"), run("torch.Tensor")) == pytest.approx(
        (4 * rules.HANDOVER_RELEASE_MIB_S, 4 * rules.HANDOVER_WRITE_MIB_S))
    assert _released(run("torch.Tensor"), run("torch.Tensor", 2.0)) is None
    assert _released(run("list"), run("list")) is None
    assert _released(run(""), run("torch.Tensor")) is None  # (what BEFORE held: unknown)
