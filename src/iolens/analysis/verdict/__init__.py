"""The verdict: what holds the training back, the evidence, and what to do about it.

Pure functions over a run's interval records (and its meta.json, when
there is one). The thresholds and their reasons live in
:mod:`iolens.analysis.rules`; this package applies them in this order:

1. Severity from the share of step time spent waiting for data.
2. The primary class, exactly one: ``write-stall`` when steps stall while the
   job's writes saturate a device and that costs more than the data wait;
   else ``compute-bound`` under the moderate band; else, for an input-bound
   run, ``storage-bound`` (a device serving the job saturated or slow, the
   job's reads making up its load, or the job blocked on I/O above a device),
   ``cpu-bound-input`` (workers or the whole machine out of CPU), or
   ``loader-starved`` (nothing saturated).
3. Secondary findings, any number: ``noisy-neighbor``, ``warm-cache``,
   ``cold-start``, ``epoch-start-stall``, ``no-disk-stats``.

A run with no timed batches gets the class ``no-steps`` with the reason.

Its modules, each imports only those below it:

- ``classify``: diagnose(), and the classes decided before the input-bound ones (no
  steps, steps only, compute-bound); the autotuned part of a run; how each
  recommendation is tried.
- ``inputbound``: which input-bound class, its evidence and its advice.
- ``remote``: advice where the job waits on storage no local device shows (network file
  systems, FUSE, HTTP and object stores).
- ``storage``: advice where a device serving the dataset binds (the storage probe,
  packing, reading in blocks, a cache in RAM).
- ``workers``: advice on the DataLoader's workers, the hand-over and the epochs' first
  batches.
- ``writes``: write-stall.
- ``findings``: the secondary findings.
- ``ranks``: the figures of each rank, and the straggler among them.
- ``figures``: the figures read out of the interval records.
- ``result``: what a verdict is: its classes, its parts, its printed lines.
"""

from __future__ import annotations

from iolens.analysis.columns import DeviceLoad
from iolens.analysis.verdict.classify import diagnose, how_to_try, served_storage
from iolens.analysis.verdict.ranks import rank_figures, straggler
from iolens.analysis.verdict.remote import net_scaling
from iolens.analysis.verdict.result import (
    FINDING_CLASSES,
    HUNG,
    NO_MODEL,
    NO_STEPS,
    PRIMARY_CLASSES,
    STEPS_ONLY,
    Finding,
    Recommendation,
    Verdict,
    Window,
    clock,
    severity,
    verdict_lines,
)
from iolens.analysis.verdict.storage import block_sampled, reads_dataset
from iolens.analysis.verdict.workers import fetch_text

__all__ = [
    "FINDING_CLASSES",
    "HUNG",
    "NO_MODEL",
    "NO_STEPS",
    "PRIMARY_CLASSES",
    "STEPS_ONLY",
    "DeviceLoad",
    "Finding",
    "Recommendation",
    "Verdict",
    "Window",
    "block_sampled",
    "clock",
    "diagnose",
    "fetch_text",
    "how_to_try",
    "net_scaling",
    "rank_figures",
    "reads_dataset",
    "served_storage",
    "severity",
    "straggler",
    "verdict_lines",
]
