"""The cores are shared: a JPEG pipeline whose decode and augmentation compete with the
training step for this machine's 2 cores.

The training step is a small convolutional network's forward and backward pass on the CPU
(about 15 ms a batch of 16 on a core), the samples are JPEG photo-like images of 320x320
decoded, jittered in colour and contrast, cropped, resized and flipped with Pillow (about
3.5 ms of CPU each). Each case
runs under `iolens run` with the command alone, follows the advice and measures:

- no workers: the verdict's worker count, whose prediction holds although the workers take
  the cores the step needs (the review saw 0 -> 2 workers predicted at 39.5 steps/s and
  measured at 29 on such a pipeline);
- two workers on busy cores: the cheaper transform the verdict asks for, made as a user
  would (decoding at a quarter scale, no jitter or crop: about a fifth of the CPU, not
  the halving the advice assumed), judged by `iolens compare` against the change made;
- `iolens tune`, which the verdict recommends, run beside the recorded step (``--run``):
  its best setting, followed, is not slower than the run before it;
- six workers on the 2 cores: they queue for the cores (their fetch waits for one, which
  is not "blocked on something else"), the verdict asks for as many workers as cores,
  and followed with the `iolens run --set` line it prints, the job is not slower beyond
  the noise of a run (RUN_NOISE) and its prediction holds.

The speed of these jobs is their CPU: each run is taken on a quiet machine where it can be
(`tests.test_lab.quiet_case`).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_lab import QUIET_MAX, quiet_case
from tests.test_lab_advice import first_fix, held, measured

pytest.importorskip("torch")
pytest.importorskip("PIL")

SECONDS = "6"

RUN_NOISE = 0.10
"""How far (a share) one run of these jobs can fall below another of the same setting on
this machine, quiet runs taken: 28.1-32.5 steps/s for one setting in three runs."""

TRAIN = """
import os, random, sys, time
import numpy as np, torch
from PIL import Image, ImageEnhance
from torch.utils.data import DataLoader, Dataset
torch.set_num_threads(1)

class Images(Dataset):
    # an image folder decoded and augmented as a classifier's input pipeline does
    def __init__(self, root, light=False):
        self.items = [os.path.join(root, f) for f in sorted(os.listdir(root))]
        self.light = light
    def __len__(self):
        return len(self.items)
    def __getitem__(self, i):
        with Image.open(self.items[i]) as img:
            if self.light:  # cheaper: decoded at a quarter scale, resized, no crop or flip
                img.draft("RGB", (img.width // 4, img.height // 4))
                img = img.convert("RGB").resize((96, 96))
            else:  # colour and contrast jitter, a random crop resized, a flip
                img = img.convert("RGB")
                img = ImageEnhance.Color(img).enhance(random.uniform(0.6, 1.4))
                img = ImageEnhance.Contrast(img).enhance(random.uniform(0.6, 1.4))
                w, h = img.size
                s = random.randint(w // 2, w)
                x, y = random.randint(0, w - s), random.randint(0, h - s)
                img = img.resize((96, 96), Image.BICUBIC, box=(x, y, x + s, y + s))
                if random.random() < 0.5:
                    img = img.transpose(Image.FLIP_LEFT_RIGHT)
            a = np.asarray(img, dtype=np.float32) / 255
        return torch.from_numpy((a - 0.5) / 0.25).permute(2, 0, 1).contiguous(), i % 4

def make():  # for `iolens tune --dataset`
    return Images(os.environ["JPEG_DATA"])

if __name__ == "__main__":
    D, SECONDS, WORKERS, LIGHT = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loader = DataLoader(Images(D, light=LIGHT == "light"), batch_size=16, shuffle=True,
                        num_workers=WORKERS, persistent_workers=WORKERS > 0)
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        for x, y in loader:
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if time.monotonic() > end:
                break
    print("done")
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_images(tmp_path_factory.mktemp("jpeg"))


def build_images(d: Path) -> Path:
    """600 JPEG images of 320x320 in ``d`` (about 36 KiB each: a gradient under smooth noise,
    which compresses as a photo does), in the page cache."""
    from PIL import Image

    base = Image.linear_gradient("L").resize((320, 320)).convert("RGB")
    for i in range(600):
        rnd = random.Random(i)
        noise = Image.frombytes("RGB", (80, 80), rnd.randbytes(80 * 80 * 3))
        Image.blend(base, noise.resize((320, 320), Image.Resampling.BILINEAR), 0.6).save(
            d / f"{i:05d}.jpg", quality=90)
    # Written back now, not during the first run: the clean-clone CI's run without workers
    # waited 12% of its time on I/O (the writeback of these files), ran 18.5 steps/s and
    # predicted 25.8 for 2 workers, which then ran 32.0 and 37.7.
    os.sync()
    return d


@pytest.fixture(scope="module")
def no_workers(images: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[dict[str, Any], Path]:
    """The pipeline run with num_workers=0: its report and run directory."""
    return quiet_case(tmp_path_factory.mktemp("no-workers"), TRAIN, str(images), SECONDS, "0",
                      "full")


def _compare(before: Path, after: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "iolens", "compare", str(before), str(after),
                          "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True)
    return dict(json.loads(out.stdout))


def _cpu_times() -> list[int]:
    with open("/proc/stat") as fh:
        return [int(x) for x in fh.readline().split()[1:]]


def _stolen_since(start: list[int]) -> float:
    """The share (%) of the machine's CPU time the host stole since ``start``."""
    d = [b - a for a, b in zip(start, _cpu_times(), strict=False)]
    return 100 * d[7] / sum(d[:8]) if sum(d[:8]) else 0.0


def test_workers_that_take_the_steps_cores_are_predicted_so(
        tmp_path: Path, images: Path, no_workers: tuple[dict[str, Any], Path]) -> None:
    before, before_run = no_workers
    v = before["verdict"]
    assert v["class"] in ("loader-starved", "cpu-bound-input"), v
    rec = first_fix(before, "num_workers")
    n = rec["change"]["num_workers"]
    assert n >= 1, rec
    after, predicted = [], []
    for i in range(2):
        report, run = quiet_case(tmp_path / f"after{i}", TRAIN, str(images), SECONDS, str(n),
                                 "full")
        after.append(measured(report))
        proof = _compare(before_run, run)["prediction"]
        assert proof["change"]["num_workers"] == n, proof
        assert proof["held"] is (abs(proof["error"]) <= 0.25
                                 and not proof["wrong_way"]), proof
        # the proof is the verdict's prediction, for the cores the run after had where the
        # machine's other load moved (NOTE [the cores the run after had])
        p = proof["predicted"]["steps_per_s"]
        if not any("as measured after" in b for b in proof["predicted"]["basis"]):
            assert p == pytest.approx(rec["prediction"]["steps_per_s"], rel=1e-3), proof
        predicted.append(p)
    held(rec, after, statistics.fmean(predicted))


def test_a_cheaper_transform_is_judged_by_the_factor_it_made(tmp_path: Path,
                                                              images: Path) -> None:
    before, before_run = quiet_case(tmp_path / "before", TRAIN, str(images), SECONDS, "2",
                                    "full")
    rec = first_fix(before, "fetch_cpu")
    assert rec["change"]["fetch_cpu"] == 0.5, rec
    report, run = quiet_case(tmp_path / "after", TRAIN, str(images), SECONDS, "2", "light")
    proof = _compare(before_run, run)["prediction"]
    assert "fetch_cpu" in proof["change"], proof
    # the light transform costs well under half: the prediction held is the one for the
    # factor measured, not the halving advised
    made = proof["change"]["fetch_cpu"]
    assert made < 0.45, proof
    assert "made as" in proof["action"], proof
    assert abs(proof["error"]) <= 0.25 and proof["held"], (proof, measured(report))


def test_iolens_tune_beside_the_step_followed_is_not_slower(
        tmp_path: Path, images: Path, no_workers: tuple[dict[str, Any], Path]) -> None:
    before, before_run = no_workers
    (tmp_path / "train.py").write_text(TRAIN)  # (for --dataset train:make)
    env = {**os.environ, "JPEG_DATA": str(images)}
    for _ in range(2):  # again where the host took the cores it measured on
        start = _cpu_times()
        out = subprocess.run([sys.executable, "-m", "iolens", "tune", "--dataset",
                              "train:make", "--batch-size", "16", "--seconds", "3", "--run",
                              str(before_run), "--format", "json", "-q"],
                             cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600, check=True)
        stolen = _stolen_since(start)
        if stolen < QUIET_MAX:
            break
    tuned = json.loads(out.stdout)
    best = tuned["best"]
    assert tuned["step"]["source"], tuned  # measured beside the run's step
    # the same direction as the verdict's model: workers, which it predicts to gain
    advised = first_fix(before, "num_workers")
    assert advised["prediction"]["steps_per_s"] > measured(before), advised
    n = int(best["num_workers"])
    assert n >= 1, (tuned["settings"], f"{stolen:.0f}% stolen")
    report, _ = quiet_case(tmp_path / "after", TRAIN, str(images), SECONDS, str(n), "full")
    assert measured(report) > measured(before), (tuned["settings"], measured(before),
                                                 measured(report))


def test_more_workers_than_cores_are_told_to_be_fewer_and_are_not_slower(
        tmp_path: Path, images: Path) -> None:
    before, before_run = quiet_case(tmp_path / "before", TRAIN, str(images), SECONDS, "6",
                                    "full")
    v = before["verdict"]
    assert v["class"] == "cpu-bound-input", v
    assert before["pipeline"]["fetch_queue_share"] >= 0.25, before["pipeline"]
    assert any("waiting for a core" in e for e in v["evidence"]), v["evidence"]
    rec = v["recommendations"][0]
    assert rec["action"].startswith("lower num_workers from 6 to "), rec
    n = rec["change"]["num_workers"]
    assert 1 <= n <= 2 and rec["prediction"] is not None, rec
    sets = [w for w in shlex.split(rec["try"]) if "=" in w and not w.startswith("-")]
    assert sets == [f"num_workers={n}"], rec["try"]
    after, runs = [], []
    for i in range(2):
        report, run = quiet_case(tmp_path / f"after{i}", TRAIN, str(images), SECONDS, "6",
                                 "full", sets=sets)
        after.append(measured(report))
        runs.append(run)
    proof = _compare(before_run, runs[0])["prediction"]
    assert proof["change"] == {"num_workers": n}, proof
    # The gain predicted is small (29.0 -> 30.7 steps/s here), and one setting's runs vary
    # more (28.1, 29.0 and 32.5 with 6 workers; 30.9, 30.6 and 29.0 with 2): what is
    # claimed is that following the advice costs nothing beyond that noise, and that its
    # prediction holds. (The clean-clone CI measured 33.6 before, 33.5 and 31.0 after.)
    assert sum(after) / len(after) >= (1 - RUN_NOISE) * measured(before), (
        measured(before), after, rec["prediction"])
    held(rec, after)
