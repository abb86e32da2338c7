"""Records -> one ``rich`` renderable: devices, the job, the training loop, CPU and GPUs (pure).

Nothing here touches a terminal: :func:`render` builds a renderable from the
recent records, and :func:`render_text` prints it into a string (plain text,
no colour) for pipes, logs and tests. Every figure may be missing (the first
interval, no process watched, no DataLoader timing, no GPU, no device
statistics): each panel then says so in words instead of failing.
"""

from __future__ import annotations

import io
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.segment import SegmentLines
from rich.table import Table
from rich.text import Text

from iolens.analysis import rules
from iolens.analysis.verdict import diagnose
from iolens.live.history import Header, History, Record
from iolens.recorder.summary import severity
from iolens.report.text import printable  # recorded strings reach the terminal without escapes

MIB = 1024 * 1024
GIB = 1024 * MIB
SPARK_LENGTH = 30
"""Characters of history drawn per sparkline (one per record)."""

_BLOCKS = "▁▂▃▄▅▆▇█"
_ASCII_BLOCKS = "_.-:=+*#"
# Widths below which the layout gives something up, in terminal columns.
_WIDE = 140  # the four panels side by side
_MEDIUM = 72  # two by two; narrower: one above the other
_DEVICE_FIXED = 68  # the device table without its history and "why" columns
_MIN_SPARK = 6
_MIN_WHY = 20
_DEVICE_NAME_MAX = 16
_PANEL_SPARK = 10  # history characters in the panels
_DEVICE_COLUMNS = ("rMB/s", "wMB/s", "r/s", "w/s", "r_await", "w_await", "aqu-sz", "%util")
_DEVICE_COLUMNS_NARROW = ("rMB/s", "wMB/s", "r_await", "%util")

# Thresholds for colour only; the figures are always printed.
_UTIL_HOT, _UTIL_WARM = 80.0, 50.0  # %util sustained over ~80% means saturated
_AWAIT_HOT, _AWAIT_WARM = 10.0, 5.0  # ms; over ~10 ms the reads queue up
_SEVERITY_STYLE = {"high": "bold red", "moderate": "yellow", "none": "green"}


def render(history: History | Iterable[Record], watch: Mapping[str, str],
           header: Header | None = None, *, height: int | None = None) -> RenderableType:
    """The whole view for ``history`` (oldest record first) and the watched devices.

    ``watch`` maps each watched device to why it is watched, in display order.
    The result adapts to the width it is drawn into; given the screen's
    ``height``, the device table keeps to the lines left by everything else
    (the busiest devices first) so the panels stay on screen.
    """
    hist = history if isinstance(history, History) else History(records=history)
    return Dashboard(hist, dict(watch), header or Header(), height=height)


def render_text(history: History | Iterable[Record], watch: Mapping[str, str],
                header: Header | None = None, *, width: int = 120,
                encoding: str = "utf-8") -> str:
    """The view as plain text, ``width`` columns wide, with no colour or control codes.

    For an ``encoding`` other than UTF-8 (a pipe under a Latin-1 locale), the
    text keeps to ASCII: ASCII boxes, sparklines and dashes.
    """
    buf = _Buffer(encoding)
    console = Console(file=buf, width=width, color_system=None, force_terminal=False,
                      force_jupyter=False, force_interactive=False, legacy_windows=False,
                      soft_wrap=False, emoji=False, highlight=False, markup=False)
    console.print(render(history, watch, header))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


class _Buffer(io.StringIO):
    """A string buffer that tells rich which encoding the text is bound for."""

    def __init__(self, encoding: str) -> None:
        super().__init__()
        self._bound_for = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._bound_for


class Dashboard:
    """The laid-out view; built by :func:`render`, laid out when drawn."""

    def __init__(self, history: History, watch: dict[str, str], header: Header, *,
                 height: int | None = None) -> None:
        self.history = history
        self.watch = watch
        self.header = header
        self.height = height
        """Lines available. Rich resets the height for renderables nested in others
        (a full screen's Group), so the caller says it."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        plain = not (console.encoding or "").lower().startswith("utf")
        width = options.max_width
        top: RenderableType = header_text(self.history, self.header, plain=plain, width=width)
        panels = panel_grid(self.history, self.header, width=width, plain=plain)
        footer = Text(self.header.footer, style="dim") if self.header.footer else None
        max_rows: int | None = None
        height = options.height if options.height is not None else self.height
        if height is not None:
            # Full screen: measure what surrounds the device table (rendering it
            # once, here) and give the table the rest.
            unbounded = options.update(height=None)
            top_lines = console.render_lines(top, unbounded, new_lines=True)
            panel_lines = console.render_lines(panels, unbounded, new_lines=True)
            used = len(top_lines) + len(panel_lines) + (1 if footer is not None else 0)
            max_rows = max(1, height - used - 2)  # the heading and a "more" line
            top, panels = SegmentLines(top_lines), SegmentLines(panel_lines)
        yield top
        yield devices_table(self.history, self.watch, width=width, max_rows=max_rows,
                            plain=plain)
        yield panels
        if footer is not None:
            yield footer


# -- the parts -------------------------------------------------------------------


def header_text(history: History, header: Header, *, plain: bool = False,
                width: int = 120) -> Text:
    """The first line(s): what is watched, since when, every how long, and the notes."""
    sep = " | " if plain else " · "
    room = max(20, width - 75)  # for the command line, so the first line fits
    t = Text()
    t.append(header.title, style="bold")
    if header.pid is not None:
        t.append(f"{sep}pid {header.pid}")
        if header.command:
            t.append(f" {_shorten(printable(header.command), room)}", style="cyan")
    elif header.command:
        t.append(f"{sep}{_shorten(printable(header.command), room)}", style="cyan")
    else:
        t.append(f"{sep}whole machine")
    latest = history.latest
    if latest is None:
        t.append(f"{sep}waiting for the first interval", style="dim")
    else:
        interval = _num(latest.get("interval_s"))
        if interval is not None:
            t.append(f"{sep}every {interval:.2g} s")
        when = _num(latest.get("t"))
        if when is not None:
            t.append(f"{sep}{time.strftime('%H:%M:%S', time.localtime(when))}")
        elapsed = _num(latest.get("elapsed_s"))
        if elapsed is not None:
            t.append(f"{sep}up {_clock(elapsed)}")
    if history.batches:
        t.append("\n")
        t.append_text(verdict_text(history, width=width, storage=header.storage))
    pipe = pipeline_text(latest, width=width) if latest is not None else None
    if pipe is not None:
        t.append("\n")
        t.append_text(pipe)
    if header.run_dir:
        t.append(f"\nrecording to {printable(header.run_dir)}", style="dim")
    for note in header.notes[-3:]:
        t.append("\n")
        t.append(f"note: {_shorten(printable(note), max(40, width - 6))}", style="yellow")
    return t


def verdict_text(history: History, *, width: int = 120,
                 storage: list[dict[str, Any]] | None = None) -> Text:
    """The current verdict over the recent window, once it holds enough timed batches."""
    recent = list(history.records)
    batches = sum(_int(_mapping(r.get("train")).get("batches")) for r in recent)
    if batches < rules.MIN_BATCHES:
        return Text(f"verdict: waiting for {rules.MIN_BATCHES} timed batches in the last "
                    f"{len(recent)} intervals ({batches} so far)", style="dim")
    v = diagnose([dict(r) for r in recent], {"cpus": os.cpu_count(), "storage": storage or []})
    t = Text("verdict now: ", style="bold")
    t.append(v.cls, style=_SEVERITY_STYLE.get(v.severity, "bold"))
    if v.data_wait_share is not None:
        t.append(f" (data wait {v.data_wait_share * 100:.0f}%, {v.severity})")
    room = width - len(t.plain) - 3
    if v.evidence and room >= 12:  # the evidence only where it fits on the line
        t.append(f" - {_shorten(v.evidence[0], room)}")
    return t


_SEVERITY_STYLE = {"high": "bold red", "moderate": "bold yellow", "none": "bold green"}


def pipeline_text(record: Record, *, width: int = 120) -> Text | None:
    """The input pipeline of ``record``'s interval, timed inside the workers, in one line:
    the fetch per sample and its CPU and blocked shares, the collate and hand-over per
    batch, the workers' idle share, and the requests waiting on each FUSE mount that
    serves the dataset. None when the interval has none of these."""
    p = _mapping(_mapping(record.get("train")).get("pipeline"))
    parts: list[str] = []
    batches, samples = _num(p.get("batches")), _num(p.get("samples"))
    fetch, cpu = _num(p.get("fetch_s")), _num(p.get("fetch_cpu_s"))
    if batches and batches > 0:
        if fetch is not None and samples and samples > 0:
            text = f"fetch {fetch / samples * 1000:.1f} ms/sample"
            if cpu is not None and fetch > 0:
                share = min(1.0, max(0.0, cpu / fetch))
                text += f" ({share * 100:.0f}% CPU, {(1 - share) * 100:.0f}% blocked)"
            parts.append(text)
        collate = _num(p.get("collate_s"))
        if collate is not None:
            parts.append(f"collate {collate / batches * 1000:.1f} ms")
    hand = _mapping(p.get("handover"))
    count, hand_s = _num(hand.get("count")), _num(hand.get("sum_s"))
    if count and count > 0 and hand_s is not None:
        parts.append(f"hand-over {hand_s / count * 1000:.1f} ms/batch")
    idle = _num(p.get("idle_s"))
    if batches and batches > 0 and p.get("in_process") is not True and idle is not None:
        busy = (fetch or 0.0) + (_num(p.get("collate_s")) or 0.0) + idle
        if busy > 0:
            parts.append(f"workers idle {idle / busy * 100:.0f}%")
    elif p.get("in_process") is True and parts:
        parts.append("in the training process (num_workers=0)")
    for mount, fig in _mapping(record.get("storage")).items():
        waiting = _num(_mapping(fig).get("waiting"))
        if waiting is not None:
            parts.append(f"FUSE {printable(str(mount))}: {waiting:.0f} requests waiting")
    if not parts:
        return None
    return Text(_shorten("pipeline: " + ", ".join(parts), max(20, width)))


def devices_table(history: History, watch: Mapping[str, str], *, width: int = 120,
                  max_rows: int | None = None, plain: bool = False) -> RenderableType:
    """One row per watched device: the latest iostat figures and a %util sparkline."""
    latest = history.latest
    current = _mapping(latest.get("devices")) if latest is not None else {}
    names = list(watch) + [n for n in current if n not in watch]
    if not names:
        return Text("devices: none watched (give --device D or --path P)", style="dim")
    spark_len = max(0, min(SPARK_LENGTH, width - _DEVICE_FIXED))
    show_spark = spark_len >= _MIN_SPARK
    show_why = width - _DEVICE_FIXED - spark_len >= _MIN_WHY and bool(watch)
    table = Table(box=None, padding=(0, 0, 0, 1), pad_edge=False, show_edge=False,
                  header_style="bold underline", expand=False)
    # rich marks a cut with "…"; where the output is not UTF-8 it is cropped instead.
    cut: Literal["crop", "ellipsis"] = "crop" if plain else "ellipsis"
    table.add_column("Device", no_wrap=True, overflow=cut, max_width=_DEVICE_NAME_MAX)
    # Narrower than the full table: only what says "saturated" (MB/s, r_await, %util).
    columns = _DEVICE_COLUMNS if width >= _DEVICE_FIXED else _DEVICE_COLUMNS_NARROW
    for heading in columns:
        table.add_column(heading, justify="right", no_wrap=True, overflow=cut)
    if show_spark:
        heading = f"%util, last {spark_len}"
        if len(heading) > spark_len:
            heading = "%util"
        table.add_column(heading, no_wrap=True, overflow="crop", min_width=spark_len,
                         max_width=spark_len)
    if show_why:
        table.add_column("watched because", no_wrap=True, overflow=cut,
                         max_width=max(_MIN_WHY, width - _DEVICE_FIXED - spark_len - 2))
    shown = names
    hidden = 0
    if max_rows is not None and len(names) > max_rows:
        # Too many for the screen: keep the busiest, in their watch order.
        keep = max(1, max_rows - 1)
        busiest = sorted(names, key=lambda n: -(_num(_mapping(current.get(n)).get("util"))
                                                 or 0.0))[:keep]
        chosen = set(busiest)
        shown = [n for n in names if n in chosen]
        hidden = len(names) - len(shown)
    dash = "-" if plain else "—"
    for name in shown:
        d = _mapping(current.get(name))
        util = _num(d.get("util"))
        rkb, wkb = _num(d.get("rkB_s")), _num(d.get("wkB_s"))
        r_await, w_await = _num(d.get("r_await")), _num(d.get("w_await"))
        cells: dict[str, RenderableType] = {
            "rMB/s": _fmt(None if rkb is None else rkb / 1024, ".1f", dash),
            "wMB/s": _fmt(None if wkb is None else wkb / 1024, ".1f", dash),
            "r/s": _fmt_rate(_num(d.get("r_s")), dash),
            "w/s": _fmt_rate(_num(d.get("w_s")), dash),
            "r_await": Text(_fmt(r_await, ".2f", dash), style=_await_style(r_await)),
            "w_await": Text(_fmt(w_await, ".2f", dash), style=_await_style(w_await)),
            "aqu-sz": _fmt(_num(d.get("aqu_sz")), ".2f", dash),
            "%util": Text(_fmt(util, ".1f", dash), style=_util_style(util)),
        }
        row: list[RenderableType] = [name, *(cells[c] for c in columns)]
        if show_spark:
            values = [_num(_mapping(_mapping(r.get("devices")).get(name)).get("util"))
                      for r in history]
            row.append(Text(sparkline(values, spark_len, top=100.0, plain=plain),
                            style=_util_style(util) or "blue"))
        if show_why:
            row.append(Text(printable(watch.get(name, "")), style="dim"))
        table.add_row(*row)
    if hidden:
        table.add_row(Text(f"+{hidden} more", style="dim"))
    if not current and latest is not None:
        return Group(table, Text("no device figures in this interval (device statistics "
                                 "unavailable, or the devices vanished)", style="dim"))
    return table


def job_panel(history: History, header: Header, *, plain: bool = False) -> Panel:
    """The watched process tree: disk and syscall reads and writes, page-cache hit, CPU, pids."""
    title = "job"
    latest = history.latest
    job = _mapping(latest.get("job")) if latest is not None else {}
    dash = "-" if plain else "—"
    if header.pid is None and not job:
        return _panel(title, Text("no process watched\n(iolens top --pid PID)", style="dim"))
    if latest is None:
        return _panel(title, Text("waiting for the first interval", style="dim"))
    if not job or not _num(job.get("pids")):
        who = f"process {header.pid}" if header.pid is not None else "the process"
        return _panel(title, Text(f"{who} not found (exited?)", style="dim"))
    roles = _mapping(job.get("roles"))
    worker = _mapping(roles.get("worker"))
    grid = _grid(plain)
    read = _num(job.get("read_bytes_s"))
    reads = [_num(_mapping(r.get("job")).get("read_bytes_s")) for r in history]
    top = max((v for v in reads if v is not None), default=0.0)
    grid.add_row("disk read", Text.assemble(
        f"{_fmt(_mb(read), '.1f', dash)} MB/s ",
        (sparkline(reads, _PANEL_SPARK, top=top or 1.0, plain=plain), "blue")))
    grid.add_row("disk write", f"{_fmt(_mb(_num(job.get('write_bytes_s'))), '.1f', dash)} MB/s")
    grid.add_row("read()", f"{_fmt(_mb(_num(job.get('rchar_s'))), '.1f', dash)} MB/s")
    if worker and "cache_hit" in worker:
        hit, source = _num(worker.get("cache_hit")), "workers"
    else:
        hit, source = _num(job.get("cache_hit")), "job"
    if _mapping(latest.get("storage")):
        # The dataset is on FUSE or NFS: its reads never count in read_bytes, so
        # 1 - read_bytes/rchar would claim a cache hit it cannot see.
        grid.add_row("cache hit", Text(f"{dash} (not seen on FUSE/NFS)", style="dim"))
    else:
        grid.add_row("cache hit", dash if hit is None else f"{hit * 100:.1f}% ({source})")
    cpu_parts = []
    for role in ("main", "worker", "other"):
        r = _mapping(roles.get(role))
        if r:
            label = "workers" if role == "worker" else role
            cpu_parts.append(f"{label} {_fmt(_num(r.get('cpu_pct')), '.0f', dash)}%")
    if not cpu_parts:
        cpu_parts.append(f"{_fmt(_num(job.get('cpu_pct')), '.0f', dash)}%")
    grid.add_row("CPU", ", ".join(cpu_parts))
    pid_parts = [f"{_int(_mapping(roles.get(role)).get('pids'))} {label}"
                 for role, label in (("main", "main"), ("worker", "workers"), ("other", "other"))
                 if _mapping(roles.get(role))]
    grid.add_row("pids", ", ".join(pid_parts) or f"{_int(job.get('pids'))}")
    waiting = _int(_mapping(job.get("states")).get("D"))
    if waiting:
        grid.add_row("in D state", Text(f"{waiting} (waiting on I/O)", style="yellow"))
    if job.get("io_readable") is False:
        grid.add_row("", Text("some /proc/<pid>/io unreadable (permissions)", style="yellow"))
    return _panel(title, grid)


def training_panel(history: History, header: Header, *, plain: bool = False) -> Panel:
    """The training loop: steps per second, share of step time waiting for data, percentiles."""
    title = "training"
    dash = "-" if plain else "—"
    if history.batches == 0:
        if header.run_dir is None:
            why = "no DataLoader timing here:\n`iolens run -- CMD` times it"
        else:
            why = "no DataLoader batch timed yet"
        return _panel(title, Text(why, style="dim"))
    latest = history.latest
    train = _mapping(latest.get("train")) if latest is not None else {}
    grid = _grid(plain)
    interval = _num(latest.get("interval_s")) if latest is not None else None
    step = _mapping(train.get("step"))
    wait = _mapping(train.get("data_wait"))
    count = _num(step.get("count"))
    if count is None:
        count = _num(train.get("batches"))
    rate = count / interval if count is not None and interval else None
    rates = [_steps_per_s(r) for r in history]
    top = max((v for v in rates if v is not None), default=0.0)
    grid.add_row("steps/s", Text.assemble(
        f"{_fmt(rate, '.1f', dash)} ", (sparkline(rates, _PANEL_SPARK, top=top or 1.0, plain=plain),
                                        "blue")))
    # The share over the recent window is the steadiest figure, so it carries the severity.
    window = history.window_wait_share()
    if window is None:
        grid.add_row("data wait", dash)
    else:
        sev = severity(window)
        grid.add_row("data wait", Text(f"{window * 100:.1f}% ({sev})",
                                       style=_SEVERITY_STYLE[sev]))
    now = _num(train.get("data_wait_share"))
    grid.add_row("wait now", dash if now is None else f"{now * 100:.1f}%")
    total = history.wait_share
    grid.add_row("wait total", dash if total is None else f"{total * 100:.1f}%")
    if _num(wait.get("count")):
        grid.add_row("wait p50/p95", f"{_ms(wait.get('p50_s'))} / {_ms(wait.get('p95_s'))} ms")
    if _num(step.get("count")):
        grid.add_row("step p50/p95", f"{_ms(step.get('p50_s'))} / {_ms(step.get('p95_s'))} ms")
    grid.add_row("batches", str(history.batches))
    grid.add_row("epochs", str(history.epochs))
    esw = _mapping(train.get("epoch_start_wait"))
    if _num(esw.get("count")):
        grid.add_row("epoch start", f"first batch waited {_ms(esw.get('max_s'))} ms")
    waiting = _num(train.get("waiting_s"))
    if waiting:  # NOTE [no batch for a while] in iolens/recorder/sampler.py
        grid.add_row("no batch", Text(f"for {waiting:.0f} s (in next())", style="bold red"))
    return _panel(title, grid)


def cpu_panel(history: History, *, plain: bool = False) -> Panel:
    """System CPU (user, system, iowait, idle, steal) and page-cache memory."""
    title = "CPU & memory"
    dash = "-" if plain else "—"
    latest = history.latest
    cpu = _mapping(latest.get("cpu")) if latest is not None else {}
    mem = _mapping(latest.get("mem")) if latest is not None else {}
    if not cpu and not mem:
        what = "waiting for the first interval" if latest is None else "no CPU figures"
        return _panel(title, Text(what, style="dim"))
    grid = _grid(plain)
    if cpu:
        grid.add_row("user / sys", f"{_fmt(_num(cpu.get('user')), '.1f', dash)}% / "
                                   f"{_fmt(_num(cpu.get('system')), '.1f', dash)}%")
        iowait = _num(cpu.get("iowait"))
        waits = [_num(_mapping(r.get("cpu")).get("iowait")) for r in history]
        grid.add_row("iowait", Text.assemble(
            (f"{_fmt(iowait, '.1f', dash)}% ", "yellow" if (iowait or 0) >= 10 else ""),
            (sparkline(waits, _PANEL_SPARK, top=100.0, plain=plain), "blue")))
        idle = f"{_fmt(_num(cpu.get('idle')), '.1f', dash)}%"
        steal = _num(cpu.get("steal"))
        if steal:
            idle += f", steal {steal:.1f}%"
        grid.add_row("idle", idle)
    else:
        grid.add_row("CPU", Text("unavailable", style="dim"))
    if mem:
        grid.add_row("page cache", _size(mem.get("cached_bytes"), dash))
        grid.add_row("dirty / wb", f"{_size(mem.get('dirty_bytes'), dash)} / "
                                   f"{_size(mem.get('writeback_bytes'), dash)}")
        grid.add_row("available", _size(mem.get("available_bytes"), dash))
    return _panel(title, grid)


def gpu_panel(history: History, header: Header, *, plain: bool = False) -> Panel:
    """Each GPU's utilization (with history) and memory, or why there is none."""
    title = "GPU"
    dash = "-" if plain else "—"
    latest = history.latest
    gpus = latest.get("gpu") if latest is not None else None
    if not isinstance(gpus, Sequence) or isinstance(gpus, str | bytes):
        if latest is None and header.gpu_reason is None:
            return _panel(title, Text("waiting for the first interval", style="dim"))
        return _panel(title, Text(header.gpu_reason or "no GPU figures (NVML not in use)",
                                  style="dim"))
    if not gpus:
        return _panel(title, Text("NVML found no GPU", style="dim"))
    grid = _grid(plain)
    for pos, entry in enumerate(gpus):
        g = _mapping(entry)
        index = _int(g.get("index")) if "index" in g else pos
        if "error" in g:
            grid.add_row(f"GPU{index}", Text(_shorten(str(g["error"]), 40), style="red"))
            continue
        util = _num(g.get("util_pct"))
        history_values: list[float | None] = []
        for r in history:
            rec_gpus = r.get("gpu")
            match = None
            if isinstance(rec_gpus, Sequence) and not isinstance(rec_gpus, str | bytes):
                match = next((_mapping(x) for x in rec_gpus
                              if _mapping(x).get("index", None) == g.get("index")), None)
            history_values.append(_num(match.get("util_pct")) if match else None)
        used, total = _gib(g.get("mem_used_bytes")), _gib(g.get("mem_total_bytes"))
        grid.add_row(f"GPU{index}", Text.assemble(
            f"{_fmt(util, '.0f', dash)}% ",
            (sparkline(history_values, _PANEL_SPARK, top=100.0, plain=plain), "blue")))
        grid.add_row("  memory", f"{_fmt(used, '.1f', dash)} / {_fmt(total, '.1f', dash)} GiB")
        job_pids = g.get("job_pids")
        if isinstance(job_pids, Sequence) and job_pids and not isinstance(job_pids, str):
            grid.add_row("  job", _job_gpu_memory(g, list(job_pids), dash))
    return _panel(title, grid)


def _job_gpu_memory(gpu: Mapping[str, Any], job_pids: list[Any], dash: str) -> str:
    """How many of the job's processes use this GPU, and the memory they hold where known."""
    pids, mems = gpu.get("pids"), gpu.get("proc_mem_bytes")
    held = 0.0
    known = False
    if isinstance(pids, Sequence) and isinstance(mems, Sequence):
        for pid, mem in zip(pids, mems, strict=False):
            n = _num(mem)
            if pid in job_pids and n is not None:
                held += n
                known = True
    text = f"{len(job_pids)} pid{'s' if len(job_pids) != 1 else ''}"
    return f"{text}, {held / GIB:.1f} GiB" if known else f"{text}, memory {dash}"


def panel_grid(history: History, header: Header, *, width: int = 120,
               plain: bool = False) -> RenderableType:
    """The four panels: side by side when wide, two by two, or one above the other."""
    panels = [job_panel(history, header, plain=plain),
              training_panel(history, header, plain=plain),
              cpu_panel(history, plain=plain),
              gpu_panel(history, header, plain=plain)]
    if width >= _MEDIUM:
        per_row = 4 if width >= _WIDE else 2
        grid = Table.grid(expand=True)
        for _ in range(per_row):
            grid.add_column(ratio=1)
        for i in range(0, len(panels), per_row):
            grid.add_row(*panels[i:i + per_row])
        return grid
    return Group(*panels)


def sparkline(values: Sequence[float | None], length: int = SPARK_LENGTH, *,
              top: float = 100.0, plain: bool = False) -> str:
    """The last ``length`` values as block characters scaled to ``top``, right-aligned.

    A missing value is a space; values are clamped to 0..top.
    """
    blocks = _ASCII_BLOCKS if plain else _BLOCKS
    tail = list(values)[-length:] if length > 0 else []
    scale = top if top > 0 else 1.0
    chars = []
    for v in tail:
        if v is None or not math.isfinite(v):
            chars.append(" ")
            continue
        frac = min(1.0, max(0.0, v / scale))
        chars.append(blocks[min(len(blocks) - 1, int(frac * (len(blocks) - 1) + 0.5))])
    return "".join(chars).rjust(length)


# -- small helpers -----------------------------------------------------------------


def _panel(title: str, body: RenderableType) -> Panel:
    return Panel(body, title=title, title_align="left", box=box.ROUNDED, padding=(0, 1))


def _grid(plain: bool) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True, overflow="crop" if plain else "ellipsis")
    grid.add_column(overflow="fold")
    return grid


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _num(value: Any) -> float | None:
    """A finite number, or None for anything else (missing, text, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _int(value: Any) -> int:
    n = _num(value)
    return int(n) if n is not None else 0


def _fmt(value: float | None, spec: str, dash: str) -> str:
    return dash if value is None else format(value, spec)


def _fmt_rate(value: float | None, dash: str) -> str:
    if value is None:
        return dash
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _mb(value: float | None) -> float | None:
    return None if value is None else value / MIB


def _size(value: Any, dash: str) -> str:
    """Bytes as MiB under a GiB, else GiB."""
    n = _num(value)
    if n is None:
        return dash
    return f"{n / MIB:.0f} MiB" if n < GIB else f"{n / GIB:.1f} GiB"


def _gib(value: Any) -> float | None:
    n = _num(value)
    return None if n is None else n / GIB


def _ms(value: Any) -> str:
    n = _num(value)
    if n is None:
        return "-"
    ms = n * 1000
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _steps_per_s(rec: Record) -> float | None:
    train = _mapping(rec.get("train"))
    interval = _num(rec.get("interval_s"))
    if not train or not interval:
        return None
    count = _num(_mapping(train.get("step")).get("count"))
    if count is None:
        count = _num(train.get("batches"))
    return None if count is None else count / interval


def _util_style(util: float | None) -> str:
    if util is None:
        return ""
    if util >= _UTIL_HOT:
        return "bold red"
    return "yellow" if util >= _UTIL_WARM else ""


def _await_style(ms: float | None) -> str:
    if ms is None:
        return ""
    if ms >= _AWAIT_HOT:
        return "bold red"
    return "yellow" if ms >= _AWAIT_WARM else ""


def _clock(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _shorten(text: str, limit: int) -> str:
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= limit else one_line[:limit - 3] + "..."
