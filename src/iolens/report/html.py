"""``iolens report --format html``: one self-contained page that opens offline.

The page holds the report object's verdict, evidence, recommendations,
findings, notes and tables, then interactive time-series charts (plotly.js,
embedded whole) on one shared elapsed-time axis, with the verdict's and the
findings' windows shaded across every chart.

A long run is downsampled for display: above :data:`MAX_POINTS` intervals,
consecutive intervals are folded into buckets and each bucket keeps its
mean, minimum and maximum (:func:`downsample`), so a one-second spike in a
week-long run still shows in the chart's min-max band.

Every string that comes from the run (commands, paths, device names,
evidence) is HTML-escaped in the page. The chart data travels as JSON inside
a ``<script type="application/json">`` block with ``<``, ``>``, ``&``,
U+2028 and U+2029 written as ``\\u`` escapes, so no run string can end the
block; the page's script escapes the names again before plotly draws them,
since plotly reads a subset of HTML in its labels. The page loads nothing:
no external script, style sheet, font or image, and its Content Security
Policy forbids any fetch.
"""

from __future__ import annotations

import importlib
import json
import math
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any, cast

from iolens._errors import IolensError
from iolens.analysis.columns import Figure, SeriesColumns
from iolens.analysis.columns.series import figure
from iolens.analysis.verdict import clock
from iolens.analysis.verdict.result import try_label
from iolens.core.words import plural
from iolens.training import overrides

MAX_POINTS = 2000
"""Most points per series drawn in a chart; longer runs are bucketed."""

_INSTALL_HINT = "the HTML report needs plotly: pip install 'iolens[html]'"


def plotly_js() -> str:
    """The plotly.js bundle that the ``html`` extra installs (raises IolensError without it)."""
    try:
        offline = importlib.import_module("plotly.offline")
        text = offline.get_plotlyjs()
    except (ImportError, AttributeError) as exc:
        raise IolensError(_INSTALL_HINT) from exc
    if not isinstance(text, str) or not text:
        raise IolensError(_INSTALL_HINT)
    return text


# -- downsampling -------------------------------------------------------------------------


@dataclass
class Downsampled:
    """One series folded into buckets of ``per_bucket`` consecutive intervals."""

    t: list[float]
    """Mean time of each bucket (ascending when the input is)."""
    mean: list[float | None]
    lo: list[float | None]
    hi: list[float | None]
    """Mean, minimum and maximum of the values in each bucket; None where it had none."""
    per_bucket: int


def bucket_size(n: int, max_points: int = MAX_POINTS) -> int:
    """Intervals per bucket so that ``n`` intervals give at most ``max_points`` buckets."""
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    return max(1, -(-n // max_points))


def bucket_times(t: Sequence[float], size: int) -> list[float]:
    """The mean time of each bucket of ``size`` consecutive intervals (a last, shorter
    bucket included)."""
    if size < 1:
        raise ValueError("size must be at least 1")
    return [math.fsum(t[a:a + size]) / len(t[a:a + size]) for a in range(0, len(t), size)]


def bucketed(t: Sequence[float], y: Sequence[float | None], size: int, *,
             low: Sequence[float | None] | None = None,
             high: Sequence[float | None] | None = None) -> Downsampled:
    """``y`` over ``t`` folded into buckets of ``size`` consecutive intervals: each one's
    mean, minimum and maximum, None values left out (None in all three where it has none).
    ``low`` and ``high``, where given, are each interval's own extremes (a bucket of a long
    run, iolens.analysis.longrun; None: its value is both)."""
    if len(t) != len(y):
        raise ValueError("t and y differ in length")
    return Downsampled(bucket_times(t, size), *_fold(y, size, low, high), size)


def _fold(y: Sequence[float | None], size: int, low: Sequence[float | None] | None,
          high: Sequence[float | None] | None
          ) -> tuple[list[float | None], list[float | None], list[float | None]]:
    """Each bucket's mean, minimum and maximum (see :func:`bucketed`)."""
    lows = y if low is None else _own(y, low)
    highs = y if high is None else _own(y, high)
    mean: list[float | None] = []
    lo: list[float | None] = []
    hi: list[float | None] = []
    for a in range(0, len(y), size):
        b = a + size
        ys = y[a:b]
        if None in ys:
            cur = [v for v in ys if v is not None]
            if not cur:
                mean.append(None)
                lo.append(None)
                hi.append(None)
                continue
            lo.append(min(x for x in lows[a:b] if x is not None))
            hi.append(max(x for x in highs[a:b] if x is not None))
        else:  # (the most buckets: no gap, so no None in their extremes either)
            cur = cast("list[float]", ys)
            lo.append(min(cast("list[float]", lows[a:b])))
            hi.append(max(cast("list[float]", highs[a:b])))
        mean.append(math.fsum(cur) / len(cur))
    return mean, lo, hi


def _own(y: Sequence[float | None], ext: Sequence[float | None]) -> Sequence[float | None]:
    """Each interval's own extreme where it has one, else its value (None where it has no
    value)."""
    return [v if x is None or v is None else x for v, x in zip(y, ext, strict=True)]


def downsample(t: Sequence[float], y: Sequence[float | None],
               max_points: int = MAX_POINTS) -> Downsampled:
    """``y`` over ``t`` in at most ``max_points`` buckets of consecutive points.

    Up to ``max_points`` points each bucket is one point (mean, min and max
    equal). Above it, each bucket's minimum and maximum are kept beside its
    mean, so no extreme is lost; None values are left out of a bucket's
    figures, and a bucket with none has None in all three.
    """
    return bucketed(t, y, bucket_size(len(t), max_points))


# -- series from the run's columns -------------------------------------------------------


_num = figure  # (a figure as a chart or a table takes it: finite, else None)


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


@dataclass
class _Series:
    name: str
    unit: str
    fig: Figure
    scale: float = 1.0
    """What the figure is multiplied by to be drawn in ``unit``."""
    axis: str = "y"
    agg: str = "mean"
    """``mean``: the line is each bucket's mean, with a min-max band; ``max``: its maximum."""
    band: bool = True
    dash: str | None = None
    hidden: bool = False
    color: str | None = None
    """A fixed colour (``#rrggbb``) instead of the palette's next one."""


@dataclass
class _Chart:
    id: str
    title: str
    unit: str
    unit2: str | None = None
    range2: tuple[float, float] | None = None
    stack: bool = False
    """The series are drawn as stacked areas (parts of one whole), not as lines."""


_STAGES = (("fetch on CPU", "fetch_cpu_s", "#ff7f0e"),
           ("fetch blocked off CPU", "fetch_blocked_s", "#d62728"),
           ("collate", "collate_s", "#2ca02c"), ("hand-over", "handover_s", "#9467bd"),
           ("idle (waiting for indices)", "idle_s", "#bbbbbb"))
"""The input pipeline's stages as the stage chart stacks them: label, key of a row of
``report["pipeline"]["stages"]``, colour (the text report's stage chart, in its order)."""


def _at(elapsed: Any) -> float | None:
    """The key that ties a stage row to its interval: the elapsed time, rounded."""
    v = _num(elapsed)
    return None if v is None else round(v, 6)


def stage_rows(report: dict[str, Any]) -> dict[float, dict[str, Any]]:
    """``report["pipeline"]["stages"]`` by elapsed time (empty when the run has none)."""
    out: dict[float, dict[str, Any]] = {}
    for row in _d(report.get("pipeline")).get("stages") or []:
        at = _at(_d(row).get("elapsed_s"))
        if at is not None:
            out[at] = _d(row)
    return out


def _stage_figures(series: SeriesColumns, stages: dict[float, dict[str, Any]]
                   ) -> dict[str, Figure]:
    """Each stage's seconds per batch in each interval that has a stage row."""
    rows = [stages.get(at, {}) if (at := _at(t)) is not None else {} for t in series.elapsed]
    none = (None,) * len(rows)
    return {key: Figure(tuple(_num(r.get(key)) if r else None for r in rows), none, none)
            for _, key, _ in _STAGES}


def _plan(series: SeriesColumns, gpu_names: dict[int, str],
          stages: dict[float, dict[str, Any]] | None = None, cache_hit: bool = True
          ) -> tuple[list[_Chart], list[tuple[str, _Series]]]:
    """The charts, and the series each draws (chart id, series), in the page's order."""
    roles = list(series.roles)
    charts: list[_Chart] = []
    out: list[tuple[str, _Series]] = []
    if series.devices:
        charts += [_Chart("throughput", "Device throughput (rMB/s, wMB/s)", "MB/s"),
                   _Chart("await", "Device await (r_await, w_await)", "ms"),
                   _Chart("util", "Device utilization (%util)", "%")]
        for name, dev in series.devices.items():
            out += [("throughput", _Series(f"{name} read", "MB/s", dev["rkB_s"], 1 / 1024)),
                    ("throughput", _Series(f"{name} write", "MB/s", dev["wkB_s"], 1 / 1024,
                                           dash="dot")),
                    ("await", _Series(f"{name} r_await", "ms", dev["r_await"])),
                    ("await", _Series(f"{name} w_await", "ms", dev["w_await"], dash="dot")),
                    ("util", _Series(name, "%", dev["util"]))]
    job = series.job
    if roles and not cache_hit:
        # The dataset is on FUSE or NFS (or tmpfs): its reads never reach read_bytes, so
        # 1 - read_bytes/rchar is no page-cache hit there; its reads show as rchar.
        charts.append(_Chart("job", "The job's I/O: storage reads and writes, reads through "
                             "syscalls (rchar)", "MB/s"))
        reader = "worker" if "worker" in roles else None
        out += [("job", _Series("job read", "MB/s", job["read_bytes_s"], 1 / 2**20)),
                ("job", _Series("job write", "MB/s", job["write_bytes_s"], 1 / 2**20,
                                dash="dot")),
                ("job", _Series(f"read() ({reader}s, rchar)" if reader else
                                "read() (job, rchar)", "MB/s",
                                (series.roles[reader] if reader else job)["rchar_s"],
                                1 / 2**20, dash="dash"))]
    elif roles:
        hit_role = "worker" if "worker" in roles else None
        charts.append(_Chart("job", "The job's I/O: storage reads and writes, page-cache hits",
                             "MB/s", "cache hit %", (0.0, 105.0)))
        hit = series.roles[hit_role] if hit_role else job
        out += [("job", _Series("job read", "MB/s", job["read_bytes_s"], 1 / 2**20)),
                ("job", _Series("job write", "MB/s", job["write_bytes_s"], 1 / 2**20,
                                dash="dot")),
                ("job", _Series(f"cache hit ({hit_role}s)" if hit_role else "cache hit (job)",
                                "%", hit["cache_hit"], 100.0, axis="y2", dash="dash"))]
    if roles:
        charts.append(_Chart("cpu", "CPU of the job's processes (% of one core) and the machine",
                             "% of a core", "machine busy %", (0.0, 105.0)))
        out += [("cpu", _Series(f"{role} CPU", "% of a core", series.roles[role]["cpu_pct"]))
                for role in roles]
        out.append(("cpu", _Series("machine busy", "%", series.busy, axis="y2", dash="dot",
                                   band=False)))
    if series.gpus:
        charts.append(_Chart("gpu", "GPU utilization", "%"))
        for i, gpu in series.gpus.items():
            label = f"GPU {i}" + (f" {gpu_names[i]}" if gpu_names.get(i) else "")
            out.append(("gpu", _Series(label, "%", gpu["util_pct"])))
    if series.train:
        charts.append(_Chart("train", "Step time and data wait per batch", "ms"))
        tr = series.train
        out += [("train", _Series("step p50", "ms", tr["step.p50_s"], 1000)),
                ("train", _Series("data wait p50", "ms", tr["data_wait.p50_s"], 1000)),
                ("train", _Series("step p95", "ms", tr["step.p95_s"], 1000, band=False,
                                  hidden=True)),
                ("train", _Series("data wait p95", "ms", tr["data_wait.p95_s"], 1000,
                                  band=False, hidden=True)),
                ("train", _Series("step max", "ms", tr["step.max_s"], 1000, agg="max",
                                  band=False, dash="dot")),
                ("train", _Series("data wait max", "ms", tr["data_wait.max_s"], 1000,
                                  agg="max", band=False, dash="dot"))]
    if stages:
        charts.append(_Chart("pipeline", "Input pipeline: stage split per batch over time "
                             "(means per batch, stacked)", "ms per batch", stack=True))
        figs = _stage_figures(series, stages)
        out += [("pipeline", _Series(label, "ms", figs[key], 1000.0, band=False, color=color))
                for label, key, color in _STAGES]
    return charts, out


def _round(v: float | None) -> float | None:
    """Four significant digits: plenty for a chart, and a quarter of the bytes."""
    if v is None:
        return None
    return float(f"{v:.4g}")


def _scaled(col: Sequence[float | None], scale: float) -> Sequence[float | None]:
    return col if scale == 1.0 else [None if v is None else v * scale for v in col]


def _extreme(col: Sequence[float | None], scale: float) -> Sequence[float | None] | None:
    """A figure's extremes as drawn; None where no interval has its own."""
    return _scaled(col, scale) if any(x is not None for x in col) else None


def chart_data(run: SeriesColumns | Sequence[dict[str, Any]],
               gpu_names: dict[int, str] | None = None, max_points: int = MAX_POINTS, *,
               stages: dict[float, dict[str, Any]] | None = None,
               cache_hit: bool = True) -> dict[str, Any]:
    """The charts' series (downsampled), their shared time axis and its full range.

    ``run``: the run's chart figures (:attr:`RunData.series`), or its records, read into
    them; ``stages``: the input pipeline's stage split per interval (:func:`stage_rows` of
    the report), drawn stacked on the same time axis; ``cache_hit`` False leaves the
    page-cache hit out (the dataset's storage never counts in read_bytes)."""
    series = run if isinstance(run, SeriesColumns) else SeriesColumns.of(run)
    charts, plotted = _plan(series, gpu_names or {}, stages, cache_hit)
    size = bucket_size(len(series), max_points)
    sampled = [Downsampled([], *_fold(_scaled(s.fig.value, s.scale), size,
                                      _extreme(s.fig.low, s.scale),
                                      _extreme(s.fig.high, s.scale)), size)
               for _, s in plotted]
    lo_t, hi_t = series.start, (series.elapsed[-1] if series.elapsed else 0.0)
    if hi_t <= lo_t:
        hi_t = lo_t + 1.0
    by_chart: dict[str, list[dict[str, Any]]] = {c.id: [] for c in charts}
    for (chart, s), ds in zip(plotted, sampled, strict=True):
        if all(v is None for v in ds.mean):
            continue
        entry: dict[str, Any] = {
            "name": s.name, "unit": s.unit, "axis": s.axis,
            "y": [_round(v) for v in (ds.hi if s.agg == "max" else ds.mean)],
        }
        if s.dash:
            entry["dash"] = s.dash
        if s.hidden:
            entry["hidden"] = True
        if s.color:
            entry["color"] = s.color
        if s.band and size > 1:
            entry["lo"] = [_round(v) for v in ds.lo]
            entry["hi"] = [_round(v) for v in ds.hi]
        by_chart[chart].append(entry)
    out_charts = []
    for c in charts:
        if not by_chart[c.id]:
            continue
        spec: dict[str, Any] = {"id": c.id, "title": c.title, "unit": c.unit,
                                "series": by_chart[c.id]}
        if c.unit2 and any(s["axis"] == "y2" for s in by_chart[c.id]):
            spec["unit2"] = c.unit2
            spec["range2"] = list(c.range2) if c.range2 else None
        if c.stack:
            spec["stack"] = True
        out_charts.append(spec)
    times = bucket_times(series.elapsed, size) if sampled else []
    return {"x": [round(t, 3) for t in times],
            "range": [round(lo_t, 3), round(hi_t, 3)], "per_bucket": size,
            "intervals": len(series), "charts": out_charts}


# -- windows ------------------------------------------------------------------------------

_WINDOW_COLORS = {
    "storage-bound": "#d62728", "cpu-bound-input": "#ff7f0e", "loader-starved": "#9467bd",
    "write-stall": "#8c564b", "compute-bound": "#2ca02c", "input-bound": "#d62728",
    "noisy-neighbor": "#7f7f7f", "warm-cache": "#1f77b4", "cold-start": "#17becf",
    "epoch-start-stall": "#bcbd22", "straggler": "#e377c2", "handover-bound": "#8c6d31",
    "steps-only": "#555555",
}


def windows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdict's windows, then the findings', as ``start_s``, ``end_s``, ``label``, ``kind``."""
    out: list[dict[str, Any]] = []
    v = _d(report.get("verdict"))
    for w in v.get("windows") or []:
        if isinstance(w, dict):
            out.append({**w, "kind": "verdict"})
    for f in report.get("findings") or []:
        w = _d(f).get("window") if isinstance(f, dict) else None
        if isinstance(w, dict):
            out.append({**w, "label": w.get("label") or f.get("class"), "kind": "finding"})
    return [w for w in out if _num(w.get("start_s")) is not None
            and _num(w.get("end_s")) is not None]


def window_color(label: Any) -> str:
    return _WINDOW_COLORS.get(str(label), "#555555")


_LABEL_PLACES = ("top left", "top right", "middle left", "middle right", "bottom left",
                 "bottom right")


def shapes(wins: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plotly rectangle shapes spanning a chart's height over each window, labelled.

    Labels take turns at the rectangles' corners, so windows over the same
    stretch (a verdict and a finding) keep their labels apart.
    """
    out = []
    for n, w in enumerate(wins):
        color = window_color(w.get("label"))
        verdict = w.get("kind") == "verdict"
        out.append({
            "type": "rect", "xref": "x", "yref": "paper", "layer": "below",
            "x0": w["start_s"], "x1": w["end_s"], "y0": 0, "y1": 1,
            "fillcolor": color, "opacity": 0.1 if verdict else 0.07,
            "line": {"color": color, "width": 1},
            "name": str(w.get("label")),
            "label": {"text": str(w.get("label")),
                      "textposition": _LABEL_PLACES[n % len(_LABEL_PLACES)],
                      "font": {"size": 10, "color": color}},
        })
    return out


# -- the page -----------------------------------------------------------------------------


def script_json(data: Any) -> str:
    """``data`` as JSON safe inside a ``<script>`` element (nothing in it can end the element)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _e(v: Any) -> str:
    return escape(str(v), quote=True)


def _f(v: Any, fmt: str = ".1f") -> str:
    return format(float(v), fmt) if _num(v) is not None else "-"


def _ms_text(v: Any) -> str:
    return f"{float(v) * 1000:.1f}" if _num(v) is not None else "-"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], caption: str = "",
           left: int = 1) -> str:
    """An HTML table; every cell is escaped here. The first ``left`` columns align left."""
    cols = "".join(f'<th class="{"l" if i < left else "r"}">{_e(h)}</th>'
                   for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f'<td class="{"l" if i < left else "r"}">{_e(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{cols}</tr></thead><tbody>{body}</tbody></table>"


def _run_section(report: dict[str, Any]) -> str:
    run = _d(report.get("run"))
    cmd = run.get("command")
    facts = []
    if isinstance(cmd, list):
        facts.append(("command", shlex.join(map(str, cmd))))
    elif cmd is not None:
        facts.append(("command", str(cmd)))
    for label, key in (("host", "host"), ("directory", "cwd"), ("started", "start"),
                       ("ended", "end"), ("kernel", "kernel"), ("iolens", "iolens_version")):
        if run.get(key) is not None:
            facts.append((label, str(run[key])))
    span = (f"{_f(run.get('duration_s'))} s, {run.get('intervals')} intervals of "
            f"{_f(run.get('interval_s'), 'g')} s")
    if run.get("exit_code") is not None:
        span += f", exit code {run['exit_code']}"
    facts.append(("recorded", span))
    if isinstance(run.get("set"), dict) and run["set"]:
        facts.append(("DataLoader settings given (--set)", overrides.line(run["set"]) + "".join(
            f" --set-loader {n}" for n in run.get("set_loaders") or [])))
    rows = "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>"
                   if k == "command" else f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
                   for k, v in facts)
    return (f'<header><h1>iolens report</h1><p class="path">{_e(run.get("path"))}</p>'
            f'<table class="facts">{rows}</table></header>')


def _verdict_section(report: dict[str, Any], wins: Sequence[dict[str, Any]]) -> str:
    v = _d(report.get("verdict"))
    sev = str(v.get("severity"))
    head = f'<span class="cls sev-{_e(sev)}">{_e(v.get("class"))}</span>'
    share = _num(v.get("data_wait_share"))
    if share is not None:
        head += (f' <span class="share">data wait {share * 100:.1f}% of step time</span>'
                 f' <span class="sev sev-{_e(sev)}">{_e(sev)}</span>')
    if v.get("devices"):
        head += f' <span class="devs">device: {_e(", ".join(map(str, v["devices"])))}</span>'
    parts = [f'<section class="verdict"><h2>Verdict</h2><p class="head">{head}</p>']
    if v.get("caveat"):
        parts.append(f'<p class="caveat">note: {_e(v["caveat"])}</p>')
    if v.get("evidence"):
        parts.append("<h3>Evidence</h3><ul>" + "".join(
            f"<li>{_e(x)}</li>" for x in v["evidence"]) + "</ul>")
    if v.get("recommendations"):
        parts.append("<h3>What to do</h3><ol>" + "".join(
            f'<li><span class="action">{_e(r.get("action"))}</span><br>'
            f'<span class="why">because {_e(r.get("because"))}; '
            f'{"" if r.get("prediction") else "expected: "}{_e(r.get("expected_gain"))}'
            '</span>'
            + (f'<br><span class="try">{_e(try_label(r))}: <code>{_e(r["try"])}</code></span>'
               if r.get("try") else "")
            + '</li>'
            for r in v["recommendations"] if isinstance(r, dict)) + "</ol>")
    declined = [r for r in v.get("declined") or [] if isinstance(r, dict)]
    if declined:
        parts.append('<h3>Not advised</h3><ul class="declined">' + "".join(
            f'<li>{_e(r.get("action"))}: <span class="why">'
            f'{_e(_declined_why(r))}'
            '</span></li>' for r in declined) + "</ul>")
    if wins:
        parts.append("<h3>Highlighted in the charts</h3><ul class=\"wins\">" + "".join(
            f'<li><span class="swatch" style="background:{window_color(w.get("label"))}">'
            f'</span>{_e(w.get("label"))} ({_e(w.get("kind"))}) from '
            f'{_e(clock(float(w["start_s"])))} to {_e(clock(float(w["end_s"])))}</li>'
            for w in wins) + "</ul>")
    parts.append("</section>")
    return "".join(parts)


def _findings_section(report: dict[str, Any]) -> str:
    fs = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    if not fs:
        return ""
    rows = []
    for f in fs:
        w = _d(f.get("window"))
        when = (f"{clock(float(w['start_s']))} to {clock(float(w['end_s']))}"
                if _num(w.get("start_s")) is not None and _num(w.get("end_s")) is not None
                else "")
        recs = [r for r in f.get("recommendations") or [] if isinstance(r, dict)]
        rows.append((str(f.get("class")), " ".join(map(str, f.get("evidence") or [])), when,
                     str(recs[0].get("action")) if recs else ""))
    return ("<section><h2>Findings</h2>"
            + _table(("finding", "evidence", "when", "what to do"), rows, left=4)
            + "</section>")


def _autotune_section(report: dict[str, Any]) -> str:
    """``iolens run --autotune``: each epoch's settings, prediction, rate and decision."""
    loaders = [t for t in report.get("autotune") or [] if isinstance(t, dict)]
    if not loaders:
        return ""
    parts = ["<section><h2>Autotune</h2>"]
    for t in loaders:
        if t.get("refused"):
            parts.append(f"<p>{_e(t.get('dataset'))}: left as it is: {_e(t['refused'])}</p>")
            continue
        rows = [(str(e.get("epoch")), str(e.get("settings")),
                 (f"{_f(e.get('predicted'))} ({_f(e.get('low'))}-{_f(e.get('high'))})"
                  if e.get("predicted") is not None else "-"),
                 _f(e.get("steps_per_s")), str(e.get("decision")))
                for e in t.get("epochs") or [] if isinstance(e, dict)]
        parts.append(f"<p>{_e(t.get('dataset'))}</p>" + _table(
            ("epoch", "settings", "predicted steps/s", "measured steps/s", "decision"), rows,
            left=2))
        if t.get("code"):
            parts.append(f"<p>Ended on <code>{_e(t['code'])}</code>"
                         + (f" ({_e(t['settled'])})" if t.get("settled") else "")
                         + ": write it into the code.</p>")
    return "".join(parts) + "</section>"


def _notes_section(report: dict[str, Any]) -> str:
    notes = report.get("notes") or []
    if not notes:
        return ""
    return ("<section><h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes)
            + "</ul></section>")


def _tables_section(report: dict[str, Any]) -> str:
    parts = ["<section><h2>Figures</h2>"]
    tr = _d(report.get("training"))
    figures = _d(_d(report.get("verdict")).get("figures"))
    if not tr.get("batches") and figures.get("steps"):
        parts.append(f'<p>training: {_e(plural(figures.get("steps") or 0, "step"))} timed '
                     'between calls of iolens.step(), '
                     f'{_e(_f(figures.get("steps_per_s"), ".2f"))} steps/s, median step '
                     f'{_e(_ms_text(figures.get("step_p50_s")))} ms; no batch timed</p>')
    else:
        rows = []
        for label, key in (("data wait", "data_wait"), ("step", "step")):
            d = _d(tr.get(key))
            rows.append((label, _ms_text(d.get("mean_s")), _ms_text(d.get("p50_s")),
                         _ms_text(d.get("p95_s")), _ms_text(d.get("max_s"))))
        parts.append(_table(
            ("ms per batch", "mean", "p50", "p95", "max"), rows,
            f"training: {plural(tr.get('batches') or 0, 'batch', 'batches')}, "
            f"{plural(tr.get('epochs') or 0, 'epoch')}, "
            f"{_f(tr.get('steps_per_s'), '.2f')} steps/s; distributions from "
            f"{tr.get('distribution_source')}"))
    parts.append(_pipeline_table(report))
    parts.append(_storage_table(report))
    devs = _d(report.get("devices"))
    if devs:
        parts.append(_table(
            ("device", "%util", "max", "rMB/s", "wMB/s", "r/s", "r_await", "w_await",
             "aqu-sz", "rareq KiB", "why watched"),
            ((str(name), _f(d.get("util_pct")), _f(d.get("util_max_pct"), ".0f"),
              _f(d.get("read_MBps"), ".2f"), _f(d.get("write_MBps"), ".2f"), _f(d.get("r_s")),
              _f(d.get("r_await_ms"), ".2f"), _f(d.get("w_await_ms"), ".2f"),
              _f(d.get("aqu_sz"), ".2f"), _f(d.get("rareq_kib")), str(d.get("why") or ""))
             for name, d in ((n, _d(x)) for n, x in devs.items())),
            "devices (means over the run)"))
    procs = _d(report.get("processes"))
    if procs:
        note = next((str(n) for n in (_d(x).get("cache_hit_note") for x in procs.values())
                     if n), None)
        parts.append(_table(
            ("role", "processes", "CPU %", "read MB/s", "write MB/s", "rchar MB/s",
             "cache hit"),
            ((str(role), str(d.get("pids_max")), _f(d.get("cpu_pct")),
              _f(d.get("read_MBps"), ".2f"), _f(d.get("write_MBps"), ".2f"),
              _f(d.get("read_rchar_MBps"), ".2f"),
              f"{float(d['cache_hit']) * 100:.0f}%" if _num(d.get("cache_hit")) is not None
              else "not shown" if d.get("cache_hit_note") else "-")
             for role, d in ((r, _d(x)) for r, x in procs.items())),
            "the job's processes"))
        if note:
            parts.append(f'<p class="dim note" id="cache-hit-note">cache hit not shown: '
                         f"{_e(note)}</p>")
    g = _d(report.get("gpus"))
    gl = [x for x in g.get("gpus") or [] if isinstance(x, dict)]
    if gl:
        parts.append(_table(
            ("GPU", "name", "util %", "max", "memory used (max)"),
            ((str(x.get("index")), str(x.get("name") or ""), _f(x.get("util_pct")),
              _f(x.get("util_max_pct"), ".0f"),
              f"{(_num(x.get('mem_used_max_bytes')) or 0) / 2**30:.2f} / "
              f"{(_num(x.get('mem_total_bytes')) or 0) / 2**30:.0f} GiB") for x in gl),
            "GPUs", left=2))
    else:
        parts.append(f'<p class="dim">GPU: none recorded ({_e(g.get("reason") or "no GPU")})'
                     "</p>")
    cpu = _d(report.get("cpu"))
    if any(v is not None for v in cpu.values()):
        parts.append('<p class="dim">machine CPU: ' + _e(", ".join(
            f"{k} {_f(v)}%" for k, v in cpu.items() if v is not None)) + "</p>")
    parts.append("</section>")
    return "".join(parts)


def _pct_text(v: Any) -> str:
    return f"{float(v) * 100:.0f}%" if _num(v) is not None else "-"


def _pipeline_table(report: dict[str, Any]) -> str:
    """The input pipeline's figures, timed inside the workers; empty without them."""
    p = report.get("pipeline")
    if not isinstance(p, dict):
        return ""
    who = ("training process (num_workers=0)" if p.get("in_process") is True
           else "DataLoader workers")
    per_sample = _num(p.get("bytes_per_sample"))
    rows = (("fetch per sample", f"{_ms_text(p.get('fetch_s_per_sample'))} ms"),
            ("on CPU", _pct_text(p.get("fetch_cpu_share"))),
            ("waiting for a core (the cores busy)", _pct_text(p.get("fetch_queue_share"))),
            ("blocked off CPU (I/O, network, locks, sleeps)",
             _pct_text(p.get("fetch_blocked_share"))),
            ("collate per batch", f"{_ms_text(p.get('collate_s_per_batch'))} ms"),
            ("hand-over per batch (queue, unpickling, pin_memory)",
             f"{_ms_text(p.get('handover_s_per_batch'))} ms"),
            ("workers idle (waiting for the loop to ask)", _pct_text(p.get("worker_idle_share"))),
            (f"read per sample ({p.get('bytes_source') or 'rchar'})",
             f"{per_sample / 1024:.1f} KiB" if per_sample is not None else "-"),
            ("files opened per sample", _f(p.get("files_per_sample"), ".2f")))
    return ('<div id="pipeline-figures">' + _table(
        ("input pipeline", "value"), rows,
        f"input pipeline, timed inside the {who}: {p.get('samples')} samples in "
        f"{p.get('batches')} batches") + "</div>")


def _storage_table(report: dict[str, Any]) -> str:
    """What serves the dataset (report["storage"]); empty when nothing was mapped."""
    served = [s for s in report.get("storage") or [] if isinstance(s, dict)]
    if not served:
        return ""
    rows = []
    for s in served:
        listed = s.get("folders")
        folders = [str(f) for f in listed] if isinstance(listed, list) else []
        more = _num(s.get("more_folders"))
        rows.append((str(s.get("mount")), str(s.get("fstype")), str(s.get("kind") or ""),
                     str(s.get("device") or "none (no block device)"),
                     ", ".join(folders) + (f" and {int(more)} more" if more else "")))
    return ('<div id="storage">' + _table(
        ("mount", "type", "kind", "device", "folders read"), rows,
        "what serves the dataset (from the files the input pipeline opened)", left=5)
        + "</div>")


def _clock0(report: dict[str, Any], series: SeriesColumns) -> float | None:
    """Seconds since the epoch at elapsed zero: from the run's start, else its intervals'."""
    start = _d(report.get("run")).get("start")
    if isinstance(start, str):
        try:
            return datetime.fromisoformat(start).timestamp()
        except ValueError:
            pass
    return series.clock0


def _charts_section(data: dict[str, Any]) -> str:
    n, per = data["intervals"], data["per_bucket"]
    if not data["charts"]:
        return ('<section><h2>Charts</h2><p class="dim">No interval was recorded with figures '
                "to chart.</p></section>")
    if per > 1:
        how = (f"{n} intervals drawn as {len(data['x'])} points of {per} intervals each: the "
               "line is each point's mean, the shaded band its minimum to maximum, so no "
               "spike is lost. Zoom in (drag across a chart) for a closer look; double-click "
               "to see the whole run.")
    else:
        how = (f"{n} intervals, every one drawn. Drag across a chart to zoom all of them; "
               "double-click to see the whole run.")
    divs = "".join(f'<div class="chart" id="chart-{_e(c["id"])}"></div>' for c in data["charts"])
    return (f'<section><h2>Over time</h2><p class="dim">{_e(how)} Time axis: elapsed '
            f"(h:mm:ss) above, clock time (UTC) below. Click a legend entry to hide or show "
            f"a series.</p>"
            '<p id="render-error" class="error" hidden></p>'
            f'<noscript><p class="error">The charts need JavaScript.</p></noscript>{divs}'
            "</section>")


_CSP = ("default-src 'none'; script-src 'unsafe-inline'; "
        "style-src 'unsafe-inline'; img-src data: blob:; font-src data:; "
        "connect-src 'none'; base-uri 'none'; form-action 'none'")

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1400px;padding:1em 1.5em;color:#222;line-height:1.4}
h1{margin:.2em 0;font-size:1.6em}h2{font-size:1.25em;margin:1.2em 0 .4em;
border-bottom:1px solid #ddd}h3{font-size:1em;margin:.8em 0 .2em}
.path{font-family:ui-monospace,monospace;color:#555;margin:0 0 .5em}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.9em}
caption{text-align:left;font-weight:600;padding:.2em 0}
th,td{padding:.2em .6em;border-bottom:1px solid #eee;vertical-align:top}
th{background:#f6f6f6}.l{text-align:left}.r{text-align:right;font-variant-numeric:tabular-nums}
.facts th{text-align:left;background:none;color:#555;font-weight:500}
code{font-family:ui-monospace,monospace;word-break:break-all}
.verdict{border:1px solid #ccc;border-radius:6px;padding:.2em 1em .6em;background:#fcfcfc}
.verdict h2{border:none}.head{font-size:1.1em}.cls{font-weight:700;font-size:1.2em}
.sev{font-weight:600}.sev-high{color:#c0392b}.sev-moderate{color:#b7950b}
.sev-none{color:#1e8449}.why{color:#666;font-size:.92em}.caveat{color:#9a6700}.action{font-weight:500}
.swatch{display:inline-block;width:.9em;height:.9em;margin-right:.4em;opacity:.6;
vertical-align:middle;border-radius:2px}.wins{list-style:none;padding-left:.5em}
.dim{color:#666;font-size:.92em}.error{color:#c0392b;font-weight:600}
.chart{width:100%;height:300px;margin:0 0 .3em}
"""

_JS = r"""
(function () {
  "use strict";
  var body = document.body;
  function fail(msg) {
    body.setAttribute("data-rendered", "error");
    body.setAttribute("data-error", String(msg).slice(0, 500));
    var box = document.getElementById("render-error");
    if (box) { box.textContent = "The charts could not be drawn: " + msg; box.hidden = false; }
  }
  window.addEventListener("error", function (ev) { fail(ev.message || "script error"); });
  window.addEventListener("unhandledrejection", function (ev) {
    var r = ev.reason; fail((r && r.message) || String(r));
  });
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var STEPS = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
               7200, 10800, 21600, 43200, 86400, 172800, 345600, 604800, 1209600, 2419200];
  var data, clock0, marginRight = 230;

  function elapsedText(v, step, span) {
    var tenths = step < 1 ? Math.round(Math.abs(v) * 10) : Math.round(Math.abs(v)) * 10;
    var d = Math.floor(tenths / 864000); tenths -= d * 864000;
    var h = Math.floor(tenths / 36000); tenths -= h * 36000;
    var m = Math.floor(tenths / 600); tenths -= m * 600;
    var sec = step < 1 ? (tenths < 100 ? "0" : "") + (tenths / 10).toFixed(1)
                       : pad(Math.round(tenths / 10));
    var out = d ? d + "d " + pad(h) + ":" + pad(m) + ":" + sec
                : (h || span >= 3600 ? h + ":" + pad(m) : pad(m)) + ":" + sec;
    return (v < 0 ? "-" : "") + out;
  }
  function clockText(v, span) {
    var t = new Date((clock0 + v) * 1000);
    var s = pad(t.getUTCHours()) + ":" + pad(t.getUTCMinutes());
    if (span < 1800) { s += ":" + pad(t.getUTCSeconds()); }
    if (span >= 43200) { s = pad(t.getUTCMonth() + 1) + "-" + pad(t.getUTCDate()) + " " + s; }
    return s;
  }
  function ticks(lo, hi) {
    var span = Math.max(hi - lo, 1e-9), step = STEPS[STEPS.length - 1], i;
    for (i = 0; i < STEPS.length; i++) { if (span / STEPS[i] <= 7) { step = STEPS[i]; break; } }
    var first = Math.ceil(lo / step - 1e-9), vals = [], text = [];
    for (i = first; i * step <= hi + 1e-9 && vals.length < 60; i++) {
      var v = Math.round(i * step * 1000) / 1000;
      vals.push(v);
      text.push(elapsedText(v, step, span) + (clock0 === null ? "" : "<br>" + clockText(v, span)));
    }
    return {vals: vals, text: text};
  }
  function rgba(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }
  function fmt(unit) { return "%{y:.4~g} " + esc(unit); }

  function traces(c) {
    var x = data.x, out = [];
    c.series.forEach(function (s, si) {
      var color = /^#[0-9a-f]{6}$/i.test(s.color || "") ? s.color : PALETTE[si % PALETTE.length];
      var group = c.id + "-" + si, i;
      var visible = s.hidden ? "legendonly" : true;
      var axis = s.axis === "y2" ? "y2" : "y";
      if (s.lo && s.hi) {
        var bx = [], by = [];
        for (i = 0; i < x.length; i++) {
          if (s.hi[i] !== null) { bx.push(x[i]); by.push(s.hi[i]); }
        }
        for (i = x.length - 1; i >= 0; i--) {
          if (s.lo[i] !== null) { bx.push(x[i]); by.push(s.lo[i]); }
        }
        out.push({type: "scatter", mode: "lines", x: bx, y: by, fill: "toself",
                  fillcolor: rgba(color, 0.2), line: {width: 0}, hoverinfo: "skip",
                  showlegend: false, legendgroup: group, yaxis: axis, visible: visible,
                  name: esc(s.name) + " min-max"});
      }
      var tr = {type: "scatter", mode: "lines", x: x, y: s.y, name: esc(s.name),
                legendgroup: group, yaxis: axis, visible: visible, connectgaps: false,
                line: {color: color, width: 1.5, dash: s.dash || "solid"},
                hovertemplate: fmt(s.unit)};
      if (s.lo && s.hi) {
        tr.customdata = s.lo.map(function (v, k) { return [v, s.hi[k]]; });
        tr.hovertemplate = fmt(s.unit) + " (min %{customdata[0]:.4~g}, max %{customdata[1]:.4~g})";
      }
      if (c.stack) {
        // Parts of one whole (a batch's time): areas stacked on one another.
        tr.stackgroup = c.id; tr.fillcolor = rgba(color, 0.55);
        tr.line = {color: color, width: 0.5};
      }
      out.push(tr);
    });
    return out;
  }
  function layout(c, t) {
    var lay = {
      title: {text: esc(c.title), x: 0.01, xanchor: "left", font: {size: 14}},
      margin: {l: 70, r: marginRight, t: 34, b: 56, autoexpand: false},
      xaxis: {range: data.range.slice(), tickmode: "array", tickvals: t.vals, ticktext: t.text,
              showgrid: true, zeroline: false, hoverformat: ",.1f",
              unifiedhovertitle: {text: "elapsed %{x:,.1f} s"}},
      yaxis: {title: {text: esc(c.unit)}, rangemode: "tozero", fixedrange: true},
      legend: {xref: "container", x: 1, xanchor: "right", y: 1, font: {size: 11}},
      hovermode: "x unified", showlegend: true, dragmode: "zoom",
      font: {family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif"},
      shapes: data.shapes.map(function (s) {
        var copy = JSON.parse(JSON.stringify(s));
        copy.name = esc(copy.name); copy.label.text = esc(copy.label.text);
        return copy;
      })
    };
    if (c.unit2) {
      lay.yaxis2 = {title: {text: esc(c.unit2)}, overlaying: "y", side: "right",
                    fixedrange: true, showgrid: false, rangemode: "tozero", tickmode: "auto"};
      if (c.range2) { lay.yaxis2.range = c.range2.slice(); }
    }
    return lay;
  }

  var divs = [], busy = false, lastSync = Promise.resolve();
  function setRange(lo, hi) {
    var t = ticks(lo, hi);
    busy = true;
    lastSync = Promise.all(divs.map(function (d) {
      return Plotly.relayout(d, {"xaxis.range": [lo, hi], "xaxis.tickvals": t.vals,
                                 "xaxis.ticktext": t.text});
    })).then(function () { busy = false; },
             function (e) { busy = false; fail((e && e.message) || String(e)); });
    return lastSync;
  }
  function onRelayout(ev) {
    if (busy || !ev) { return; }
    var lo = ev["xaxis.range[0]"], hi = ev["xaxis.range[1]"];
    if (lo === undefined && Array.isArray(ev["xaxis.range"])) {
      lo = ev["xaxis.range"][0]; hi = ev["xaxis.range"][1];
    }
    if (ev["xaxis.autorange"]) { lo = data.range[0]; hi = data.range[1]; }
    if (lo === undefined || hi === undefined) { return; }
    lo = Number(lo); hi = Number(hi);
    window.setTimeout(function () { setRange(lo, hi); }, 0);
  }
  function near(a, b) { return Math.abs(a - b) <= 1e-6 * Math.max(1, Math.abs(b)); }
  function allAt(lo, hi) {
    return divs.every(function (d) {
      var r = d.layout.xaxis.range;
      return near(r[0], lo) && near(r[1], hi) && d.layout.xaxis.tickvals.length > 0;
    });
  }
  function settle() {
    return new Promise(function (ok) { window.setTimeout(ok, 50); })
      .then(function () { return lastSync; });
  }
  function selftest() {
    var lo = data.range[0], hi = data.range[1], a = lo + (hi - lo) / 4, b = lo + (hi - lo) / 2;
    return Plotly.relayout(divs[0], {"xaxis.range": [a, b]}).then(settle).then(function () {
      if (!allAt(a, b)) { throw new Error("zoom did not reach every chart"); }
      return Plotly.relayout(divs[divs.length - 1], {"xaxis.autorange": true});
    }).then(settle).then(function () {
      if (!allAt(lo, hi)) { throw new Error("reset did not reach every chart"); }
      body.setAttribute("data-sync", "ok");
    });
  }

  try {
    data = JSON.parse(document.getElementById("iolens-data").textContent);
    clock0 = typeof data.clock0 === "number" ? data.clock0 : null;
    if (!data.charts.length) {
      body.setAttribute("data-charts", "0");
      body.setAttribute("data-rendered", "ok");
      return;
    }
    if (typeof Plotly === "undefined") { throw new Error("plotly.js is missing from the page"); }
    // One right margin for all charts, wide enough for the longest legend entry,
    // so that every plot area spans the same width and the time axes line up.
    var longest = 0;
    data.charts.forEach(function (c) {
      c.series.forEach(function (s) { longest = Math.max(longest, String(s.name).length); });
    });
    marginRight = Math.min(Math.max(160, 120 + 6.5 * longest),
                           Math.max(160, document.body.clientWidth * 0.4));
    var t = ticks(data.range[0], data.range[1]);
    var config = {responsive: true, displaylogo: false, typesetMath: false, showLink: false,
                  modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"]};
    var drawn = data.charts.map(function (c) {
      var div = document.getElementById("chart-" + c.id);
      divs.push(div);
      return Plotly.newPlot(div, traces(c), layout(c, t), config).then(function () {
        div.on("plotly_relayout", onRelayout);
      });
    });
    Promise.all(drawn).then(function () {
      if (body.getAttribute("data-rendered") === "error") { return; }
      body.setAttribute("data-charts", String(divs.length));
      body.setAttribute("data-rendered", "ok");
      if (window.location.hash === "#selftest") {
        return selftest().catch(function (e) {
          body.setAttribute("data-sync", "error: " + ((e && e.message) || e));
        });
      }
    }, function (e) { fail((e && e.message) || String(e)); });
  } catch (e) {
    fail((e && e.message) || String(e));
  }
})();
"""


def render_html(report: dict[str, Any], run: SeriesColumns | Sequence[dict[str, Any]], *,
                plotlyjs: str | None = None, max_points: int = MAX_POINTS) -> str:
    """The whole page: the report object's sections, then the charts of ``run`` (its chart
    figures, :attr:`RunData.series`, or its records, read into them).

    ``plotlyjs`` is the plotly.js source to embed (by default the one the
    plotly package carries; :func:`plotly_js` raises IolensError without it).
    """
    js = plotly_js() if plotlyjs is None else plotlyjs
    # A bundle never holds these, but the page must stay whole whatever it holds.
    js = js.replace("</script", "<\\/script").replace("<!--", "<\\!--")
    gpu_names = {int(x["index"]): str(x["name"])
                 for x in _d(report.get("gpus")).get("gpus") or []
                 if isinstance(x, dict) and isinstance(x.get("index"), int) and x.get("name")}
    procs = _d(report.get("processes")).values()
    series = run if isinstance(run, SeriesColumns) else SeriesColumns.of(run)
    data = chart_data(series, gpu_names, max_points, stages=stage_rows(report),
                      cache_hit=not any(_d(p).get("cache_hit_note") for p in procs))
    wins = windows(report)
    data["shapes"] = shapes(wins)
    data["clock0"] = _clock0(report, series)
    info = _d(report.get("run"))
    title = f"iolens report: {info.get('path') or ''}"
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>",
        _run_section(report),
        _verdict_section(report, wins),
        _findings_section(report),
        _autotune_section(report),
        _notes_section(report),
        _tables_section(report),
        _charts_section(data),
        f'\n<script type="application/json" id="iolens-data">{script_json(data)}</script>\n',
        f'<script id="iolens-plotly">{js}</script>\n',
        f"<script>{_JS}</script>\n</body></html>\n",
    ])


def _declined_why(r: dict[str, Any]) -> Any:
    return r.get("expected_gain") if r.get("prediction") else r.get("prediction_unavailable")
