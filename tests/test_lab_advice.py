"""Advice followed: each lab case runs under `iolens run` with the command alone, takes the
verdict's first fix and its prediction, makes the change the fix names, runs again (twice)
and holds the measured throughput against the prediction (goal: within 25%).

- samples that wait off the CPU (a remote fetch), with one worker and with none: more
  workers, to the number that reaches the step's own rate;
- CPU-heavy samples with a free core: one more worker, then the cores bind;
- CPU-heavy samples with no core free: no more workers; cheaper samples (the prediction
  is for halving their CPU cost, which the second run does);
- idle workers whose wait is the hand-over: more workers are predicted to gain nothing,
  and they do not; where the batch holds many tensors, one tensor a batch;
- a run whose workers keep up, waiting a moderate share for each batch's hand-over: the
  verdict says to leave the input pipeline alone, with the best candidate's figure, and
  the candidate followed gains under 10%.

This machine is shared and has 2 cores: the runs of one case vary by a few percent
between them (the assertion messages give every run's figure).
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis import model as pm
from iolens.analysis import rules
from iolens.analysis.verdict.workers import handover_s
from tests.test_lab import quiet_case, run_case

pytest.importorskip("torch")

TOLERANCE = 0.25
SECONDS = "6"

TRAIN = """
import sys, time, numpy, torch
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)
KIND, SECONDS, WORKERS, COST = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])

class Samples(Dataset):
    def __len__(self):
        return 192 if KIND == "remote-short" else 100_000  # (short: 12 batches an epoch)
    def __getitem__(self, i):
        if KIND.startswith("remote"):  # a remote fetch: COST seconds off the CPU
            time.sleep(COST)
        elif KIND == "cpu":  # decode and augment: COST seconds of CPU
            end = time.thread_time() + COST
            while time.thread_time() < end:
                pass
        elif KIND.startswith("steady"):  # a fast remote store, a larger sample
            time.sleep(COST)
            if KIND == "steady-one":  # its label in the one tensor
                return torch.zeros(4097)
            return torch.zeros(4096), i % 4
        if KIND == "handover":
            return bytes(1 << 20)  # 1 MiB per sample, pickled through the pipe whole
        if KIND == "handover-tensor":  # the same bytes as a tensor, through shared memory
            return torch.zeros(1 << 20, dtype=torch.uint8)
        if KIND == "handover-tensor-half":  # ... in half the bytes
            return torch.zeros(1 << 19, dtype=torch.uint8)
        if KIND == "arrays":  # 512 KiB of NumPy a sample, the batch's samples kept apart
            return numpy.zeros(1 << 19, dtype=numpy.uint8)
        if KIND == "arrays-tensor":  # ... as tensors, the default collate stacks them
            return torch.zeros(1 << 19, dtype=torch.uint8)
        if KIND == "fields":  # 16 fields, a tensor each: 16 tensors a batch
            return {f"field{k}": torch.zeros(256) for k in range(16)}
        if KIND == "fields-one":  # the same 16 fields stacked into one tensor
            return torch.zeros(16, 256)
        return torch.zeros(64), i % 4

def keep(batch):
    return batch

batch, step = {"remote": (16, 0.02), "remote-pause": (16, 0.02), "remote-short": (16, 0.02),
               "cpu": (8, 0.002),
               "handover": (4, 0.002), "handover-tensor": (4, 0.002),
               "handover-tensor-half": (4, 0.002),
               "arrays": (8, 0.002), "arrays-tensor": (8, 0.002),
               "fields": (8, 0.002), "fields-one": (8, 0.002),
               "steady": (32, 0.016), "steady-one": (32, 0.016)}[KIND]
loader = DataLoader(Samples(), batch_size=batch, num_workers=WORKERS,
                    collate_fn=keep if KIND in ("handover", "arrays") else None,
                    persistent_workers=WORKERS > 0)
end = time.monotonic() + SECONDS
n = 0
while time.monotonic() < end:
    for x in loader:
        time.sleep(step)  # the model step
        n += 1
        if KIND == "remote-pause" and n % 40 == 0:
            time.sleep(0.4)  # a validation pass (or a checkpoint) every 40 steps
        if time.monotonic() > end:
            break
print("done")
"""


def measured(report: dict[str, Any]) -> float:
    return float(report["verdict"]["figures"]["steps_per_s"])


def first_fix(report: dict[str, Any], key: str) -> dict[str, Any]:
    """The first recommendation that changes ``key``, with its prediction."""
    v = report["verdict"]
    for r in v["recommendations"]:
        if key in (r.get("change") or {}):
            assert r["prediction"] is not None, r
            return dict(r)
    raise AssertionError(f"no recommendation changes {key}: {v['recommendations']}, "
                         f"declined {v['declined']}")


def follow(tmp_path: Path, rec: dict[str, Any], *args: str,
           before: Path | None = None) -> list[float]:
    """Two runs with the change made; their measured steps per second. `iolens compare`
    of the run before (``before``, by default ``tmp_path/run``) against the first finds
    the change and sets the prediction it made beside the throughput measured."""
    out = []
    for i in range(2):
        d = tmp_path / f"after{i}"
        d.mkdir()
        report, _ = run_case(d, TRAIN, *args)
        out.append(measured(report))
    proved(tmp_path, rec, out[0], before)
    return out


def proved(tmp_path: Path, rec: dict[str, Any], first: float,
           before: Path | None = None) -> None:
    """`iolens compare` of the run before (``before``, by default ``tmp_path/run``) against
    the first run after (``tmp_path/after0/run``, measured at ``first`` steps/s) finds the
    change and sets the prediction it made beside the throughput measured."""
    before = before or tmp_path / "run"
    cmp = subprocess.run([sys.executable, "-m", "iolens", "compare", str(before),
                          str(tmp_path / "after0" / "run"), "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True)
    proof = json.loads(cmp.stdout)["prediction"]
    assert set(rec["change"]) <= set(proof["change"]), (rec, proof)
    assert proof["measured_steps_per_s"] == pytest.approx(first, rel=0.05), (proof, first)
    besides = set(proof["change"]) - set(rec["change"])
    if besides and besides <= {"fetch_cpu", "handover"}:
        # the advice, and a stage cost it moved besides (proof._SIDE_EFFECTS): BEFORE's
        # model with both predicts another figure, which the run after must meet (one CI
        # run: one tensor a batch advised at 302.8, the CPU per sample 0.13 of before's
        # besides, 380.7 for both, 359.3 measured)
        assert abs(proof["error"]) <= TOLERANCE and not proof["wrong_way"], proof
    else:
        # a factor is held at the amount AFTER measured (NOTE [the change that was made] in
        # iolens/analysis/proof.py): near the advised one, the prediction is near its
        factor = any(k in rec["change"] for k in ("fetch_cpu", "handover"))
        assert proof["predicted"]["steps_per_s"] == pytest.approx(
            rec["prediction"]["steps_per_s"], rel=0.15 if factor else 0.01), proof
    assert proof["held"] is (abs(proof["error"]) <= 0.25 and not proof["wrong_way"]), proof


def held(rec: dict[str, Any], after: list[float], predicted: float | None = None) -> None:
    """The mean of the runs ``after`` the fix within TOLERANCE of the prediction (``rec``'s,
    or ``predicted`` where several runs before the fix each made one, or where the proofs
    of the runs after give it for their own cores)."""
    p = rec["prediction"]
    want = p["steps_per_s"] if predicted is None else predicted
    mean = statistics.fmean(after)
    err = mean / want - 1
    assert abs(err) <= TOLERANCE, (
        f"{rec['action']}: predicted {want:.2f} (first run: {p['steps_per_s']}, "
        f"{p['low']}-{p['high']}), measured {after} (mean {mean:.2f}, {err * 100:+.0f}%); "
        f"basis {p['basis']}")


@pytest.mark.parametrize("workers", [1, 0])
def test_remote_waits_get_the_workers_that_reach_the_step_rate(tmp_path: Path,
                                                                workers: int) -> None:
    before, _ = run_case(tmp_path, TRAIN, "remote", SECONDS, str(workers), "0.005")
    v, pipe = before["verdict"], before["pipeline"]
    assert v["class"] == "loader-starved", v
    assert pipe["fetch_blocked_share"] > 0.7, pipe
    assert any("reads no dataset file" in e for e in v["evidence"]), v
    rec = first_fix(before, "num_workers")
    n = rec["change"]["num_workers"]
    p = rec["prediction"]
    assert rec["action"] == f"raise num_workers from {workers} to {n}", rec
    # 16 samples of 5 ms off CPU against a 20 ms step: one worker makes a fifth of the
    # step rate, so the number is well past a doubling, and the step binds after it
    assert n >= 3, rec
    assert p["limit"] in ("compute", "handover"), p
    assert p["steps_per_s"] >= 2.5 * measured(before), (p, measured(before))
    held(rec, follow(tmp_path, rec, "remote", SECONDS, str(n), "0.005"))


def test_short_epochs_from_no_workers_get_persistent_workers_and_the_first_batch_each_epoch(
        tmp_path: Path) -> None:
    """The remote case in epochs of 12 batches, from no workers: each epoch's first batch
    waits for one worker to make it whole (NOTE [an epoch's first batch from workers]), and
    workers started anew each epoch would cost their start too, so the advice sets them
    persistent. Followed as the user would, with the `iolens run --set` line it prints
    (a review saw 0 -> 4 workers in such epochs predicted at 80.2 steps/s, measured 22.7)."""
    before, _ = run_case(tmp_path, TRAIN, "remote-short", SECONDS, "0", "0.005")
    rec = first_fix(before, "num_workers")
    assert rec["change"]["persistent_workers"] is True, rec
    assert rec["action"].endswith("and set persistent_workers=True"), rec
    sets = [w for w in shlex.split(rec["try"]) if "=" in w and not w.startswith("-")]
    assert sets == [f"num_workers={rec['change']['num_workers']}",
                    "persistent_workers=true"], rec["try"]
    after = []
    for i in range(2):
        d = tmp_path / f"after{i}"
        d.mkdir()
        report, _ = run_case(d, TRAIN, "remote-short", SECONDS, "0", "0.005", sets=sets)
        after.append(measured(report))
    proved(tmp_path, rec, after[0])
    held(rec, after)


def test_a_loop_that_pauses_is_modelled_from_its_steps_and_its_pauses_kept(
        tmp_path: Path) -> None:
    """The remote case with a 0.4 s pause every 40 steps (a validation pass): in interval
    sums the pauses are 10 ms more compute a step; paired per batch they are their own
    stage, the compute stays the 20 ms step's, and the more-workers prediction, which keeps
    the pauses, holds."""
    before, _ = run_case(tmp_path, TRAIN, "remote-pause", SECONDS, "1", "0.005")
    model = before["verdict"]["model"]
    assert any("pauses between steps" in b for b in model["basis"]), model
    step = next(b for b in model["basis"] if b.startswith("step "))
    assert float(step.split()[1]) < 25, model  # ms: the step's 20, not 30 with the pauses
    rec = first_fix(before, "num_workers")
    n = rec["change"]["num_workers"]
    assert any("pauses between steps" in b for b in rec["prediction"]["basis"]), rec
    held(rec, follow(tmp_path, rec, "remote-pause", SECONDS, str(n), "0.005"))


def test_cpu_heavy_samples_with_a_free_core_get_one_more_worker(tmp_path: Path) -> None:
    before, _ = run_case(tmp_path, TRAIN, "cpu", SECONDS, "1", "0.02")
    v = before["verdict"]
    assert v["class"] == "cpu-bound-input" and v["severity"] == "high", v
    assert before["pipeline"]["fetch_cpu_share"] > 0.7, before["pipeline"]
    # Busy on the CPU: the verdict asks for 80% of a core, or half a core when the machine
    # has none idle (this one is shared: other work may hold the rest).
    assert before["processes"]["worker"]["cpu_pct"] >= rules.WORKER_CPU_SOME
    assert "1 DataLoader worker at" in v["evidence"][0]
    rec = first_fix(before, "num_workers")
    # one worker keeps a core busy; the second core is free, a third worker would queue
    assert rec["change"]["num_workers"] == 2, rec
    assert rec["prediction"]["limit"] in ("cpu", "workers"), rec
    held(rec, follow(tmp_path, rec, "cpu", SECONDS, "2", "0.02"))


def test_cpu_heavy_samples_on_busy_cores_are_told_to_get_cheaper(tmp_path: Path) -> None:
    before, _ = run_case(tmp_path, TRAIN, "cpu", SECONDS, "2", "0.02")
    v = before["verdict"]
    assert v["class"] == "cpu-bound-input", v
    assert not any((r.get("change") or {}).get("num_workers", 0) > 2
                   for r in v["recommendations"]), v["recommendations"]
    rec = first_fix(before, "fetch_cpu")
    assert rec["change"]["fetch_cpu"] == 0.5
    # halving the samples' CPU cost, as the prediction assumes
    held(rec, follow(tmp_path, rec, "cpu", SECONDS, "2", "0.01"))


def test_more_cpu_bound_workers_than_cores_are_told_to_be_fewer_and_that_holds(
        tmp_path: Path) -> None:
    """Six workers on 2 cores, each sample 20 ms of CPU and the loop light: the workers wait
    for a core two thirds of their fetch. Two keep both cores busy without the queue (NOTE
    [fewer workers queue less] in iolens/analysis/model/changes.py): the model counted the loop as
    always wanting a core and predicted two workers slower (7.7 steps/s from 9.8, where they
    measured 11.4), so the advice was not given.

    Taken on a quiet machine (`quiet_case`): quiet, three runs here predicted 11.7-12.8
    steps/s for 2 workers from 10.6-10.7, and two workers measured 11.4, a gain of 7%:
    close to the 5% a change must be predicted to gain to be advised (MIN_GAIN). Two
    clean-clone CI runs predicted 11.1 from 10.7-10.8 (+3%), and the change was declined
    for that. Either way the change is the one named and its prediction is followed."""
    before, before_run = quiet_case(tmp_path / "before", TRAIN, "cpu", SECONDS, "6", "0.02")
    v = before["verdict"]
    assert v["class"] == "cpu-bound-input", v
    fewer = [r for r in v["declined"] if "num_workers" in (r.get("change") or {})]
    if fewer and not any("num_workers" in (r.get("change") or {})
                         for r in v["recommendations"]):
        rec = fewer[0]  # declined: only for a gain under MIN_GAIN
        p = rec["prediction"]
        assert p["steps_per_s"] < p["now_steps_per_s"] * rules.MIN_GAIN, rec
    else:
        rec = first_fix(before, "num_workers")
    assert rec["change"]["num_workers"] == 2, rec
    assert rec["prediction"]["steps_per_s"] > rec["prediction"]["now_steps_per_s"], rec
    held(rec, follow(tmp_path, rec, "cpu", SECONDS, "2", "0.02", before=before_run))


def test_twelve_cpu_bound_workers_on_two_cores_are_told_to_be_two_and_that_holds(
        tmp_path: Path) -> None:
    """The case above built otherwise: twelve workers on 2 cores take over a second to hand
    the first batch over, so the interval that records num_workers times no batch, and they
    exit before the recorder sees the interval of their last timings. The model took the 8
    or 9 processes that timed a stage in one interval for the workers, and the last
    interval's fetch as blocked: its own rate read 6.2-7.2 steps/s where the runs measured
    8.1-8.6, and two workers were predicted at 10.5-15.9 (measured 11.4) (NOTE [the workers
    a run declared] in iolens/analysis/model/records.py). Three runs here now predicted
    10.4-12.1 steps/s."""
    before, before_run = quiet_case(tmp_path / "before", TRAIN, "cpu", SECONDS, "12", "0.02")
    v = before["verdict"]
    assert v["class"] == "cpu-bound-input", v
    rec = first_fix(before, "num_workers")
    assert rec["action"].startswith("lower num_workers from 12 to 2"), rec
    p = rec["prediction"]
    assert p["steps_per_s"] >= p["now_steps_per_s"] * rules.MIN_GAIN, rec
    held(rec, follow(tmp_path, rec, "cpu", SECONDS, "2", "0.02", before=before_run))


def test_idle_workers_behind_the_hand_over_get_the_hand_over_advice(tmp_path: Path) -> None:
    """This case moves 4 MiB a batch, pickled, through the workers' pipe on 2 cores. Its
    workers idle: the wait is the loop taking each batch. The verdict used to add "do not
    add DataLoader workers: they gain nothing", predicted at the rate measured; followed
    as runs alternating 2 and 4 workers, 4 were faster in 8 pairs of 8 here (mean 87 ->
    121 steps/s, the hand-over 8.9 -> 6.0 ms a batch, with the loop's CPU per batch
    falling with it), and in CI by 47%. So no claim is made on more workers; the advice is
    the hand-over's own, with its prediction: return tensors, followed with the same
    bytes as one uint8 tensor a batch (NOTE [a tensor's hand-over]). The loop's CPU of
    the hand-over is freed with it (NOTE [a hand-over's CPU]): without that, the CPU
    bound the prediction in one CI run (183 predicted, 245 measured). Four runs here:
    87-105 steps/s before, 289-294 predicted, 242-267 measured (-16% to -9%; the
    hand-over 7.6 ms, then 1.05-1.37), with 1.11 ms predicted for the 4 MiB tensor's
    hand-over; at 1.05 (its bytes free up to 2 MiB), bench/RESULTS.md's table of
    2026-12-05 10:03 had 301.9 predicted and 291.9-294.2 measured, the one of 22:01 303.4
    and 285.4-288.8. A CI run on a slower day predicted 271 and measured 182-187 (-32%):
    the tensor's hand-over took 1.68-2.86 ms that day, and freeing its shared memory 0.7
    ms of the loop's step. The lab's milliseconds now follow the run's pace (NOTE [the
    machine's pace]) and the release is counted (NOTE [a tensor's release]): three runs
    that day, 195-221 predicted, 194-216 measured (-11% to +6%)."""
    report, _ = run_case(tmp_path, TRAIN, "handover", SECONDS, "2", "0")
    v, pipe = report["verdict"], report["pipeline"]
    assert v["class"] == "handover-bound", v
    assert pipe["worker_idle_share"] > 0.7 and pipe["handover_s_per_batch"] > 0.002, pipe
    assert not any("num_workers" in (r.get("change") or {}) for r in v["recommendations"])
    assert not any("num_workers" in (r.get("change") or {}) for r in v["declined"])
    first = v["recommendations"][0]
    assert first["action"].startswith("make each batch cheaper to hand over"), first
    assert "the batches hold list)" in first["action"], first  # lists of bytes, pickled
    assert first["prediction"] and first["prediction"]["limit"] in ("compute", "handover", "cpu")
    # followed: the same bytes returned as a tensor, twice
    after = []
    for i in range(2):
        d = tmp_path / f"after{i}"
        d.mkdir()
        after.append(measured(run_case(d, TRAIN, "handover-tensor", SECONDS, "2", "0")[0]))
    assert min(after) > measured(report), (measured(report), after)
    held(first, after)
    # compare finds the hand-over made and sets BEFORE's model of it beside the run (the
    # factor made varies with each run's hand-over, 1.06-1.57 ms here after)
    cmp = subprocess.run([sys.executable, "-m", "iolens", "compare", str(tmp_path / "run"),
                          str(tmp_path / "after0" / "run"), "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True)
    proof = json.loads(cmp.stdout)["prediction"]
    assert proof["change"]["handover"] < 0.5, proof
    assert any("shared memory written by the workers" in b and "freed by the loop" in b
               for b in proof["predicted"]["basis"]), (
        proof)  # (NOTE [a tensor's release], [a tensor's write]: pickled batches to tensors)
    assert proof["held"] is True, proof


def test_numpy_samples_kept_apart_are_told_to_be_stacked_tensors_and_that_holds(
        tmp_path: Path) -> None:
    """The hand-over case built another way: 8 samples of 512 KiB a batch, a NumPy array
    each, kept apart in a list by the collate_fn (8 leaves pickled whole, where the other
    case's bytes are 1). The advice is tensors the default collate_fn stacks (NOTE
    [samples kept apart]), and the prediction holds when that is done. Predicted as 8
    tensors a batch, and with the workers' CPU of the pickling kept (10.2 ms a batch,
    against 4.6 to write the stacked tensor: NOTE [a tensor's write]), four runs here were
    162-179 predicted where 197-218 were measured (+14% to +31%); with both, two runs 256
    and 262 predicted, 226-231 measured (-11%, -13%)."""
    report, _ = run_case(tmp_path, TRAIN, "arrays", SECONDS, "2", "0")
    v = report["verdict"]
    assert v["class"] == "handover-bound", v
    first = v["recommendations"][0]
    assert "return tensors" in first["action"] and (
        "a batch is its samples kept apart, 8 leaves alike in shape, 1 tensor a batch") in (
        first["action"]), first
    assert "written by the workers" in first["prediction"]["basis"][0], first["prediction"]
    after = []
    for i in range(2):  # followed: tensors, stacked by the default collate_fn
        d = tmp_path / f"after{i}"
        d.mkdir()
        after.append(measured(run_case(d, TRAIN, "arrays-tensor", SECONDS, "2", "0")[0]))
    assert min(after) > measured(report), (measured(report), after)
    held(first, after)


def test_a_batch_of_many_tensors_is_told_to_hand_over_one_and_that_holds(
        tmp_path: Path) -> None:
    """NOTE [a tensor's hand-over] in iolens/analysis/verdict/workers.py: 16 fields a
    sample, a tensor each, through 2 workers that keep up. The loop waits for each batch's
    16 shared-memory handles; the advice is one tensor a batch (not fewer bytes), and
    its prediction holds when the fields are stacked into one, the loop's CPU and the
    workers' with it (NOTE [a hand-over's CPU]: without, one CI run predicted 235 where
    349 was measured). Four runs here: 120-172 steps/s before, 308-390 predicted, 351-365
    measured after (-6% to +17%; the hand-over 4.2 ms, then 0.61)."""
    before, _ = run_case(tmp_path, TRAIN, "fields", SECONDS, "2", "0")
    v, pipe = before["verdict"], before["pipeline"]
    assert v["class"] == "handover-bound", v
    assert pipe["worker_idle_share"] > 0.7, pipe
    rec = first_fix(before, "handover")
    assert v["recommendations"][0]["change"] == rec["change"], v  # (the first advice)
    assert rec["action"].startswith("hand each batch over as one tensor: its 16 tensors"), rec
    assert rec["change"] == {"handover": round(handover_s(1, 8 << 14) / handover_s(16, 8 << 14),
                                               3)}, rec
    assert rec["prediction"]["steps_per_s"] >= rules.MIN_GAIN * measured(before), rec
    after = follow(tmp_path, rec, "fields-one", SECONDS, "2", "0")
    assert min(after) > measured(before), (measured(before), after)
    held(rec, after)


def test_a_run_with_nothing_worth_changing_is_told_so_and_the_best_candidate_gains_nothing(
        tmp_path: Path) -> None:
    """The review saw runs with nothing to fix get a class and "try: do not add DataLoader
    workers ... predicted 40.7 steps/s, now 40.7" as their first line.

    The case is a wait of moderate severity: the hand-over of 512 KiB batches. It takes
    about 1.2 ms whatever the batch's bytes (the tensors go through shared memory: 768 KiB
    and 1.5 MiB batches gave the same share), so the step is short (16 ms) for it to be
    moderate: 7.0% to 7.5% of the step in four quiet runs here. Against the 30 ms step it
    had, 9 runs in one day (3 in CI, 6 here) waited 4.0% to 5.0%: too small to be called
    moderate, another case. The workers keep up (0.3 ms a sample); at 0.5 ms a sample and
    a 16 ms step they did not, and the case was loader-starved. It still runs again, at
    most twice more, until its wait is in the moderate band."""
    shares = []
    for k in range(3):
        d = tmp_path / f"before{k}"
        d.mkdir()
        before, _ = run_case(d, TRAIN, "steady", SECONDS, "2", "0.0003")
        v = before["verdict"]
        shares.append(v["data_wait_share"])
        if rules.MODERATE <= v["data_wait_share"] < rules.HIGH:
            break
    assert rules.MODERATE <= v["data_wait_share"] < rules.HIGH, (shares, v)
    first = v["recommendations"][0]
    assert not any("iolens tune" in r["action"] for r in v["recommendations"]), v
    if first["action"].startswith("make each batch cheaper to hand over"):
        # A run that waited more than most (12% in one CI run, 7.0-7.5% in quiet runs
        # here) can put the hand-over's candidate just over the gain advice needs (5.05%
        # there): then it is advised, as a marginal call (under the model's own error),
        # and it is followed below and must hold its prediction.
        best = first
        assert best["prediction"]["steps_per_s"] < (1 + pm.MODEL_ERROR) * measured(before), best
    else:
        assert first["action"].startswith("leave the input pipeline as it is"), first
        assert not any(r["prediction"] for r in v["recommendations"]), v["recommendations"]
        best = max(v["declined"], key=lambda r: r["prediction"]["steps_per_s"])
        assert best["prediction"]["steps_per_s"] < rules.MIN_GAIN * measured(before), best
        # the text gives three figures of the unrounded rate, the JSON three decimals:
        # 30.9504 reads "31" in one and 30.95 (below it in binary, "30.9" again at three
        # figures) in the other
        said = re.search(r"is predicted at ([0-9.]+) steps/s", first["action"])
        assert said, first
        assert float(said[1]) == pytest.approx(best["prediction"]["steps_per_s"],
                                               rel=0.006), first
    # the candidate followed: one tensor a batch, not two (the hand-over), or more workers
    kind, workers = (("steady-one", "2") if "handover" in best["change"]
                     else ("steady", str(best["change"]["num_workers"])))
    d = tmp_path / "after0"
    d.mkdir()
    after, _ = run_case(d, TRAIN, kind, SECONDS, workers, "0.0003")
    assert measured(after) < 1.10 * measured(before), (best, measured(before), measured(after))
    if best is first:  # advised: its prediction holds
        held(best, [measured(after)])
