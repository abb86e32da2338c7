"""How the commands that read whole runs (report, compare) read them."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from iolens.analysis.rundata import RunData


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


def read_run(path: str, command: str) -> RunData:
    """The run at ``path``, as ``iolens COMMAND`` reads it: a finished long run whose
    rollups are missing or stale gets them rebuilt from its records and written beside
    them, so that the next command reads them (NOTE [rollups rebuilt] in
    iolens/analysis/rebuild.py), saying so on stderr. Raises IolensError as load_run."""
    from iolens.analysis.rundata import load_run  # noqa: PLC0415 - keep `iolens --help` fast

    data = load_run(path, rebuild=lambda what: print(
        f"iolens {command}: {path}: {what}", file=sys.stderr, flush=True))
    if data.rollups:
        _keep_rollups(command, data.path, data.rollups)
        data.rollups = None
    return data


def _keep_rollups(command: str, path: str, lines: dict[float, list[bytes]]) -> None:
    """Write the rollups rebuilt from the run's records; a run directory that cannot take
    them (read-only, full) is left as it was, with a message."""
    from iolens.rundir import replace_rollups  # noqa: PLC0415

    try:
        replace_rollups(path, lines)
    except OSError as exc:
        print(f"iolens {command}: the rollups of {path}, rebuilt from its records, could not "
              f"be written ({exc.strerror or exc}): each {command} reads all its records",
              file=sys.stderr)
        return
    n = sum(len(v) for v in lines.values())
    print(f"iolens {command}: wrote the rollups of {path} ({n} lines, rebuilt from its "
          f"records): later reports read them", file=sys.stderr)
