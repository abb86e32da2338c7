"""The block bootstrap: how one run's samples are cut into contiguous blocks
(:func:`block_bounds`) with the epoch starts set apart (:func:`strata`), the statistics
that can be recomputed on a resample of those blocks (:class:`RatioOfSums`,
:class:`Median`), and the percentile confidence interval of NEW/BASE or NEW - BASE over
the same resamples (:func:`bootstrap`). It decides how wide a difference's interval is,
from each run's own noise; it knows nothing of metrics or runs."""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from iolens.analysis import resample

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 20261130
"""Seeds the resampling, so that the same two runs always give the same intervals."""
MAX_BLOCKS = 200
"""Blocks per run at most (longer blocks beyond that): bounds the work per resample."""
MIN_BLOCKS = resample.MIN_BLOCKS
_VALID_SHARE = 0.9
"""Share of resamples that must give a defined value (no division by zero)."""


def block_bounds(n: int) -> list[tuple[int, int]]:
    """Contiguous blocks of about sqrt(n) samples (at least MIN_BLOCKS, at most MAX_BLOCKS)."""
    return resample.block_bounds(n, MAX_BLOCKS)


@dataclass
class Strata:
    """How one run's samples are resampled (NOTE [epoch starts apart]).

    The samples are rearranged as ``order`` (the steady ones in time order, then those set
    apart); ``bounds`` cuts the rearranged list into blocks, and ``sizes`` counts the
    blocks of each stratum in that order. A resample draws, within each stratum, as many
    blocks as it has.
    """

    order: list[int]
    bounds: list[tuple[int, int]]
    sizes: list[int]

    def arrange(self, seq: Sequence[Any]) -> list[Any]:
        """``seq`` in the strata's order."""
        return [seq[i] for i in self.order]


def strata(n: int, apart: Sequence[int] = ()) -> Strata:
    """Blocks of ``n`` samples, with the samples at ``apart`` (epoch starts) set apart, one
    block each: the earliest in a stratum alone (the run's start: processes, imports,
    workers, cold caches), the others in a stratum together; set apart only while they
    are at most half the samples."""
    aside = sorted({i for i in apart if 0 <= i < n})
    if 2 * len(aside) > n:
        aside = []
    skip = set(aside)
    steady = [i for i in range(n) if i not in skip]
    bounds = block_bounds(len(steady))
    sizes = [len(bounds)] if bounds else []
    m = len(steady)
    for group in (aside[:1], aside[1:]):
        if group:
            bounds += [(m + j, m + j + 1) for j in range(len(group))]
            sizes.append(len(group))
            m += len(group)
    return Strata(steady + aside, bounds, sizes)


"""NOTE [epoch starts apart]: the first batch of an epoch can take seconds (workers that
are not persistent start again; a streaming library fills its cache) while the others take
milliseconds. The number of such batches in a run is set by its configuration (how many
epochs), not by chance, but a bootstrap over blocks draws the blocks that hold them as
often as chance gives: a resample of 20 blocks of which 4 hold a 2.5 s start holds anywhere
from 0 to 9 of them. A spawn loader made persistent (21.2 -> 33.9 steps/s here, 400
batches in 4 epochs each) came out "higher by 59.9% (95% CI -18.1% to +188.2%): within
noise". So the batches that opened an epoch (and, over per-interval figures, the intervals
in which one began) are set apart: the run's first alone (it holds the start of the
processes and workers in every configuration), the later ones together, so that each
resample holds exactly as many as the run did, drawn from among them; the steady batches
are resampled in blocks as before. The same two runs then give "+59.9% (95% CI +51.7% to
+67.2%): real". Set apart only while they are at most half the samples (with epochs of a batch or
two, or an interval per epoch, they are the run's ordinary pace)."""


class Statistic:
    """A statistic of one run's samples that can be recomputed on a resample of its blocks."""

    def value(self) -> float | None:
        """The statistic over every sample."""
        raise NotImplementedError

    def resampled(self, picks: Sequence[int]) -> float | None:
        """The statistic over the blocks ``picks`` (indices, with repeats)."""
        raise NotImplementedError


def _pick(seq: Sequence[Any], picks: Sequence[int]) -> tuple[Any, ...]:
    """``seq[i] for i in picks`` as a tuple, at C speed."""
    got = itemgetter(*picks)(seq)
    return got if len(picks) != 1 else (got,)


class RatioOfSums(Statistic):
    """sum(num) / sum(den) (a mean, a rate, a share)."""

    def __init__(self, num: Sequence[float], den: Sequence[float],
                 bounds: Sequence[tuple[int, int]]) -> None:
        self.num = [math.fsum(num[a:b]) for a, b in bounds]
        self.den = [math.fsum(den[a:b]) for a, b in bounds]

    def value(self) -> float | None:
        den = math.fsum(self.den)
        return math.fsum(self.num) / den if den > 0 else None

    def resampled(self, picks: Sequence[int]) -> float | None:
        den = sum(_pick(self.den, picks))
        return sum(_pick(self.num, picks)) / den if den > 0 else None


class Median(Statistic):
    """The nearest-rank median (the value at rank ceil(n/2), as the report's p50).

    On a resample the median is the smallest sample value with at least
    ceil(n/2) picked values at or below it. It is found without sorting the
    resample: first among :data:`GRID` values of the run at evenly spaced ranks,
    from counts per block computed once, then among the picked values between the
    two grid values that bracket it (each block is kept sorted).
    """

    GRID = 1024

    def __init__(self, values: Sequence[int], bounds: Sequence[tuple[int, int]]) -> None:
        self.blocks = [sorted(values[a:b]) for a, b in bounds]
        self.sizes = [len(b) for b in self.blocks]
        self.sorted = sorted(values)
        n = len(self.sorted)
        self.grid = sorted({min(n - 1, g * n // self.GRID) for g in range(1, self.GRID + 1)}
                           if n else ())
        self.counts = [[bisect_right(b, self.sorted[i]) for b in self.blocks]
                       for i in self.grid]
        """Per grid rank, how many values of each block are at or below its value."""

    def value(self) -> float | None:
        n = len(self.sorted)
        return float(self.sorted[max(0, math.ceil(n / 2) - 1)]) if n else None

    def resampled(self, picks: Sequence[int]) -> float | None:
        n = sum(_pick(self.sizes, picks))
        if not n:
            return None
        k = math.ceil(n / 2)
        lo, hi = 0, len(self.grid)
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(_pick(self.counts[mid], picks)) >= k:
                hi = mid
            else:
                lo = mid + 1
        # lo < len(grid): the last grid value is the run's largest, with every value below it
        top = self.sorted[self.grid[lo]]
        if lo > 0:
            bottom = self.sorted[self.grid[lo - 1]]
            below = sum(_pick(self.counts[lo - 1], picks))
        else:
            bottom, below = None, 0
        inside: list[int] = []
        for blk in _pick(self.blocks, picks):
            i = bisect_right(blk, bottom) if bottom is not None else 0
            j = bisect_right(blk, top, i)
            if j > i:
                inside.extend(blk[i:j])
        inside.sort()
        return float(inside[k - below - 1])


@dataclass
class Interval:
    """A bootstrap confidence interval of NEW/BASE (``ratio``) or NEW - BASE."""

    low: float
    high: float
    valid: int
    """Resamples that gave a defined value."""


def _draw(rng: random.Random, sizes: Sequence[int]) -> list[int]:
    """One resample's blocks: within each stratum, as many as it has."""
    picks: list[int] = []
    start = 0
    for k in sizes:
        picks += rng.choices(range(start, start + k), k=k)
        start += k
    return picks


def bootstrap(base: Sequence[Statistic], new: Sequence[Statistic],
              base_blocks: int | Sequence[int], new_blocks: int | Sequence[int], *,
              ratio: Sequence[bool], resamples: int = RESAMPLES,
              seed: int | str = SEED, confidence: float = CONFIDENCE
              ) -> list[Interval | None]:
    """Percentile intervals for several statistics over the same block resamples.

    ``base[i]`` and ``new[i]`` are the same statistic of the two runs; both runs
    are resampled independently, each statistic of a run on the same picks.
    ``base_blocks`` and ``new_blocks`` are each run's blocks per stratum
    (:attr:`Strata.sizes`; a single number: one stratum).
    ``ratio[i]`` compares by NEW/BASE, else by NEW - BASE. None where fewer than
    90% of the resamples give a value.
    """
    rng_b = random.Random(f"{seed}:base")
    rng_n = random.Random(f"{seed}:new")
    sb_sizes = [base_blocks] if isinstance(base_blocks, int) else list(base_blocks)
    sn_sizes = [new_blocks] if isinstance(new_blocks, int) else list(new_blocks)
    draws: list[list[float]] = [[] for _ in base]
    for _ in range(resamples):
        pb = _draw(rng_b, sb_sizes)
        pn = _draw(rng_n, sn_sizes)
        for i, (sb, sn) in enumerate(zip(base, new, strict=True)):
            vb, vn = sb.resampled(pb), sn.resampled(pn)
            if vb is None or vn is None:
                continue
            if ratio[i]:
                if vb > 0:
                    draws[i].append(vn / vb)
            else:
                draws[i].append(vn - vb)
    out: list[Interval | None] = []
    tail = (1 - confidence) / 2
    for d in draws:
        if len(d) < _VALID_SHARE * resamples:
            out.append(None)
            continue
        d.sort()
        out.append(Interval(resample.quantile(d, tail), resample.quantile(d, 1 - tail), len(d)))
    return out
