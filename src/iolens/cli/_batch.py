"""How the commands that read whole runs (report, compare) read them."""

from __future__ import annotations

import gc
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

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


def json_text(obj: Any) -> str:
    """``obj`` as the JSON the commands print: indented by 2, ASCII only.

    NOTE [report JSON]: the standard encoder indents in Python, not in C: 0.045 s of a
    week's 1 s report (bench/bench_report.py). orjson writes the same text in 0.003 s (the
    week's report byte for byte the same); what is not ASCII in its strings (a path, a
    device's model), and DEL, is escaped as the standard encoder escapes it. Two
    differences, both the same JSON: some floats are written in another form (1e-6 where
    the standard encoder writes 1e-06, 0.000015 where it writes 1.5e-05), and a figure
    that is not finite as null (the standard encoder refused it, and the command
    failed)."""
    import orjson  # noqa: PLC0415 - a text report of a short run needs none

    try:
        data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # (an integer past 64 bits: from a damaged record)
        return json.dumps(_finite(obj), indent=2) + "\n"
    text = data.decode()
    if not data.isascii() or b"\x7f" in data:
        text = _NOT_ASCII.sub(lambda m: json.dumps(m.group())[1:-1], text)
    return text + "\n"


_NOT_ASCII = re.compile(r"[^\x00-\x7e]")  # (DEL too: the standard encoder escapes it)


def _finite(obj: Any) -> Any:
    """``obj`` with each float that is not finite as None, as orjson writes it."""
    if isinstance(obj, float):
        return obj if obj - obj == 0.0 else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


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
