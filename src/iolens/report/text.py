"""``iolens report --format text``: the report for a terminal, drawn with rich.

Every string that comes from the run (commands, paths, device names,
evidence) goes in as a ``Text``, never as markup, so a name with brackets
prints as it is.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from iolens.analysis.verdict.result import try_label
from iolens.core.words import plural
from iolens.training import overrides

_SEVERITY_STYLE = {"high": "bold red", "moderate": "bold yellow", "none": "bold green",
                   "unknown": "bold"}


def _ms(v: Any) -> str:
    return f"{float(v) * 1000:.1f}" if isinstance(v, (int, float)) else "-"


def _f(v: Any, fmt: str = ".1f") -> str:
    return format(float(v), fmt) if isinstance(v, (int, float)) else "-"


def _bullets(items: Sequence[tuple[str, RenderableType]], indent: int = 2) -> Table:
    """Marked items (``-``, ``1.``) whose wrapped lines align under their text, not under
    the marker: a grid of the marker and the text."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for marker, text in items:
        grid.add_row(" " * indent + marker, text)
    return grid


def _titled(title: str, body: RenderableType, caption: str | None = None) -> Group:
    """A table under a title of its own line, and its caption below: a title of the
    table's own wraps at the table's width, and word by word only on the console's."""
    parts: list[RenderableType] = [Text(title, style="bold", overflow="fold"), body]
    if caption:
        parts.append(Text(caption, style="dim", overflow="fold"))
    return Group(*parts)


def _verdict(report: dict[str, Any]) -> RenderableType:
    v = report["verdict"]
    sev = str(v.get("severity"))
    head = Text()
    head.append(str(v.get("class")), style=_SEVERITY_STYLE.get(sev, "bold"))
    if v.get("data_wait_share") is not None:
        head.append(f"  data wait {v['data_wait_share'] * 100:.1f}% of step time ")
        head.append(f"({sev})", style=_SEVERITY_STYLE.get(sev, ""))
    if v.get("devices"):
        head.append("  device: " + ", ".join(map(str, v["devices"])))
    parts: list[RenderableType] = [head, Text("")]
    if v.get("caveat"):
        # What the verdict could not see (e.g. no device statistics) comes first.
        parts += [Text(f"note: {v['caveat']}", style="yellow"), Text("")]
    parts.append(Text("Evidence", style="bold"))
    parts.append(_bullets([("-", Text(str(e))) for e in v.get("evidence") or []]))
    if v.get("recommendations"):
        parts += [Text(""), Text("What to do", style="bold")]
        items: list[tuple[str, RenderableType]] = []
        for i, rec in enumerate(v["recommendations"], 1):
            sep = "; " if rec.get("prediction") else "; expected: "
            text = Text(str(rec.get("action")))
            text.append(f"\nbecause {rec.get('because')}{sep}{rec.get('expected_gain')}",
                        style="dim")
            if rec.get("try"):
                text.append(f"\n{try_label(rec)}: command {i} at the end of this report")
            items.append((f"{i}.", text))
        parts.append(_bullets(items))
        declined = []
        for rec in v.get("declined") or []:
            why = (rec.get("expected_gain") if rec.get("prediction")
                   else rec.get("prediction_unavailable"))
            declined.append(("-", Text(f"{rec.get('action')} ({why})", style="dim")))
        if declined:
            parts += [Text("Not advised", style="bold"), _bullets(declined)]
    return Panel(Group(*parts), title="verdict", title_align="left")


def _findings(report: dict[str, Any]) -> RenderableType | None:
    fs = report.get("findings") or []
    if not fs:
        return None
    parts: list[RenderableType] = [Text("findings", style="bold")]
    for f in fs:
        recs = f.get("recommendations") or []
        items: list[tuple[str, RenderableType]] = [
            ("-", Text(str(e))) for e in f.get("evidence") or []]
        if recs:
            items.append(("try:", Text(str(recs[0].get("action")))))
        parts += [Text("  " + str(f.get("class")), style="bold"), _bullets(items, indent=4)]
    return Group(*parts)


def _training(report: dict[str, Any]) -> RenderableType:
    tr = report["training"]
    figures = (report.get("verdict") or {}).get("figures") or {}
    if not tr.get("batches") and figures.get("steps"):
        return Text(f"training: {plural(figures['steps'], 'step')} timed between calls of "
                    "iolens.step(), "
                    f"{_f(figures.get('steps_per_s'), '.2f')} steps/s, median step "
                    f"{_ms(figures.get('step_p50_s'))} ms; no batch timed")
    t = Table()
    for col in ("ms per batch", "mean", "p50", "p95", "max"):
        t.add_column(col, justify="right" if col != "ms per batch" else "left")
    for label, key in (("data wait", "data_wait"), ("step", "step")):
        d = tr.get(key) or {}
        t.add_row(label, _ms(d.get("mean_s")), _ms(d.get("p50_s")), _ms(d.get("p95_s")),
                  _ms(d.get("max_s")))
    return _titled(f"training: {plural(tr.get('batches') or 0, 'batch', 'batches')}, "
                   f"{plural(tr.get('epochs') or 0, 'epoch')}, "
                   f"{_f(tr.get('steps_per_s'), '.2f')} steps/s", t,
                   f"distributions from {tr.get('distribution_source')}")


def _devices(report: dict[str, Any]) -> RenderableType | None:
    devs = report.get("devices") or {}
    if not devs:
        return None
    # No vertical rules, and columns that never wrap or cut: the ten fit in 80 columns.
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("device", "%util", "max", "rMB/s", "wMB/s", "r/s", "r_await", "w_await",
                "aqu-sz", "rareq KiB"):
        t.add_column(col, justify="left" if col == "device" else "right", no_wrap=True)
    for name, d in devs.items():
        t.add_row(Text(name), _f(d.get("util_pct")), _f(d.get("util_max_pct"), ".0f"),
                  _f(d.get("read_MBps"), ".2f"), _f(d.get("write_MBps"), ".2f"),
                  _f(d.get("r_s")), _f(d.get("r_await_ms"), ".2f"),
                  _f(d.get("w_await_ms"), ".2f"), _f(d.get("aqu_sz"), ".2f"),
                  _f(d.get("rareq_kib")))
    # Why each is watched, below: a sentence with a path, too long for a column.
    why = _bullets([(f"{name}:", Text(str(d.get("why") or "-")))
                    for name, d in devs.items()])
    return Group(_titled("devices (means over the run)", t), Text("why watched", style="dim"),
                 why)


def _processes(report: dict[str, Any]) -> RenderableType | None:
    procs = report.get("processes") or {}
    if not procs:
        return None
    t = Table()
    for col in ("role", "processes", "CPU %", "read MB/s", "write MB/s", "rchar MB/s",
                "cache hit"):
        t.add_column(col, justify="left" if col == "role" else "right")
    note = None
    for role, d in procs.items():
        hit = d.get("cache_hit")
        note = note or d.get("cache_hit_note")
        t.add_row(Text(role), str(d.get("pids_max")), _f(d.get("cpu_pct")),
                  _f(d.get("read_MBps"), ".2f"), _f(d.get("write_MBps"), ".2f"),
                  _f(d.get("read_rchar_MBps"), ".2f"),
                  f"{hit * 100:.0f}%" if isinstance(hit, (int, float)) else "-")
    return _titled("the job's processes", t, f"cache hit not shown: {note}" if note else None)


_STAGES = (("fetch on CPU", "fetch_cpu_s", "#"), ("fetch blocked", "fetch_blocked_s", "="),
           ("collate", "collate_s", "c"), ("hand-over", "handover_s", "h"),
           ("idle", "idle_s", "."))
_STAGE_ROWS = 12
_BAR = 40


def _autotune(report: dict[str, Any]) -> RenderableType | None:
    """``iolens run --autotune``: each epoch's settings, prediction, rate and decision."""
    loaders = report.get("autotune")
    if not loaders:
        return None
    parts: list[RenderableType] = [Text("autotune (iolens run --autotune)", style="bold")]
    for t in loaders:
        if t.get("refused"):
            parts.append(Text(f"  {t['dataset']}: left as it is: {t['refused']}"))
            continue
        table = Table(box=None, padding=(0, 1))
        for col in ("epoch", "settings", "predicted steps/s", "measured steps/s", "decision"):
            table.add_column(col, justify="right" if "steps" in col or col == "epoch"
                             else "left")
        for e in t["epochs"]:
            pred = (f"{_f(e['predicted'])} ({_f(e['low'])}-{_f(e['high'])})"
                    if e["predicted"] is not None else "-")
            table.add_row(str(e["epoch"]), Text(e["settings"]), pred, _f(e["steps_per_s"]),
                          Text(e["decision"]))
        parts += [Text(f"  {t['dataset']}"), table]
        if t.get("code"):
            parts.append(Text(f"  ended on {t['code']}"
                              + (f" ({t['settled']})" if t.get("settled") else "")
                              + ": write it into the code"))
    return Group(*parts)


def _pipeline(report: dict[str, Any]) -> RenderableType | None:
    """The input pipeline from inside the workers, and its stage split over time."""
    p = report.get("pipeline")
    if not isinstance(p, dict):
        return None
    who = "training process (num_workers=0)" if p.get("in_process") else "DataLoader workers"
    t = Table()
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = (("fetch per sample", _ms(p.get("fetch_s_per_sample")) + " ms"),
            ("  on CPU", _pct(p.get("fetch_cpu_share"))),
            ("  waiting for a core (the cores busy)", _pct(p.get("fetch_queue_share"))),
            ("  blocked off CPU (I/O, network, locks, sleeps)", _pct(p.get("fetch_blocked_share"))),
            ("collate per batch", _ms(p.get("collate_s_per_batch")) + " ms"),
            ("hand-over per batch (queue, unpickling, pin_memory)",
             _ms(p.get("handover_s_per_batch")) + " ms"),
            ("workers idle (waiting for the loop to ask)", _pct(p.get("worker_idle_share"))),
            (f"read per sample ({p.get('bytes_source') or 'rchar'})",
             _kib(p.get("bytes_per_sample"))),
            ("files opened per sample", _f(p.get("files_per_sample"), ".2f")))
    for label, value in rows:
        t.add_row(label, value)
    head = _titled(f"input pipeline, timed inside the {who}: {p.get('samples')} samples in "
                   f"{p.get('batches')} batches", t)
    stages = [x for x in p.get("stages") or [] if isinstance(x, dict)]
    if not stages:
        return head
    # The stage split over time: one bar per stretch of the run, ms per batch.
    step = max(1, -(-len(stages) // _STAGE_ROWS))
    chunks = [stages[i:i + step] for i in range(0, len(stages), step)]
    means = [{k: sum(float(x.get(k) or 0) for x in c) / len(c) for _, k, _ in _STAGES}
             for c in chunks]
    top = max((sum(m.values()) for m in means), default=0.0) or 1.0
    chart = Table(show_header=True)
    chart.add_column("at")
    chart.add_column("ms per batch", justify="right")
    chart.add_column("split")
    for c, m in zip(chunks, means, strict=True):
        total = sum(m.values())
        bar = "".join(ch * round(m[k] / top * _BAR) for _, k, ch in _STAGES)
        chart.add_row(_clock(float(c[0].get("elapsed_s") or 0)), f"{total * 1000:.1f}",
                      Text(bar))
    legend = ", ".join(f"{name} ({ch})" for name, _, ch in _STAGES)
    return Group(head, _titled("stage split per batch over time", chart, legend))


def _storage(report: dict[str, Any]) -> RenderableType | None:
    served = [s for s in report.get("storage") or [] if isinstance(s, dict)]
    if not served:
        return None
    t = Table()
    for col in ("mount", "kind", "role", "type", "device"):
        t.add_column(col, overflow="fold")
    items: list[tuple[str, RenderableType]] = []
    for s in served:
        folders = [str(f) for f in s.get("folders") or []]
        more = int(s.get("more_folders") or 0)
        t.add_row(Text(str(s.get("mount"))), Text(str(s.get("kind") or "-")),
                  Text(str(s.get("role") or "dataset")), Text(str(s.get("fstype"))),
                  Text(str(s.get("device") or "none")))
        if folders:
            items.append(("-", Text(f"{s.get('mount')}: " + ", ".join(folders)
                                    + (f" and {more} more" if more else ""))))
        elif s.get("peer"):
            server = (f", served by {s.get('server') or 'a process'} (pid {s['server_pid']}) "
                      "on this machine" if s.get("server_pid") else "")
            items.append(("-", Text(f"{s.get('mount')}: peer {s['peer']}{server}")))
    out: list[RenderableType] = [_titled(
        "what serves the dataset (the files and connections of the job's processes)", t)]
    if items:
        out += [Text("read there", style="dim"), _bullets(items)]
    return Group(*out)


def _pct(v: Any) -> str:
    return f"{float(v) * 100:.0f}%" if isinstance(v, (int, float)) else "-"


def _kib(v: Any) -> str:
    return f"{float(v) / 1024:.1f} KiB" if isinstance(v, (int, float)) else "-"


def _clock(seconds: float) -> str:
    m, sec = divmod(max(0, round(seconds)), 60)
    return f"{m:02d}:{sec:02d}"


def _gpus(report: dict[str, Any]) -> RenderableType:
    g = report.get("gpus") or {}
    if not g.get("gpus"):
        return Text(f"GPU: none recorded ({g.get('reason') or 'no GPU'})", style="dim")
    t = Table(title="GPUs", title_justify="left")
    for col in ("GPU", "name", "util %", "max", "memory used (max)"):
        t.add_column(col, justify="left" if col in ("GPU", "name") else "right")
    for x in g["gpus"]:
        t.add_row(str(x.get("index")), Text(str(x.get("name") or "")), _f(x.get("util_pct")),
                  _f(x.get("util_max_pct"), ".0f"),
                  f"{x.get('mem_used_max_bytes', 0) / 2**30:.2f} / "
                  f"{x.get('mem_total_bytes', 0) / 2**30:.0f} GiB")
    return t


def render(report: dict[str, Any]) -> RenderableType:
    """The whole text report as one renderable."""
    run = report["run"]
    cmd = run.get("command")
    title = Text()
    title.append("iolens report ", style="bold")
    title.append(str(run.get("path")))
    lines: list[RenderableType] = [title]
    if isinstance(cmd, list):
        lines.append(Text("command: " + shlex.join(map(str, cmd))))
    lines.append(Text(
        f"host {run.get('host') or '-'}, started {run.get('start') or '-'}, "
        f"{_f(run.get('duration_s'))} s, {run.get('intervals')} intervals of "
        f"{_f(run.get('interval_s'), 'g')} s"
        + (f" (read as {run['buckets']} buckets of {_f(run.get('bucket_s'), 'g')} s)"
           if run.get("buckets") else "")
        + (f", exit code {run['exit_code']}" if run.get("exit_code") is not None else "")))
    if isinstance(run.get("set"), dict) and run["set"]:
        lines.append(Text("DataLoader settings given (--set): "
                          + overrides.line(run["set"])
                          + "".join(f" --set-loader {n}" for n in run.get("set_loaders") or [])))
    parts: list[RenderableType] = [Group(*lines), _verdict(report)]
    ranks = _ranks_table(report["training"].get("ranks") or [], "ranks (torchrun)")
    for part in (_findings(report), _autotune(report), _training(report), _pipeline(report),
                 ranks,
                 _storage(report), _devices(report), _processes(report), _gpus(report)):
        if part is not None:
            parts.append(part)
    cpu = report.get("cpu") or {}
    if any(v is not None for v in cpu.values()):
        parts.append(Text("machine CPU: " + ", ".join(
            f"{k} {_f(v)}%" for k, v in cpu.items() if v is not None)))
    if report.get("notes"):
        parts.append(Text("notes", style="bold"))
        parts += [Text(f"  - {n}") for n in report["notes"]]
    return Group(*parts)


_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(value: Any) -> Any:
    """``value`` with every string's control characters shown as ``\\xNN`` escapes.

    A recorded string (a command line, a path, a device name) may hold an
    ESC that would drive the terminal (retitle it, hide text, move the
    cursor) or a bidi override that reorders what is shown: neither reaches
    the terminal raw. Newlines and tabs stay.
    """
    if isinstance(value, str):
        return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], value)
    if isinstance(value, dict):
        return {printable(k): v if type(v) in _PLAIN else printable(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [v if type(v) in _PLAIN else printable(v) for v in value]
    return value


_PLAIN = frozenset((float, int, bool, type(None)))
"""What :func:`printable` hands back as it is, with no call (a week's report holds 79,000
figures)."""


def print_report(report: dict[str, Any], console: Console) -> None:
    """Print the report to ``console`` (a file or the terminal); see :func:`printable`.
    The ``iolens run --set`` commands of the recommendations follow, each on one line
    whatever its length: they are copied as they are."""
    console.print(render(printable(report)))
    recs = (report.get("verdict") or {}).get("recommendations") or []
    tries = [(i, r["try"]) for i, r in enumerate(recs, 1) if isinstance(r, dict) and r.get("try")]
    if tries:
        console.print(Text("with no code change", style="bold"))
        for i, cmd in tries:
            console.print(f"  {i}. {cmd}", soft_wrap=True, markup=False, highlight=False)
        gone = missing_paths((cmd for _, cmd in tries), local_folders(report))
        if gone:
            needs = "the command needs" if len(tries) == 1 else "the commands need"
            console.print(f"  (gone from this machine now: {', '.join(gone)}; {needs} "
                          f"{'it' if len(gone) == 1 else 'them'} where "
                          f"{'it runs' if len(tries) == 1 else 'they run'})",
                          soft_wrap=True, markup=False, highlight=False)


CGROUPS = "/sys/fs/cgroup/"


def local_folders(report: dict[str, Any]) -> list[str]:
    """The folders the run read its dataset in, on storage a stat answers at once (not a
    FUSE, NFS or network store, whose mount may hang a stat once its server is gone)."""
    out: list[str] = []
    for entry in report.get("storage") or []:
        if isinstance(entry, dict) and entry.get("kind") not in ("fuse", "nfs", "network"):
            out += [f for f in entry.get("folders") or [] if isinstance(f, str)]
    return out


def missing_paths(commands: Iterable[str], folders: Sequence[str]) -> list[str]:
    """The paths the commands name (an argument, or an option's ``=`` value) that do not
    exist now, each once: among the run's dataset ``folders`` (one of them, in one or
    above one) and cgroups, such as the demo's slow disk and its cgroup, removed at the
    demo's end. Other paths are left alone: an output the command makes, a pattern
    (``shard-{000..146}.tar``), a list."""
    out: list[str] = []
    for cmd in commands:
        try:
            words = shlex.split(cmd)
        except ValueError:  # (unbalanced quotes: a command the report did not write)
            continue
        for word in words:
            path = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
            if (not path.startswith("/") or path in out or any(c in path for c in "{}*?[],")
                    or not _the_runs(os.path.normpath(path), folders)):
                continue
            if not os.path.exists(path):
                out.append(path)
    return out


def _the_runs(path: str, folders: Sequence[str]) -> bool:
    """Whether ``path`` (normalized) is a cgroup, or one of ``folders``, in one or above
    one."""
    if path.startswith(CGROUPS):
        return True
    return any(f == path or f.startswith(path + "/") or path.startswith(f + "/")
               for f in folders)


def _ranks_table(ranks: list[dict[str, Any]], title: str) -> RenderableType | None:
    if not ranks:
        return None
    t = Table(title=title, title_justify="left")
    for col in ("rank", "host", "batches", "data wait", "step (mean ms)"):
        t.add_column(col, justify="left" if col in ("rank", "host") else "right")
    for r in ranks:
        share = r.get("data_wait_share")
        t.add_row(Text(str(r.get("rank"))), Text(str(r.get("host") or "")),
                  str(r.get("batches")),
                  f"{share * 100:.1f}%" if isinstance(share, (int, float)) else "-",
                  _ms(r.get("step_mean_s")))
    return t


def render_multi(report: dict[str, Any]) -> RenderableType:
    """The report over several runs (one per node) as one renderable."""
    title = Text()
    title.append("iolens report ", style="bold")
    title.append(f"of {len(report['runs'])} runs")
    parts: list[RenderableType] = [title]
    parts += [Text(f"  {p}") for p in report["runs"]]
    verdict = dict(report["verdict"])
    parts.append(Text(f"verdict of {verdict.get('node')}, the node that holds the job back:",
                      style="bold"))
    parts.append(_verdict({"verdict": verdict}))
    findings = _findings(report)
    if findings is not None:
        parts.append(findings)
    nodes = Table(title="nodes", title_justify="left")
    for col in ("host", "class", "severity", "data wait", "batches", "run"):
        nodes.add_column(col, justify="right" if col in ("data wait", "batches") else "left")
    for n in report["nodes"]:
        v = n["verdict"]
        share = v.get("data_wait_share")
        nodes.add_row(Text(str(n["host"])), Text(str(v.get("class"))),
                      Text(str(v.get("severity"))),
                      f"{share * 100:.1f}%" if isinstance(share, (int, float)) else "-",
                      str(n["training"].get("batches")), Text(str(n["path"])))
    parts.append(nodes)
    ranks = _ranks_table(report.get("ranks") or [], "ranks")
    if ranks is not None:
        parts.append(ranks)
    if report.get("notes"):
        parts.append(Text("notes", style="bold"))
        parts += [Text(f"  - {n}") for n in report["notes"]]
    return Group(*parts)


def print_multi(report: dict[str, Any], console: Console) -> None:
    """Print the report over several runs to ``console``; see :func:`printable`."""
    console.print(render_multi(printable(report)))


def render_text(report: dict[str, Any], *, to_terminal: bool, multi: bool = False) -> str:
    """The text report of ``report`` (``multi``: of several runs), for standard output
    where ``to_terminal`` (colours and the terminal's width when it is one), else plain."""
    buf = io.StringIO()
    tty = to_terminal and sys.stdout.isatty()
    # A terminal's width; elsewhere COLUMNS where it is set (the width a pipe or a CI log
    # is read at), else 120.
    width = shutil.get_terminal_size().columns if tty else _columns(120)
    console = Console(file=buf, force_terminal=tty, width=width,
                      color_system="auto" if tty else None, highlight=False)
    (print_multi if multi else print_report)(report, console)
    return buf.getvalue()


def _columns(default: int) -> int:
    """COLUMNS from the environment (40 to 1000), else ``default``."""
    try:
        n = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return default
    return n if 40 <= n <= 1000 else default
