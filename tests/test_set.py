"""`iolens run --set KEY=VALUE -- CMD` and `iolens.monitor(set=...)`: the job's DataLoaders
take the settings given, with no code change; what cannot apply is an error before the
training (exit 2); each recommendation that is a setting says how to try it so; and the
advice tried that way holds its prediction in `iolens compare`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from iolens.training import overrides

pytest.importorskip("torch")

SCRIPT = """
import json, os, sys, time, torch
from torch.utils.data import DataLoader, Dataset

class Items(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
        return i

class Other(Items):
    pass

if __name__ == "__main__":
    g = torch.Generator()
    g.manual_seed(7)
    code = json.loads(os.environ.get("CODE_SET") or "{}")  # the settings as a code change
    dl = DataLoader(Items(), batch_size=8, shuffle=True, generator=g, **code)
    print("settings", dl.num_workers, dl.persistent_workers, dl.prefetch_factor)
    print("other", DataLoader(Other(), batch_size=8).num_workers)
    if os.environ.get("VAL"):  # a validation loader of the code's own: no workers
        val = DataLoader(Other(), batch_size=8, num_workers=0)
        print("val", val.num_workers, val.persistent_workers, val.prefetch_factor)
        print("validated", sum(len(b) for b in val))
    print("training")
    for epoch in range(2):
        print("order", [int(x) for b in dl for x in b])
"""


def _run(tmp_path: Path, *set_args: str, name: str = "run", sleep: str = "0",
         code: str = "", val: str = "") -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / name
    cmd = [sys.executable, "-m", "iolens", "run", "--no-live", "--interval", "0.25",
           "--out", str(out), *set_args, "--", sys.executable, str(script), sleep]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          check=False, env={**os.environ, "CODE_SET": code, "VAL": val}), out


def _lines(stdout: str, key: str) -> list[str]:
    return [ln.split(" ", 1)[1] for ln in stdout.splitlines() if ln.startswith(key + " ")]


def _report(run: Path, fmt: str = "json") -> Any:
    out = subprocess.run([sys.executable, "-m", "iolens", "report", str(run), "--format", fmt],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out) if fmt == "json" else out


def test_parse_takes_the_loader_settings_and_refuses_the_rest() -> None:
    assert overrides.parse(["num_workers=4", "persistent_workers=true", "pin_memory=0",
                            "prefetch_factor=4", "multiprocessing_context=spawn"]) == {
        "num_workers": 4, "persistent_workers": True, "pin_memory": False,
        "prefetch_factor": 4, "multiprocessing_context": "spawn"}
    for bad, words in (("batch_size=4", "not a DataLoader setting"),
                       ("num_workers", "expected KEY=VALUE"),
                       ("num_workers=-1", "whole number"),
                       ("num_workers=2000", "expected 0 to 1024"),
                       ("num_workers=four", "whole number"),
                       ("num_workers=1_0", "whole number"),
                       ("num_workers=+2", "whole number"),
                       ("python", "the command to run goes after --"),
                       ("prefetch_factor=0", "expected 1 to 1024"),
                       ("persistent_workers=maybe", "true or false"),
                       ("multiprocessing_context=thread", "fork, spawn, forkserver")):
        with pytest.raises(overrides.SetError, match=words):
            overrides.parse([bad])
    with pytest.raises(overrides.SetError, match="twice"):
        overrides.parse(["num_workers=1", "num_workers=2"])
    with pytest.raises(overrides.SetError, match="only from a loader with workers"):
        overrides.parse(["num_workers=0", "prefetch_factor=4"])
    # what travels to the job comes back the same; a damaged value sets nothing
    got = {"num_workers": 3, "pin_memory": True}
    assert overrides.from_env(overrides.to_env(got, ["Items"])) == (got, ["Items"])
    assert overrides.from_env('{"set": {"num_workers": "x"}}') == ({}, [])
    assert overrides.from_env("not json") == ({}, [])


@pytest.mark.parametrize(("args", "words"), [
    (["--set", "batch_size=4"], "not a DataLoader setting"),
    (["--set", "num_workers=0", "prefetch_factor=2"], "only from a loader with workers"),
    (["--set-loader", "Items"], "it needs --set"),
    (["--no-instrument", "--set", "num_workers=2"], "not with --no-instrument"),
])
def test_settings_that_cannot_apply_are_usage_errors_before_the_job(
        tmp_path: Path, args: list[str], words: str) -> None:
    out, run = _run(tmp_path, *args)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr, out.stderr
    assert "training" not in out.stdout and not run.exists()


def test_the_loaders_take_the_settings_and_the_data_order_stays(tmp_path: Path) -> None:
    plain, _ = _run(tmp_path, name="plain")
    assert plain.returncode == 0, plain.stderr
    assert _lines(plain.stdout, "settings") == ["0 False None"]
    out, run = _run(tmp_path, "--set", "num_workers=2", "persistent_workers=true",
                    "--set", "prefetch_factor=3")
    assert out.returncode == 0, out.stderr
    assert _lines(out.stdout, "settings") == ["2 True 3"]
    assert _lines(out.stdout, "other") == ["2"]  # every loader, without --set-loader
    # the same seeded shuffle gives the samples in the order the same settings written in
    # the code give (persistent workers draw no seed for them each epoch, so from the
    # second epoch on their order is not a loader's without workers: torch's own)
    code, _ = _run(tmp_path, name="code", code=json.dumps(
        {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 3}))
    assert _lines(code.stdout, "settings") == ["2 True 3"]
    assert _lines(out.stdout, "order") == _lines(code.stdout, "order")
    assert _lines(out.stdout, "order")[0] == _lines(plain.stdout, "order")[0]
    workers, _ = _run(tmp_path, "--set", "num_workers=2", name="workers")
    assert _lines(workers.stdout, "order") == _lines(plain.stdout, "order")
    meta = json.loads((run / "meta.json").read_text())
    given = {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 3}
    assert meta["set"] == given and meta["set_loaders"] is None
    loaders = [json.loads(p.read_text()) for p in (run / "timing").glob("loader-*.json")]
    assert loaders and all(ld["set"] == given and ld["num_workers"] == 2 for ld in loaders)
    text = " ".join(_report(run, "text").split())  # (lines wrapped at the width)
    assert ("DataLoader settings given (--set): --set num_workers=2 --set "
            "persistent_workers=true --set prefetch_factor=3") in text
    html = run / "report.html"
    subprocess.run([sys.executable, "-m", "iolens", "report", str(run), "--format", "html",
                    "-o", str(html)], capture_output=True, text=True, timeout=120, check=True)
    assert "--set num_workers=2 --set persistent_workers=true" in html.read_text()


def test_set_loader_names_the_loaders_that_take_them(tmp_path: Path) -> None:
    out, run = _run(tmp_path, "--set", "num_workers=2", "--set-loader", "Other")
    assert out.returncode == 0, out.stderr
    assert _lines(out.stdout, "settings") == ["0 False None"]
    assert _lines(out.stdout, "other") == ["2"]
    assert json.loads((run / "meta.json").read_text())["set_loaders"] == ["Other"]


def test_a_setting_the_loader_cannot_take_stops_before_training(tmp_path: Path) -> None:
    """prefetch_factor on a loader without workers: torch would refuse it; iolens says so,
    in one line, and the job stops with exit 2 before its first batch."""
    out, run = _run(tmp_path, "--set", "prefetch_factor=4")
    assert out.returncode == 2, out.stderr
    assert ("iolens: error: --set prefetch_factor=4: this DataLoader has num_workers=0, and "
            "torch takes it only from a loader with workers; add --set num_workers=N, or "
            "--set-loader NAME for the loaders that have them (dataset Items)") in out.stderr
    assert "Traceback" not in out.stderr and "training" not in out.stdout
    v = _report(run)["verdict"]
    assert v["evidence"][0].startswith("the job stopped where it made its DataLoader"), v
    assert v["recommendations"][0]["action"].startswith("run again with --set"), v


def test_a_later_loader_without_workers_keeps_its_own_and_the_training_goes_on(
        tmp_path: Path) -> None:
    """A training loader given workers and persistent ones, and the code's validation loader
    with none: the first loader takes the settings, so the second is not a mistake in what
    was asked but a loader they do not fit; it keeps num_workers=0 for what needs workers,
    with a warning line, and the training runs to its end."""
    out, run = _run(tmp_path, "--set-loader", "Items", "--set-loader", "Other", "--set",
                    "num_workers=2", "persistent_workers=true", val="1",
                    code=json.dumps({"num_workers": 0}))
    assert out.returncode == 0, out.stderr
    assert _lines(out.stdout, "settings") == ["2 True 2"]
    assert _lines(out.stdout, "val") == ["2 True 2"]  # num_workers is set for it too
    out, run = _run(tmp_path, "--set", "persistent_workers=true", name="persist", val="1",
                    code=json.dumps({"num_workers": 2}))
    assert out.returncode == 0, out.stderr
    assert _lines(out.stdout, "settings") == ["2 True 2"]
    assert _lines(out.stdout, "val") == ["0 False None"]
    assert ("iolens: warning: --set persistent_workers=true left out for the DataLoader of "
            "Other: it has no workers") in out.stderr
    assert len(_lines(out.stdout, "order")) == 2
    loaders = json.loads((run / "meta.json").read_text())["loaders"]
    assert {"set_skipped": {"persistent_workers": True}}.items() <= next(
        d for d in loaders if d["dataset"].endswith("Other") and d["num_workers"] == 0).items()


def test_no_workers_set_drops_what_the_code_asked_of_workers(tmp_path: Path) -> None:
    """--set num_workers=0 on a loader the code gives prefetch_factor and persistent
    workers: as the code change would, those go (torch refuses them without workers)."""
    out, _ = _run(tmp_path, "--set", "num_workers=0", code=json.dumps(
        {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}))
    assert out.returncode == 0, out.stderr
    assert _lines(out.stdout, "settings") == ["0 False None"]


def test_a_set_loader_that_matches_nothing_is_said(tmp_path: Path) -> None:
    out, run = _run(tmp_path, "--set", "num_workers=2", "--set-loader", "Itemz")
    assert out.returncode == 0, out.stderr
    assert _lines(out.stdout, "settings") == ["0 False None"]
    caveat = _report(run)["verdict"]["caveat"]
    assert ("the settings given (--set num_workers=2) reached no DataLoader: --set-loader "
            "Itemz matched none of the loaders' datasets (Items)") in caveat, caveat


def test_monitor_set_applies_while_it_records(tmp_path: Path) -> None:
    script = tmp_path / "mon.py"
    script.write_text(textwrap.dedent("""
        import iolens
        from torch.utils.data import DataLoader
        if __name__ == "__main__":
            try:
                iolens.monitor(set={"num_workerz": 2})
            except ValueError as e:
                print("refused", e)
            with iolens.monitor(out="m", set={"num_workers": 2}, quiet=True):
                dl = DataLoader(list(range(32)), batch_size=8)
                print("inside", dl.num_workers, sum(len(b) for b in dl))
            print("after", DataLoader(list(range(32)), batch_size=8).num_workers)
    """))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert _lines(out.stdout, "inside") == ["2 32"] and _lines(out.stdout, "after") == ["0"]
    assert "refused monitor(set=...): num_workerz: not a DataLoader setting" in out.stdout
    assert json.loads((tmp_path / "m" / "meta.json").read_text())["set"] == {"num_workers": 2}


def test_the_advice_tried_with_set_holds_its_prediction(tmp_path: Path) -> None:
    """Samples that wait off the CPU, one worker: the verdict's worker count comes with the
    `iolens run --set` line that tries it; run as written, compare holds the prediction."""
    from tests.test_lab_advice import TRAIN

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    job = [sys.executable, str(script), "remote", "6", "1", "0.005"]
    before = tmp_path / "before"
    subprocess.run([sys.executable, "-m", "iolens", "run", "--no-live", "--interval", "0.5",
                    "--out", str(before), "--", *job], cwd=tmp_path, capture_output=True,
                   text=True, timeout=180, check=True)
    rec = next(r for r in _report(before)["verdict"]["recommendations"]
               if "num_workers" in (r.get("change") or {}))
    n = rec["change"]["num_workers"]
    assert rec["try"].startswith(f"iolens run --set num_workers={n} -- "), rec
    assert rec["try"].endswith(" ".join(job[1:])), rec
    after = tmp_path / "after"
    subprocess.run([sys.executable, "-m", "iolens", "run", "--no-live", "--interval", "0.5",
                    "--out", str(after), "--set", f"num_workers={n}", "--", *job],
                   cwd=tmp_path, capture_output=True, text=True, timeout=180, check=True)
    cmp = json.loads(subprocess.run(
        [sys.executable, "-m", "iolens", "compare", str(before), str(after), "--format",
         "json"], capture_output=True, text=True, timeout=120, check=True).stdout)
    assert cmp["new"]["set"] == {"num_workers": n}
    proof = cmp["prediction"]
    assert proof["change"]["num_workers"] == n, proof
    assert abs(proof["error"]) <= 0.25 and proof["held"], proof


def test_the_try_line_is_for_map_style_torch_loaders_and_settings_alone() -> None:
    """An IterableDataset's samples repeat in every worker unless it splits them itself, a
    plain iterable has no workers to set, and pinned memory wants non_blocking copies in the
    code too: none of those gets a `--set` line; a map-style DataLoader's worker count does,
    with the run's own --set kept."""
    from iolens.analysis.verdict import Recommendation, Verdict, how_to_try

    def tried(loader: dict[str, Any], change: dict[str, Any], **meta: Any) -> str | None:
        v = Verdict("loader-starved", "high", 0.5,
                    recommendations=[Recommendation("do it", "why", "gain", change=change)])
        how_to_try(v, {"command": ["python", "train.py", "--lr", "0.1 0.2"],
                        "loaders": [loader], **meta})
        return v.recommendations[0].try_it

    torch_map = {"loader": "torch.utils.data.dataloader.DataLoader", "iterable": False,
                 "dataset": "__main__.Items", "set": {"persistent_workers": True}}
    assert tried(torch_map, {"num_workers": 4}, set={"persistent_workers": True},
                 set_loaders=["Items"]) == (
        "iolens run --set persistent_workers=true --set num_workers=4 --set-loader Items "
        "-- python train.py --lr '0.1 0.2'")
    assert tried({**torch_map, "iterable": True}, {"num_workers": 4}) is None
    assert tried({**torch_map, "loader": "iolens.api.InstrumentedLoader"},
                 {"num_workers": 1}) is None
    assert tried(torch_map, {"pin_memory": True}) is None
    assert tried(torch_map, {"fetch_cpu": 0.5}) is None


def test_a_do_not_advice_says_its_command_makes_the_change_it_advises_against() -> None:
    """"do not add DataLoader workers" comes with the `--set` line that adds them, to check
    its prediction that they gain nothing: the text report, the run's closing lines and
    the HTML page say so, where another advice's line is just "with no code change"."""
    from iolens.analysis.verdict.result import verdict_lines
    from iolens.report.html import render_html
    from iolens.report.text import render_text

    fixture = Path(__file__).parent / "fixtures" / "runs" / "request-capped-disk.report.json"
    report = json.loads(fixture.read_text())
    dont = {"action": "do not add DataLoader workers (or prefetch) while loop0 is saturated",
            "because": "loop0 is 97% busy", "expected_gain": "predicted 4.79 steps/s",
            "prediction": None, "change": {"num_workers": 4},
            "try": "iolens run --set num_workers=4 -- python train.py"}
    do = {**dont, "action": "raise num_workers from 1 to 4", "because": "idle disk",
          "try": "iolens run --set num_workers=4 -- python train.py --other"}
    checked = "to check it (the change it advises against), with no code change"
    for first, second in ((dont, do), (do, dont)):
        report["verdict"]["recommendations"] = [first, second]
        text = " ".join(render_text(report, to_terminal=False).split())
        assert f"{checked}: command {1 + (first is do)} at the end" in text
        assert f"with no code change: command {1 + (first is dont)} at the end" in text
        label = checked if first is dont else "with no code change"  # (the first's alone)
        lines = verdict_lines(report["verdict"])
        assert [x for x in lines if x.startswith("  ")] == [f"  {label}: {first['try']}"]
        page = render_html(report, [], plotlyjs="")
        assert page.count(f'<span class="try">{checked}: <code>') == 1
        assert page.count('<span class="try">with no code change: <code>') == 1


def test_a_command_that_names_a_path_gone_since_says_so(tmp_path: Path) -> None:
    """A `--set` line is copied and run as it is: where a path it names is gone (a dataset
    deleted since, a demo's slow disk and its cgroup removed at its end), the text report
    says which, and nothing where all of them are there. Only the run's dataset folders
    (one of them, in one or above one) and cgroups are looked at: not an output the
    command makes, a pattern or a list, nor a FUSE mount (a stat may hang there)."""
    from iolens.report.text import render_text

    fixture = Path(__file__).parent / "fixtures" / "runs" / "request-capped-disk.report.json"
    report = json.loads(fixture.read_text())
    gone, there = tmp_path / "mnt" / "data", tmp_path / "kept"
    there.mkdir()
    cgroup = f"/sys/fs/cgroup/blkio/iolens-test-gone-{os.getpid()}"
    report["storage"] = [
        {"mount": str(tmp_path), "kind": "block", "folders": [str(gone / "class0"), str(there)]},
        {"mount": "/mnt/bucket", "kind": "fuse", "folders": [str(tmp_path / "bucket")]}]
    rec = {"action": "raise num_workers from 1 to 4", "because": "idle disk",
           "expected_gain": "", "prediction": None, "change": {"num_workers": 4},
           "try": f"iolens run --set num_workers=4 -- python train.py --data={gone} "
                  f"--also {there} --bucket {tmp_path / 'bucket'} --out {tmp_path / 'out'} "
                  f"--shards '{gone}/shard-{{000..9}}.tar' --throttle {cgroup}"}
    report["verdict"]["recommendations"] = [rec]
    text = " ".join(render_text(report, to_terminal=False).split())
    assert (f"(gone from this machine now: {gone}, {cgroup}; the command needs them where "
            "it runs)") in text, text
    gone.mkdir(parents=True)
    text = " ".join(render_text(report, to_terminal=False).split())
    assert f"(gone from this machine now: {cgroup}; the command needs it where it runs)" in text
    report["storage"], rec["try"] = [], f"iolens run -- python train.py --data {gone}"
    gone.rmdir()  # (not a folder of the run's dataset: left alone)
    assert "gone from this machine" not in render_text(report, to_terminal=False)
