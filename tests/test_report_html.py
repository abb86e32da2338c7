"""`iolens report --format html`: downsampling, escaping, windows, no fetches, a real browser."""

from __future__ import annotations

import html
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iolens import IolensError
from iolens.analysis.rundata import load_run
from iolens.report import html as rhtml
from iolens.report.build import build_report
from iolens.report.html import bucket_size, bucketed, downsample, render_html, script_json
from tests.conftest import need
from tests.test_report import META, iolens, write_run
from tests.test_verdict import SLOW_LOOP, dev, rec

EVIL = "</script><script>alert(1)</script>"
EVIL_CMD = ["python", "train.py", "--tag", "<b>&\"'"]
STUB_JS = "/* plotly.js stand-in */"


# -- downsampling -------------------------------------------------------------------------


def test_short_series_are_kept_whole() -> None:
    t = [float(i) for i in range(100)]
    y = [float(i % 7) for i in range(100)]
    d = downsample(t, y, max_points=2000)
    assert d.per_bucket == 1
    assert d.t == t and d.mean == y and d.lo == y and d.hi == y


@pytest.mark.parametrize(("n", "size"), [(0, 1), (1, 1), (2000, 1), (2001, 2), (4000, 2),
                                         (4001, 3), (604_800, 303)])
def test_bucket_size(n: int, size: int) -> None:
    assert bucket_size(n, 2000) == size
    assert math.ceil(n / size) <= 2000


def test_long_series_keep_their_extremes() -> None:
    n = 100_003
    t = [i * 1.0 for i in range(n)]
    y = [50.0 + (i % 13) for i in range(n)]
    y[54_321] = 1000.0  # a one-interval spike
    y[77_777] = -5.0  # and a one-interval dip
    d = downsample(t, y, max_points=2000)
    assert d.per_bucket == 51
    assert len(d.t) == len(d.mean) == len(d.lo) == len(d.hi) == math.ceil(n / 51) <= 2000
    assert max(v for v in d.hi if v is not None) == 1000.0
    assert min(v for v in d.lo if v is not None) == -5.0
    assert d.hi[54_321 // 51] == 1000.0 and d.lo[77_777 // 51] == -5.0
    assert all(a < b for a, b in zip(d.t, d.t[1:], strict=False))
    for lo, mean, hi in zip(d.lo, d.mean, d.hi, strict=True):
        assert lo is not None and mean is not None and hi is not None
        assert lo <= mean <= hi
    # the spike's bucket: its mean moves, its band reaches the spike
    assert d.mean[54_321 // 51] == pytest.approx((sum(y[54_315:54_366])) / 51)


def test_missing_values_leave_gaps() -> None:
    t = [float(i) for i in range(9)]
    y: list[float | None] = [1.0, None, 3.0, None, None, None, 5.0, 7.0, None]
    d = downsample(t, y, max_points=3)
    assert d.per_bucket == 3
    assert d.mean == [2.0, None, 6.0] and d.lo == [1.0, None, 5.0] and d.hi == [3.0, None, 7.0]
    assert d.t == [1.0, 4.0, 7.0]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="length"):
        downsample([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="max_points"):
        downsample([1.0], [1.0], max_points=0)
    with pytest.raises(ValueError, match="size"):
        bucketed([1.0], [1.0], 0)


@given(st.lists(st.one_of(st.none(), st.floats(-1e9, 1e9)), max_size=400),
       st.integers(1, 60))
def test_downsample_properties(ys: list[float | None], max_points: int) -> None:
    t = [i * 0.5 for i in range(len(ys))]
    d = downsample(t, ys, max_points)
    size = bucket_size(len(ys), max_points)
    assert d.per_bucket == size
    assert len(d.t) == math.ceil(len(ys) / size) <= max_points
    assert all(a <= b for a, b in zip(d.t, d.t[1:], strict=False))
    vals = [v for v in ys if v is not None]
    his = [v for v in d.hi if v is not None]
    los = [v for v in d.lo if v is not None]
    if vals:
        assert max(his) == max(vals) and min(los) == min(vals)
    else:
        assert not his and not los
    for k in range(len(d.t)):
        chunk = [v for v in ys[k * size:(k + 1) * size] if v is not None]
        assert d.hi[k] == (max(chunk) if chunk else None)
        assert d.lo[k] == (min(chunk) if chunk else None)


# -- the page -----------------------------------------------------------------------------


def page_data(page: str) -> dict[str, Any]:
    """The chart data embedded in the page, parsed as the browser parses it."""
    m = re.search(r'<script type="application/json" id="iolens-data">(.*?)</script>', page,
                  re.S)
    assert m is not None
    block = m.group(1)
    for raw in ("<", ">", "&", "\u2028", "\u2029"):
        assert raw not in block
    data = json.loads(block)
    assert isinstance(data, dict)
    return data


def report_of(folder: Path, records: list[dict[str, Any]],
              meta: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    run = load_run(str(write_run(folder, records, META if meta is None else meta)))
    return build_report(run), run.records


def evil_records(n: int = 30) -> list[dict[str, Any]]:
    return [rec(i, wait=0.09, devices={EVIL: dict(SLOW_LOOP["loop0"]), "dev\u2028x": dev(util=5)},
                job_read=112 * 64 * 1024) for i in range(n)]


def test_run_strings_are_escaped_in_the_page_and_round_trip_in_its_json(
        tmp_path: Path) -> None:
    meta = {**META, "command": EVIL_CMD, "host": "<i>box</i>",
            "devices": {EVIL: "the job reads /mnt/<data>"}}
    report, records = report_of(tmp_path / "run", evil_records(), meta)
    page = render_html(report, records, plotlyjs=STUB_JS)
    assert EVIL not in page and "<b>" not in page and "<i>box" not in page
    assert html.escape(EVIL) in page  # the devices table
    assert html.escape(shlex.join(EVIL_CMD)) in page
    assert "&lt;i&gt;box&lt;/i&gt;" in page and "/mnt/&lt;data&gt;" in page
    # nothing broke out: exactly the page's own three scripts, each closed once
    assert len(re.findall(r"<script\b", page)) == 3
    assert len(re.findall(r"</script>", page)) == 3
    data = page_data(page)
    names = [s["name"] for c in data["charts"] for s in c["series"]]
    assert f"{EVIL} read" in names and EVIL in names and "dev\u2028x r_await" in names


def test_script_json_escapes_what_could_end_a_script() -> None:
    text = script_json({"k": "</script><!-- & \u2028\u2029 >"})
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == {"k": "</script><!-- & \u2028\u2029 >"}


def test_windows_become_shapes_on_every_chart(tmp_path: Path) -> None:
    records = [rec(i, wait=0.09, devices=SLOW_LOOP, job_read=112 * 64 * 1024,
                   worker_rchar=600 * 2**20) for i in range(40)]
    report, recs = report_of(tmp_path / "run", records)
    page = render_html(report, recs, plotlyjs=STUB_JS)
    data = page_data(page)
    shapes = {s["label"]["text"]: s for s in data["shapes"]}
    assert report["verdict"]["class"] == "storage-bound"
    v = shapes["storage-bound"]
    assert (v["type"], v["xref"], v["yref"], v["x0"], v["x1"], v["y0"], v["y1"]) == (
        "rect", "x", "paper", 0.0, 40.0, 0, 1)
    assert any(f["class"] == "warm-cache" for f in report["findings"])
    assert "warm-cache" in shapes  # a finding's window too
    assert "storage-bound (verdict) from 00:00 to 00:40" in page
    assert data["range"] == [0.0, 40.0] and data["x"] == [float(i + 1) for i in range(40)]


def test_charts_and_their_series(tmp_path: Path) -> None:
    records = evil_records(10)
    for r in records:
        r["gpu"] = [{"index": 0, "util_pct": 80.0}]
    report, recs = report_of(tmp_path / "run", records)
    report["gpus"]["gpus"][0]["name"] = "H100 <x>"
    data = page_data(render_html(report, recs, plotlyjs=STUB_JS))
    ids = [c["id"] for c in data["charts"]]
    assert ids == ["throughput", "await", "util", "job", "cpu", "gpu", "train"]
    by = {c["id"]: {s["name"]: s for s in c["series"]} for c in data["charts"]}
    assert by["util"][EVIL]["y"] == [97.0] * 10
    assert by["throughput"][f"{EVIL} read"]["y"] == [7.0] * 10  # 112 x 64 KiB/s
    assert by["gpu"]["GPU 0 H100 <x>"]["y"] == [80.0] * 10
    assert by["cpu"]["worker CPU"]["y"] == [60.0] * 10
    assert by["train"]["data wait p50"]["y"] == [90.0] * 10  # ms
    assert by["job"]["job read"]["y"] == [7.0] * 10
    assert "lo" not in by["util"][EVIL]  # every interval drawn: no band


def test_the_charts_draw_the_runs_columns_where_a_missing_figure_is_a_gap(
        tmp_path: Path) -> None:
    """The page reads the run's chart columns (RunData.series), read once, and is the page
    of its records; a figure an interval lacks is a gap in its line (the verdict's columns
    take it as 0), and a long run's bucket keeps its own extremes in the band."""
    records = [rec(i, devices={"vda": dev(util=40.0, r_await=4.0)}) for i in range(6)]
    del records[2]["devices"]["vda"]["r_await"]
    records[3]["devices"]["vda"]["r_await"] = None
    records[4]["merged"] = 30
    records[4]["devices"]["vda"].update(util_min=5.0, util_max=99.0)
    write_run(tmp_path / "run", records)
    data = load_run(str(tmp_path / "run"))
    s = data.series
    assert s.devices["vda"]["r_await"].value == (4.0, 4.0, None, None, 4.0, 4.0)
    assert data.devices["vda"].r_wait[2] == 0.0  # (the verdict's sum counts it as none)
    util = s.devices["vda"]["util"]
    assert util.low[4] == 5.0 and util.high[4] == 99.0 and util.low[3] is None
    report = build_report(data)
    page = render_html(report, s, plotlyjs=STUB_JS, max_points=3)
    assert page == render_html(report, data.records, plotlyjs=STUB_JS, max_points=3)
    by = {c["id"]: {x["name"]: x for x in c["series"]} for c in page_data(page)["charts"]}
    assert by["await"]["vda r_await"]["y"] == [4.0, None, 4.0]
    assert by["util"]["vda"]["lo"] == [40.0, 40.0, 5.0] and by["util"]["vda"]["hi"][2] == 99.0


def test_a_long_run_is_downsampled_without_losing_spikes(tmp_path: Path) -> None:
    records = [rec(i, wait=0.01, devices={"vda": dev(util=10)}) for i in range(10_000)]
    records[6_543]["devices"]["vda"]["util"] = 100.0
    records[8_000]["train"]["step"]["max_s"] = 2.5
    report, recs = report_of(tmp_path / "run", records)
    data = page_data(render_html(report, recs, plotlyjs=STUB_JS))
    assert data["per_bucket"] == 5 and len(data["x"]) == 2000
    by = {c["id"]: {s["name"]: s for s in c["series"]} for c in data["charts"]}
    util = by["util"]["vda"]
    assert max(util["hi"]) == 100.0 and util["hi"][6_543 // 5] == 100.0
    assert util["y"][6_543 // 5] == pytest.approx(28.0)  # the mean of the bucket
    assert max(by["train"]["step max"]["y"]) == 2500.0


def test_the_verdicts_caveat_is_on_the_page(tmp_path: Path) -> None:
    report, recs = report_of(tmp_path / "run", evil_records(10), {**META, "exit_code": 1})
    caveat = report["verdict"]["caveat"]
    assert caveat.startswith("the job failed (exit code 1)")
    assert f'<p class="caveat">note: {html.escape(caveat)}</p>' in render_html(
        report, recs, plotlyjs=STUB_JS)


def test_an_empty_run_has_no_charts(tmp_path: Path) -> None:
    report, recs = report_of(tmp_path / "run", [], {**META, "instrumented": False})
    page = render_html(report, recs, plotlyjs=STUB_JS)
    assert page_data(page)["charts"] == [] and "No interval was recorded" in page


def test_the_page_fetches_nothing(tmp_path: Path) -> None:
    """No script, style sheet, font or image from outside; no URL outside plotly's bundle."""
    report, recs = report_of(tmp_path / "run", evil_records())
    page = render_html(report, recs)
    assert len(page) < 8 << 20
    bundle = rhtml.plotly_js()
    assert bundle in page
    ours = page.replace(bundle, "")
    assert "http://" not in ours and "https://" not in ours
    # anywhere in the page, the bundle included: nothing that loads a resource
    assert not re.search(r"<script\b[^>]*\bsrc\s*=", page, re.I)
    assert not re.search(r"<(link|iframe|img|object|embed|base|frame)\b", page, re.I)
    assert "@import" not in page
    assert not re.search(r"""url\(\s*['"]?\s*(https?:|//)""", page, re.I)
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert csp is not None and "default-src 'none'" in csp.group(1)
    assert "connect-src 'none'" in csp.group(1) and "unsafe-eval" not in csp.group(1)


# -- the input pipeline and what serves the dataset ---------------------------------------

FUSE_MOUNT = "/mnt/<s3>&"


def pipe_rec(i: int, *, fetch_s: float = 0.4, **kw: Any) -> dict[str, Any]:
    """Interval ``i`` of test_verdict's rec() with its workers' stage sums: 10 batches of 4
    samples; per batch 2 ms fetching on CPU, the rest of ``fetch_s``/10 blocked, 0.3 ms
    collate, 1.7 ms hand-over, 2 ms idle."""
    r = rec(i, wait=0.05, worker_rchar=4 * 10**6, **kw)
    r["job"]["roles"]["worker"]["cache_hit"] = 1.0  # what read_bytes/rchar claims on FUSE
    r["train"]["pipeline"] = {
        "batches": 10, "samples": 40, "processes": 2, "in_process": False,
        "fetch_s": fetch_s, "fetch_cpu_s": 0.02, "fetch_max_s": 0.08, "collate_s": 0.003,
        "idle_s": 0.02, "files": 40,
        "handover": {"count": 10, "sum_s": 0.017, "max_s": 0.003, "p50_s": 0.0015,
                     "p95_s": 0.003}}
    r["storage"] = {FUSE_MOUNT: {"waiting": 3, "daemon_cpu_pct": 12.0}}
    return r


FUSE_META = {**META, "storage": [{
    "mount": FUSE_MOUNT, "fstype": "fuse.rclone", "device": None, "kind": "fuse",
    "source": "<remote>:", "disks": [], "folders": [f"{FUSE_MOUNT}/train", EVIL],
    "more_folders": 2, "page_cache_visible": False}]}


def test_the_input_pipeline_stages_are_charted_and_tabled(tmp_path: Path) -> None:
    records = [pipe_rec(i, fetch_s=0.4 + 0.01 * i) for i in range(30)]
    records[7]["train"]["pipeline"] = {"batches": 0, "samples": 0}  # no batch timed then
    report, recs = report_of(tmp_path / "run", records, FUSE_META)
    assert report["pipeline"] is not None and len(report["pipeline"]["stages"]) == 29
    page = render_html(report, recs, plotlyjs=STUB_JS)
    data = page_data(page)
    assert [c["id"] for c in data["charts"]][-1] == "pipeline"
    chart = next(c for c in data["charts"] if c["id"] == "pipeline")
    assert chart["stack"] is True and chart["unit"] == "ms per batch"
    assert chart["title"].startswith("Input pipeline: stage split per batch over time")
    by = {s["name"]: s for s in chart["series"]}
    assert list(by) == ["fetch on CPU", "fetch blocked off CPU", "collate", "hand-over",
                        "idle (waiting for indices)"]
    assert by["fetch on CPU"]["y"][:3] == [2.0, 2.0, 2.0]  # ms per batch
    assert by["fetch blocked off CPU"]["y"][:3] == [38.0, 39.0, 40.0]
    assert by["fetch blocked off CPU"]["y"][7] is None  # the interval without a batch
    assert by["fetch blocked off CPU"]["y"][29] == pytest.approx(38.0 + 29)
    assert by["collate"]["y"][0] == 0.3 and by["hand-over"]["y"][0] == 1.7
    assert by["idle (waiting for indices)"]["y"][0] == 2.0
    assert all(re.fullmatch(r"#[0-9a-f]{6}", s["color"]) for s in chart["series"])
    assert all("lo" not in s for s in chart["series"])
    assert data["x"][0] == 1.0 and len(data["x"]) == 30  # the other charts' time axis
    # the figures, as the text report has them
    figures = re.search(r'<div id="pipeline-figures">(.*?)</div>', page, re.S)
    assert figures is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", figures.group(1))
    rows = dict(zip(cells[::2], cells[1::2], strict=True))
    assert rows["fetch per sample"] == "13.7 ms"  # sum of fetch_s / 1160 samples
    assert rows["on CPU"] == "4%" and rows["blocked off CPU (I/O, network, locks, sleeps)"] == "96%"
    assert rows["collate per batch"] == "0.3 ms"
    assert rows["hand-over per batch (queue, unpickling, pin_memory)"] == "1.7 ms"
    assert rows["workers idle (waiting for the loop to ask)"] == "4%"
    assert rows["files opened per sample"] == "1.00"
    assert "timed inside the DataLoader workers: 1160 samples in 290 batches" in figures.group(1)
    # what serves the dataset, every recorded string escaped
    served = re.search(r'<div id="storage">(.*?)</div>', page, re.S)
    assert served is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", served.group(1))
    assert cells == [html.escape(FUSE_MOUNT), "fuse.rclone", "fuse", "none (no block device)",
                     html.escape(f"{FUSE_MOUNT}/train, {EVIL} and 2 more")]
    assert FUSE_MOUNT not in page and EVIL not in page
    assert len(re.findall(r"<script\b", page)) == 3
    # FUSE reads never reach read_bytes: the note instead of a cache hit, in table and chart
    note = report["processes"]["worker"]["cache_hit_note"]
    assert f'<p class="dim note" id="cache-hit-note">cache hit not shown: {html.escape(note)}' \
           in page
    procs = re.search(r"<caption>the job&#x27;s processes</caption>(.*?)</table>", page, re.S)
    assert procs is not None and "not shown" in procs.group(1) and "%</td></tr>" not in \
        procs.group(1)
    job = next(c for c in data["charts"] if c["id"] == "job")
    names = [s["name"] for s in job["series"]]
    assert names == ["job read", "job write", "read() (workers, rchar)"]
    assert job["series"][2]["y"][0] == pytest.approx(4 * 10**6 / 2**20, rel=1e-3)
    assert "unit2" not in job and "cache hit" not in job["title"]


def test_a_long_run_buckets_the_stage_split_with_the_other_charts(tmp_path: Path) -> None:
    records = [pipe_rec(i, fetch_s=0.4 if i < 20 else 0.8) for i in range(40)]
    report, recs = report_of(tmp_path / "run", records, FUSE_META)
    data = page_data(render_html(report, recs, plotlyjs=STUB_JS, max_points=10))
    assert data["per_bucket"] == 4 and len(data["x"]) == 10
    chart = next(c for c in data["charts"] if c["id"] == "pipeline")
    blocked = next(s for s in chart["series"] if s["name"] == "fetch blocked off CPU")
    assert blocked["y"] == [38.0] * 5 + [78.0] * 5  # each bucket's mean per batch


def test_a_run_without_stage_timing_has_no_pipeline_section(tmp_path: Path) -> None:
    records = [rec(i, wait=0.09, devices=SLOW_LOOP, job_read=112 * 64 * 1024,
                   worker_rchar=600 * 2**20) for i in range(30)]
    for r in records:
        r["job"]["roles"]["worker"]["cache_hit"] = 0.25
    report, recs = report_of(tmp_path / "run", records)
    assert report["pipeline"] is None and report["storage"] == []
    page = render_html(report, recs, plotlyjs=STUB_JS)
    data = page_data(page)
    assert "pipeline" not in [c["id"] for c in data["charts"]]
    assert 'id="pipeline-figures"' not in page and 'id="storage"' not in page
    assert "cache-hit-note" not in page and "input pipeline" not in page
    job = next(c for c in data["charts"] if c["id"] == "job")
    assert [s["name"] for s in job["series"]][-1] == "cache hit (workers)"
    assert job["unit2"] == "cache hit %"
    assert job["series"][-1]["y"] == [25.0] * 30
    procs = re.search(r"<caption>the job&#x27;s processes</caption>(.*?)</table>", page, re.S)
    assert procs is not None and "not shown" not in procs.group(1)
    assert '<td class="r">99%</td></tr>' in procs.group(1)  # the workers' cache hit


def test_without_plotly_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    with pytest.raises(IolensError, match=r"pip install 'iolens\[html\]'"):
        rhtml.plotly_js()


# -- the command --------------------------------------------------------------------------


def test_html_goes_to_the_run_directory_by_default(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", evil_records(), META)
    out = iolens("report", str(run), "--format", "html")
    assert out.returncode == 0, out.stderr
    target = run / "report.html"
    assert out.stdout == "" and f"wrote {target}" in out.stderr
    page = target.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "storage-bound" in page
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask
    other = tmp_path / "elsewhere.html"
    out = iolens("report", str(run / "records.jsonl"), "--format", "html", "-o", str(other))
    assert out.returncode == 0 and other.read_text(encoding="utf-8") == page


def test_html_without_plotly_exits_1(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    (fake / "plotly").mkdir(parents=True)
    (fake / "plotly" / "__init__.py").write_text("")  # a plotly without plotly.offline
    run = write_run(tmp_path / "run", evil_records(), META)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(fake), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
    out = subprocess.run([sys.executable, "-m", "iolens", "report", str(run), "--format",
                          "html"], capture_output=True, text=True, env=env, timeout=120,
                         check=False)
    assert out.returncode == 1 and "pip install 'iolens[html]'" in out.stderr
    assert not (run / "report.html").exists()


# -- a real browser -----------------------------------------------------------------------

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
    path = os.environ.get("IOLENS_CHROMIUM") or next(
        (p for p in map(shutil.which, _BROWSERS) if p), None)
    need(path is not None, "Chromium is not installed (apt-get install chromium)")
    assert path is not None
    return path


def page_requests(netlog: Path) -> list[str]:
    """URLs the page itself asked the network for, from Chromium's net log.

    The browser's own background requests (updates, accounts) are told apart
    by their origin: the page's requests carry its file:// origin.
    """
    text = netlog.read_text(errors="replace")
    try:
        log = json.loads(text)
    except ValueError:  # a log cut short lacks its closing brackets
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    out = set()
    for ev in log.get("events") or []:
        params = ev.get("params") or {}
        url = params.get("url")
        if (isinstance(url, str) and re.match(r"(https?|wss?|ftp)://", url)
                and "file://" in json.dumps(params)):
            out.add(url)
    return sorted(out)


def open_in_chromium(page: Path, tmp: Path, *, selftest: bool = True
                     ) -> tuple[str, list[str], list[str]]:
    """The DOM after the page ran, its console messages and its network requests."""
    netlog = tmp / "net.json"
    cmd = [chromium(), "--headless=new", "--disable-gpu", "--no-sandbox", "--dump-dom",
           "--virtual-time-budget=15000", "--enable-logging=stderr", "--v=0",
           "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp / 'profile'}",
           f"--log-net-log={netlog}", "--no-first-run", "--disable-extensions",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-default-apps",
           page.resolve().as_uri() + ("#selftest" if selftest else "")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    console = [line for line in out.stderr.splitlines() if re.search(r"CONSOLE[(:]", line)]
    return out.stdout, console, page_requests(netlog)


def body_attrs(dom: str) -> dict[str, str]:
    m = re.search(r"<body([^>]*)>", dom)
    assert m is not None
    return dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))


def assert_rendered(dom: str, console: list[str], requests: list[str], page: str) -> None:
    """Every chart of ``page`` drawn, with its lines and window shapes, without an error."""
    data = page_data(page)
    charts, shapes = len(data["charts"]), len(data["shapes"])
    attrs = body_attrs(dom)
    assert attrs.get("data-rendered") == "ok", (attrs, console)
    assert attrs.get("data-charts") == str(charts)
    assert attrs.get("data-sync") == "ok", attrs  # zoom on one chart reached all of them
    assert console == []
    assert requests == []
    starts = [m.start() for m in re.finditer(r'<div class="chart[^"]*" id="chart-', dom)]
    assert len(starts) == charts
    for a, b in zip(starts, [*starts[1:], len(dom)], strict=True):
        one = dom[a:b]
        assert 'class="main-svg"' in one
        assert one.count('<g class="trace scatter') >= 1
        assert one.count('<g class="shape-group"') == shapes


def test_chromium_renders_a_hostile_run(tmp_path: Path) -> None:
    chromium()
    pwn = '<img src=x onerror="document.body.dataset.pwned=1">'
    records = evil_records()
    bold = "<b>b</b>&amp;"  # plotly would draw this bold, and as "b&", unless escaped
    for r in records:
        r["devices"][pwn] = r["devices"].pop("dev\u2028x")
        r["devices"][bold] = dev(util=1)
        r["gpu"] = [{"index": 0, "util_pct": 50.0}]
    meta = {**META, "command": [*EVIL_CMD, pwn]}
    run = write_run(tmp_path / "run", records, meta)
    out = iolens("report", str(run), "--format", "html")
    assert out.returncode == 0, out.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    assert len(page_data(page)["charts"]) == 7 and page_data(page)["shapes"]
    dom, console, requests = open_in_chromium(run / "report.html", tmp_path)
    assert_rendered(dom, console, requests, page)
    assert "data-pwned" not in dom
    # the names are drawn as text in plotly's legends
    legend = re.findall(r'<text class="legendtext"[^>]*>(.*?)</text>', dom)
    assert html.escape(f"{EVIL} read", quote=False) in legend
    assert html.escape(pwn, quote=False) in legend
    assert html.escape(bold, quote=False) in legend


def test_chromium_renders_a_downsampled_run(tmp_path: Path) -> None:
    chromium()
    records = [rec(i, wait=0.09 if 3000 <= i < 4000 else 0.002, devices=SLOW_LOOP,
                   job_read=112 * 64 * 1024) for i in range(8000)]
    run = write_run(tmp_path / "run", records, META)
    out = iolens("report", str(run), "--format", "html")
    assert out.returncode == 0, out.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    assert "4 intervals each" in page and len(page_data(page)["charts"]) == 6
    dom, console, requests = open_in_chromium(run / "report.html", tmp_path)
    assert_rendered(dom, console, requests, page)


def test_chromium_draws_the_stage_split_stacked(tmp_path: Path) -> None:
    chromium()
    run = write_run(tmp_path / "run", [pipe_rec(i, fetch_s=0.4 + 0.01 * i) for i in range(30)],
                    FUSE_META)
    out = iolens("report", str(run), "--format", "html")
    assert out.returncode == 0, out.stderr
    page = (run / "report.html").read_text(encoding="utf-8")
    dom, console, requests = open_in_chromium(run / "report.html", tmp_path)
    assert_rendered(dom, console, requests, page)
    assert "data-pwned" not in dom
    chart = dom[dom.index('id="chart-pipeline"'):]
    assert chart.count('<g class="trace scatter') == 5
    assert chart.count('class="js-fill"') >= 5  # areas, stacked
    legend = re.findall(r'<text class="legendtext"[^>]*>(.*?)</text>', chart)
    assert legend[:5] == ["fetch on CPU", "fetch blocked off CPU", "collate", "hand-over",
                          "idle (waiting for indices)"]


def test_chromium_check_sees_errors_and_fetches(tmp_path: Path) -> None:
    """The two checks above can fail: a console error and a fetch are both seen."""
    chromium()
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><img src="https://example.com/x.png">'
                    "<script>console.error('boom'); nosuchfunction();</script></body></html>")
    _, console, requests = open_in_chromium(page, tmp_path, selftest=False)
    assert any("boom" in line for line in console)
    assert any("nosuchfunction" in line for line in console)
    assert requests == ["https://example.com/x.png"]


def test_chromium_renders_a_real_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    chromium()
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Slow(Dataset):\n"
        "    def __len__(self): return 48\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.01)\n"
        "        return torch.zeros(4)\n"
        "for epoch in range(2):\n"
        "    for x in DataLoader(Slow(), batch_size=8, num_workers=1):\n"
        "        pass\n")
    out = iolens("run", "--interval", "0.2", "--out", "run", "--no-live", "--", sys.executable,
                 str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = iolens("report", str(tmp_path / "run"), "--format", "html")
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert len(page_data(page)["charts"]) >= 5
    dom, console, requests = open_in_chromium(tmp_path / "run" / "report.html", tmp_path)
    assert_rendered(dom, console, requests, page)
