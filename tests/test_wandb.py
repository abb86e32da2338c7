"""`iolens run --wandb` on a real training, into real offline W&B runs read back from the
run's own file (wandb ships no Python reader of it: :func:`records` reads its block format
and parses each record with wandb's own protobuf classes): metric histories of more than
one point, the verdict in the summary and the report artifact; and beside a run the
script made itself, in its project and group."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("wandb")

from iolens.sinks.tracker import wandb_login
from tests.test_mlflow import TRAIN as MLFLOW_TRAIN

TRAIN = MLFLOW_TRAIN.replace('''if OWN:
    import mlflow
    with mlflow.start_run(run_name="the script's own") as run:
        mlflow.log_param("lr", 0.1)
        train()
        print("RUN", run.info.run_id)
''', '''if OWN:
    import wandb
    run = wandb.init(project="loader", group="sweep-7", mode="offline", config={"lr": 0.1})
    train()
    print("RUN", run.id)
    run.finish()
''')
BLOCK = 32768
"""W&B's run file: a 7-byte header (``:W&B``, a magic number, a version), then records in
blocks of this size, each chunk behind a 7-byte header (checksum, length, type: 1 whole,
2 first, 3 middle, 4 last), as in LevelDB's log format."""


def records(path: Path) -> list[Any]:
    """The records of a W&B run file, as wandb's own protobuf ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the block's tail, too short for a header, is padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            r = pb.Record()  # type: ignore[attr-defined]
            r.ParseFromString(buf)
            out.append(r)
    return out


class Run:
    """What one offline W&B run holds, read from its file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.run: Any = None
        self.history: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.artifacts: list[Any] = []
        self.exit_code: int | None = None
        for r in records(next(folder.glob("run-*.wandb"))):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                self.run = r.run
            elif kind == "history":
                self.history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                     for i in r.history.item})
            elif kind == "summary":
                for i in r.summary.update:
                    self.summary[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
            elif kind == "artifact":
                self.artifacts.append(r.artifact)
            elif kind == "exit":
                self.exit_code = r.exit.exit_code

    @property
    def config(self) -> dict[str, Any]:
        return {i.key: json.loads(i.value_json) for i in self.run.config.update}


def offline_runs(tmp_path: Path) -> dict[str, Run]:
    runs = [Run(d) for d in sorted((tmp_path / "wandb").glob("offline-run-*"))]
    return {r.run.run_id: r for r in runs}


def env_for(tmp_path: Path) -> dict[str, str]:
    """No W&B login, no mode: W&B's folders (cache, staging, settings) under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**env, "HOME": str(home), "WANDB_CACHE_DIR": str(home / "cache"),
            "WANDB_DATA_DIR": str(home / "data"), "WANDB_CONFIG_DIR": str(home / "config")}


def job_only(run_dir: Path) -> None:
    """W&B's service process, which the tracker's client starts, is never taken for the
    job's (NOTE [the recorder's own children]): the job here is its main process and one
    worker. A worker forked at an epoch's start may be caught by one sample before it
    takes its worker's name, and count as an ``other`` process of the job in that one
    interval; a service counted as the job's would be there interval after interval."""
    others = [bool(json.loads(line).get("job", {}).get("roles", {}).get("other"))
              for line in (run_dir / "records.jsonl").read_text().splitlines()]
    assert not any(a and b for a, b in itertools.pairwise(others)), others


def check_run(run: Run, run_dir: Path) -> None:
    s = run.summary
    assert s["iolens.verdict"] in {"loader-starved", "storage-bound", "compute-bound",
                                   "handover-bound"}, s
    assert s["iolens.severity"] in {"none", "moderate", "high"}
    assert s["iolens.run_dir"] == str(run_dir)
    assert s.get("iolens.recommendation"), s
    for key in ("iolens.steps_per_s", "iolens.data_wait_share", "iolens.fetch_ms",
                "iolens.busiest_util"):
        points = [h for h in run.history if key in h]
        assert len(points) > 1, (key, run.history)
        steps = [h["_step"] for h in points]
        assert steps == sorted(set(steps)), steps
    assert any(h["iolens.fetch_ms"] >= 9 for h in run.history if "iolens.fetch_ms" in h)
    # The summary's figures are the whole run's, not its last interval's.
    summary = json.loads((run_dir / "meta.json").read_text())["summary"]
    assert s["iolens.steps_per_s"] == pytest.approx(
        summary["verdict"]["figures"]["steps_per_s"], rel=1e-3)
    assert s["iolens.data_wait_share"] == pytest.approx(summary["data_wait_share"], rel=1e-3)
    assert run.run.job_type == "iolens" and run.run.display_name == run_dir.name
    assert run.exit_code == 0
    [art] = run.artifacts
    assert art.type == "iolens-report", art
    [entry] = art.manifest.contents
    assert entry.path == "iolens/report.html", entry
    page = Path(entry.local_path).read_text()
    assert page.lstrip().lower().startswith("<!doctype html")


def run_with_wandb(tmp_path: Path, mode: str, env: dict[str, str],
                   ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    out = subprocess.run([sys.executable, "-m", "iolens", "run", "--interval", "0.5", "--out",
                          str(tmp_path / "run"), "--no-live", "--wandb", "--",
                          sys.executable, str(tmp_path / "train.py"), mode],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr
    return out


def test_a_new_offline_run_without_a_login(tmp_path: Path) -> None:
    out = run_with_wandb(tmp_path, "plain", {**env_for(tmp_path), "WANDB_PROJECT": "loaders"})
    [(run_id, run)] = offline_runs(tmp_path).items()
    assert run.run.project == "loaders"  # W&B's own setting
    check_run(run, tmp_path / "run")
    job_only(tmp_path / "run")
    assert f"a new offline W&B run {run_id} in {run.folder}" in out.stderr, out.stderr
    assert "wandb sync" in out.stderr
    assert "left running" not in out.stderr, out.stderr


def test_a_run_beside_the_scripts_own_in_its_project_and_group(tmp_path: Path) -> None:
    out = run_with_wandb(tmp_path, "own", env_for(tmp_path))
    theirs = next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("RUN"))
    runs = offline_runs(tmp_path)
    assert theirs in runs and len(runs) == 2, runs
    assert runs[theirs].config["lr"] in (0.1, {"value": 0.1}), runs[theirs].config
    [ours] = [r for k, r in runs.items() if k != theirs]
    assert ours.run.project == "loader" and ours.run.run_group == "sweep-7", ours.run
    assert ours.config["iolens.job_run_id"] in (theirs, {"value": theirs}), ours.config
    check_run(ours, tmp_path / "run")
    # the script's run holds only its own figures
    assert not any(k.startswith("iolens.") for h in runs[theirs].history for k in h)


def test_monitor_with_wandb(tmp_path: Path) -> None:
    script = "import iolens\n" + textwrap.dedent(TRAIN).replace(
        "else:\n    train()",
        "else:\n    with iolens.monitor(sys.argv[2], 0.5, wandb=True):\n        train()")
    assert "iolens.monitor(" in script
    (tmp_path / "train.py").write_text(script)
    out = subprocess.run([sys.executable, str(tmp_path / "train.py"), "plain",
                          str(tmp_path / "run")], cwd=tmp_path, env=env_for(tmp_path),
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    [run] = offline_runs(tmp_path).values()
    check_run(run, tmp_path / "run")
    # the sidecar's W&B service is a child of the job's process, and not the job's
    job_only(tmp_path / "run")


def test_a_login_is_an_api_key_or_a_netrc_entry(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    assert not wandb_login()  # no file
    netrc.write_text("machine example.org login a password b\n")
    netrc.chmod(0o600)
    assert not wandb_login()
    netrc.write_text("machine api.wandb.ai login user password k\n")
    assert wandb_login()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org:8443/")
    assert not wandb_login()
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert wandb_login()
