"""What the commands that read a whole run (report, compare) do before they read it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block.

    NOTE [no cycle collection]: a report builds tens of thousands of small dicts and
    lists that live until it is written (a week's 6,049 buckets are 1.5 million
    objects). Each time enough of them have been made, the collector walks every
    live object looking for cycles, and finds none: the analysis makes none, and
    what it drops is freed by reference counting as before. On the week of
    bench/bench_report.py that walking was a quarter of the JSON report's time,
    for no memory saved (the same peak RSS, 175 MiB, either way). Commands only:
    the library leaves the collector alone, as a training process that reports at
    its end may need it.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
