"""The pieces of a block bootstrap that the comparison of two runs
(iolens.analysis.compare) and the intervals of a prediction (iolens.analysis.model)
share: contiguous blocks of samples, and a percentile of the resampled values."""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_BLOCKS = 5


def block_bounds(n: int, max_blocks: int) -> list[tuple[int, int]]:
    """Contiguous blocks of about sqrt(n) samples (at least MIN_BLOCKS, at most
    ``max_blocks``), their sizes differing by at most one."""
    if n <= 0:
        return []
    length = max(math.ceil(math.sqrt(n)), math.ceil(n / max_blocks))
    length = max(1, min(length, n // MIN_BLOCKS or 1))
    count = math.ceil(n / length)
    # equal blocks rather than a short last one
    base, extra = divmod(n, count)
    out = []
    start = 0
    for b in range(count):
        end = start + base + (b < extra)
        out.append((start, end))
        start = end
    return out


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated between neighbours."""
    pos = q * (len(ordered) - 1)
    i = math.floor(pos)
    j = min(i + 1, len(ordered) - 1)
    return ordered[i] + (ordered[j] - ordered[i]) * (pos - i)
