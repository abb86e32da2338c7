"""Per-batch cost of the DataLoader timing hook, side by side in one run.

A stand-in module with torch's two classes (``_BaseDataLoaderIter`` whose
``__next__`` returns at once, and ``DataLoader``) is patched by the same
code that patches torch, so the difference between the patched and the
plain ``next()`` is exactly what the hook adds to each batch. Goal: under
1 microsecond. Results are appended to bench/RESULTS.md by `make bench`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import types
from typing import Any

from iolens.training import _hooks


def make_module() -> types.ModuleType:
    mod = types.ModuleType("fake_dataloader")

    class _BaseDataLoaderIter:
        def __init__(self) -> None:
            self.n = 0

        def __next__(self) -> int:
            self.n += 1
            return self.n

    class DataLoader:
        num_workers = 0

        def __iter__(self) -> Any:
            return mod._BaseDataLoaderIter()

    mod._BaseDataLoaderIter = _BaseDataLoaderIter  # type: ignore[attr-defined]
    mod.DataLoader = DataLoader  # type: ignore[attr-defined]
    return mod


def per_batch_ns(it: Any, batches: int) -> float:
    nxt = type(it).__next__
    start = time.perf_counter_ns()
    for _ in range(batches):
        nxt(it)
    return (time.perf_counter_ns() - start) / batches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batches", type=int, default=200_000)
    ap.add_argument("--out", help="append a Markdown summary here")
    args = ap.parse_args()
    plain_mod, hooked_mod = make_module(), make_module()
    with tempfile.TemporaryDirectory() as tmp:
        _hooks.start(tmp, flush_ns=500_000_000)
        _hooks.patch_dataloader(hooked_mod)
        plain = iter(plain_mod.DataLoader())
        hooked = iter(hooked_mod.DataLoader())
        base: list[float] = []
        timed: list[float] = []
        for r in range(args.rounds):
            pair = [(base, plain), (timed, hooked)]
            for sink, it in (pair if r % 2 == 0 else pair[::-1]):
                sink.append(per_batch_ns(it, args.batches))
        w = _hooks.writer()
        written = w.written if w else 0
        if w:
            w.close()
    b, t = statistics.median(base), statistics.median(timed)
    text = "\n".join([
        "",
        "# Benchmark: per-batch cost of the DataLoader timing hook",
        "",
        f"- {args.rounds} interleaved rounds of {args.batches} batches; medians; "
        f"{written} records written to the timing file meanwhile",
        "",
        "| what | ns per batch |",
        "|---|---:|",
        f"| plain `next()` of the stand-in iterator | {b:.0f} |",
        f"| with the iolens hook | {t:.0f} |",
        f"| added by the hook | {t - b:.0f} (goal < 1000) |",
        "",
    ])
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
