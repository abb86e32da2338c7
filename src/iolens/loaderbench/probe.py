"""The differential test of a data pipeline: which stage bounds the job, and by how much.

As in the data-stall literature (DS-Analyzer, Mohan et al., VLDB 2021), three
rates are measured apart, in samples per second, each after a warm-up:

- the compute ceiling: the training step alone (forward, backward, optimizer)
  on one real batch kept in memory, repeated: what the job would do with free,
  instant data. Only with a model; without one the loader alone is measured.
- the preprocessing ceiling: the DataLoader over a subset of the dataset held
  in the page cache (a first pass over the subset warms it, with persistent
  workers; the measured passes follow): reading from memory, decoding,
  augmenting and collating, with no disk in the way.
- the storage ceiling: the DataLoader over the whole dataset in a random order,
  once, after the dataset's pages left the page cache: what it delivers from
  the disk. The pages of known files (``--folder``, ``--evict``) are dropped with
  posix_fadvise(POSIX_FADV_DONTNEED), which needs no root for files that can be
  opened; ``--drop-caches`` drops the whole machine's (root). Otherwise this
  stage is not measured, and the result says so.

The stage with the lowest rate bounds the job. Storage bounds it only when the
cold-cache rate is clearly (over 10%) below the preprocessing ceiling, since
the cold pass decodes too. The possible gain is the next stage's rate over it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from iolens.loaderbench.measure import Progress, Rate, batch_len, measure, quiet_loader_warnings
from iolens.loaderbench.source import ModelStep, Source, SpecError

STAGES = ("compute", "preprocessing", "storage")
STORAGE_MARGIN = 0.9
"""Storage bounds the job when its rate is below this share of the preprocessing ceiling."""

_WHAT = {"compute": "compute ceiling (the training step alone on in-memory batches)",
         "preprocessing": "preprocessing ceiling (the loader over a cached subset)",
         "storage": "storage ceiling (the loader on a cold page cache)"}


@dataclass
class Stage:
    name: str
    rate: Rate | None = None
    note: str = ""
    """Why the stage was not measured, or how it was."""

    @property
    def samples_per_s(self) -> float | None:
        return None if self.rate is None else self.rate.samples_per_s

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"measured": self.rate is not None, "note": self.note}
        d.update(self.rate.to_dict() if self.rate else {"samples_per_s": None})
        return d


@dataclass
class ProbeResult:
    dataset: str
    model: str | None
    batch_size: int
    num_workers: int
    seconds: float
    stages: dict[str, Stage] = field(default_factory=dict)
    bound: str | None = None
    gain: float | None = None
    summary: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "model": self.model, "batch_size": self.batch_size,
                "num_workers": self.num_workers, "seconds_per_stage": self.seconds,
                "stages": {n: s.to_dict() for n, s in self.stages.items()},
                "bound": self.bound,
                "possible_gain": None if self.gain is None else round(self.gain, 2),
                "summary": self.summary, "notes": list(self.notes)}


def evict(paths: Iterable[str]) -> tuple[int, int]:
    """Write back, then drop the page-cache pages of the files under ``paths``.

    Returns (files dropped, files that could not be opened)."""
    os.sync()
    done = failed = 0
    for path in _files(paths):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            failed += 1
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        except OSError:
            failed += 1
        finally:
            os.close(fd)
    return done, failed


def _files(paths: Iterable[str]) -> Iterable[str]:
    for path in paths:
        if os.path.isdir(path):
            for folder, _, files in os.walk(path):
                yield from (os.path.join(folder, f) for f in files)
        else:
            yield path


def drop_all_caches() -> None:
    """Drop the whole machine's clean page cache (root): ``echo 1 > /proc/sys/vm/drop_caches``."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("1\n")


def train_step(step: ModelStep, device: Any) -> Callable[[Any], None]:
    """One training step on a batch: forward, the loss, backward, an SGD step at rate 0.

    A batch ``(input, *targets)`` gives ``loss_fn(model(input), *targets)``; a lone
    tensor gives ``loss_fn(model(input))``."""
    import torch  # noqa: PLC0415

    from iolens.loaderbench.measure import to_device  # noqa: PLC0415

    model = step.model.to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # Learning rate 0: the optimizer does its work, the model's weights stay as they are.
    opt = torch.optim.SGD(params, lr=0.0) if params else None

    def run(batch: Any) -> None:
        if isinstance(batch, list | tuple):
            x, rest = batch[0], list(batch[1:])
        elif isinstance(batch, torch.Tensor):
            x, rest = batch, []
        else:
            raise SpecError(f"--model: a batch of {type(batch).__name__} is not supported; "
                            "the dataset's samples should be (input, target, ...) or a tensor")
        x = to_device(x, device)
        rest = [to_device(r, device) for r in rest]
        loss = step.loss_fn(model(x), *rest)
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()  # type: ignore[no-untyped-call]
        if opt is not None:
            opt.step()

    return run


def probe(source: Source, *, batch_size: int, num_workers: int, seconds: float,
          subset: int, model: ModelStep | None = None, evict_paths: list[str] | None = None,
          drop_caches: bool = False, device: str | None = None,
          progress: Progress | None = None, seed: int = 0) -> ProbeResult:
    """Measure the three stages (see the module) and name the one that bounds the job."""
    import torch  # noqa: PLC0415
    from torch.utils.data import DataLoader, Subset  # noqa: PLC0415

    quiet_loader_warnings()
    ds = source.dataset
    n = len(ds)  # type: ignore[arg-type]
    result = ProbeResult(source.name, model.name if model else None, batch_size, num_workers,
                         seconds)
    bar = progress or Progress("iolens probe", 3, enabled=False)
    bar.set_total(3)
    warm = max(1, num_workers)

    # b. preprocessing ceiling: a subset read once (the page cache holds it), then again.
    size = min(n, max(subset, batch_size))
    picked = sorted(random.Random(seed).sample(range(n), size))
    part = Subset(ds, picked)
    label = f"preprocessing: {size} samples from the page cache, {_workers(num_workers)}"
    bar.start(label)
    loader = DataLoader(part, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                        persistent_workers=num_workers > 0)
    rate = measure(loader, seconds=seconds, warmup=len(loader) + warm)
    del loader
    result.stages["preprocessing"] = Stage("preprocessing", rate, (
        f"{size} samples read once to warm the page cache, then drawn again in random order "
        f"by {_workers(num_workers)} for {rate.seconds:.1f} s"))
    bar.finish(label, f"{rate.samples_per_s:,.1f} samples/s")

    # a. compute ceiling: the training step alone on one real batch, kept in memory.
    label = "compute: the training step on an in-memory batch"
    if model is None:
        result.stages["compute"] = Stage("compute", None, (
            "not measured: no --model, so the loader alone was measured (the job's own "
            "step may be slower than the data)"))
        bar.finish(label, "skipped (no --model)")
    else:
        bar.start(label)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        batch = next(iter(DataLoader(part, batch_size=batch_size, shuffle=False)))
        step = train_step(model, dev)
        sync = torch.cuda.synchronize if dev.type == "cuda" else None

        def again() -> Iterable[Any]:
            return (batch for _ in range(1 << 30))

        try:
            rate = measure(again, seconds=seconds, warmup=2, consume=step, finish=sync,
                           one_pass=True)
        except SpecError:
            raise
        except Exception as exc:
            raise SpecError(f"--model {model.name!r}: the training step failed on a batch of "
                            f"the dataset: {type(exc).__name__}: {exc}") from exc
        result.stages["compute"] = Stage("compute", rate, (
            f"the training step on {dev.type} repeated on one batch of {batch_len(batch)} "
            f"samples kept in memory"))
        bar.finish(label, f"{rate.samples_per_s:,.1f} samples/s")

    # c. storage ceiling: the whole dataset, each sample once, from a cold page cache.
    label = f"storage: the dataset from a cold page cache, {_workers(num_workers)}"
    files = list(evict_paths or []) or source.files
    how = ""
    if files:
        dropped, failed = evict(files)
        how = f"the pages of {dropped} files dropped (posix_fadvise DONTNEED)"
        if failed:
            result.notes.append(f"{failed} of the dataset's files could not be opened to drop "
                                "their pages; the cold-cache rate may be too high")
        if not dropped:
            how = ""
    elif drop_caches:
        if os.geteuid() != 0:
            raise SpecError("--drop-caches needs root (it writes /proc/sys/vm/drop_caches); "
                            "--evict PATH drops the pages of the dataset's files without it")
        drop_all_caches()
        how = "the machine's page cache dropped (drop_caches)"
    if not how:
        why = ("none of the dataset's files could be opened" if files else
               "the dataset's files are unknown: give --evict PATH (its files or folder), "
               "or --drop-caches as root")
        result.stages["storage"] = Stage("storage", None, f"not measured: {why}")
        bar.finish(label, "skipped")
    else:
        bar.start(label)
        loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=num_workers)
        rate = measure(loader, seconds=seconds, warmup=warm, one_pass=True)
        del loader
        note = (f"{how}, then the dataset drawn in random order, each sample at most once, "
                f"for {rate.seconds:.1f} s")
        if rate.samples + rate.warmup_batches * batch_size >= n:
            note += "; the whole dataset was read before the time was up"
        result.stages["storage"] = Stage("storage", rate, note)
        bar.finish(label, f"{rate.samples_per_s:,.1f} samples/s")
    judge(result)
    return result


def _workers(n: int) -> str:
    return "no workers (loading in the main process)" if n == 0 else \
        f"{n} worker{'s' if n > 1 else ''}"


def _x(gain: float) -> str:
    return f"{gain:.1f}x" if gain < 10 else f"{gain:.0f}x"


def judge(result: ProbeResult) -> None:
    """Name the stage that bounds the job, the possible gain and the summary line."""
    compute = result.stages["compute"].samples_per_s
    prep = result.stages["preprocessing"].samples_per_s or 0.0
    cold = result.stages["storage"].samples_per_s
    rates = [f"{name} {v:,.0f}/s" for name, v in (
        ("cold-cache rate", cold), ("preprocessing ceiling", prep),
        ("compute ceiling", compute)) if v is not None]
    figures = ", ".join(rates)
    if cold is not None and cold < prep * STORAGE_MARGIN and (compute is None or cold < compute):
        result.bound = "storage"
        nxt = min(v for v in (prep, compute) if v is not None)
        result.gain = nxt / cold if cold > 0 else None
        gain = f"up to {_x(result.gain)}" if result.gain else "much more"
        result.summary = (f"storage bounds the job: {figures}: a faster disk or packing the "
                          f"files into shards (iolens pack) could give {gain}")
    else:
        feed = prep if cold is None else min(prep, cold)
        if compute is not None and compute < feed:
            result.bound = "compute"
            result.gain = feed / compute if compute > 0 else None
            gain = f"up to {_x(result.gain)}" if result.gain else "more"
            result.summary = (f"compute bounds the job: {figures}: the data arrives in time; "
                              f"a faster training step (mixed precision, a faster GPU, a "
                              f"smaller model) could give {gain} before the input bounds it")
        else:
            result.bound = "preprocessing"
            if compute is not None:
                result.gain = compute / feed if feed > 0 else None
                gain = f"could give up to {_x(result.gain)}" if result.gain else "would help"
            else:
                gain = "would help (no --model: the gain up to the training step's rate is " \
                       "not known)"
            result.summary = (f"preprocessing bounds the job: {figures}: more DataLoader "
                              f"workers (iolens tune), cheaper decoding and augmentation, or "
                              f"pre-processing the samples once {gain}")
    for name in STAGES:
        stage = result.stages[name]
        if stage.rate is None:
            result.notes.append(f"{name}: {stage.note}")


def render_text(result: ProbeResult) -> str:
    """The three stages' rates, the bound and what could be gained."""
    lines = [f"iolens probe: {result.dataset}"
             + (f", model {result.model}" if result.model else ", no model (the loader only)")
             + f", batch size {result.batch_size}, {_workers(result.num_workers)}, "
             f"{result.seconds:g} s per stage", ""]
    for name in STAGES:
        stage = result.stages[name]
        v = stage.samples_per_s
        figure = f"{v:>11,.1f} samples/s" if v is not None else f"{'-':>11}"
        mark = "  <- bound" if name == result.bound else ""
        lines.append(f"  {_WHAT[name]:<66} {figure}{mark}")
    lines.append("")
    lines.append(result.summary)
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines) + "\n"
