"""``iolens run --mlflow`` and ``--wandb``: the run's key figures, verdict and report in
an experiment tracker's run.

MLflow. Where the figures go: the job's own MLflow run when the script has one active as a
DataLoader starts (the training-side bootstrap notes its id: NOTE [the job's tracker
run] in iolens/training/_hooks.py), else a new run in the experiment MLflow's own
settings name (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME`` or
``MLFLOW_EXPERIMENT_ID``), named after the run directory. The choice is made at the
first interval with training batches (by then the DataLoader has started), or at the
end for a job that never trains.

- metrics, one point per interval (step = the record's ``seq``): ``iolens.steps_per_s``,
  ``iolens.data_wait_share``, the busiest device's ``iolens.busiest_util`` and
  ``iolens.busiest_r_await`` (and ``iolens.device.<dev>.util`` / ``.r_await`` for each),
  the job's ``iolens.read_MBps``, and the fetch stage split: ``iolens.fetch_ms``
  (per sample), ``iolens.fetch_blocked_share`` (off the CPU: I/O, network, locks),
  ``iolens.fetch_queue_share`` (waiting for a core), ``iolens.collate_ms`` and
  ``iolens.handover_ms`` (per batch);
- at the end, one more point (step = the last ``seq`` + 1) of ``iolens.steps_per_s`` and
  ``iolens.data_wait_share`` over the whole run: the last value a run table shows is the
  run's, not its last interval's, which the run's end cuts short;
- tags at the end: ``iolens.verdict`` (the class), ``iolens.severity``,
  ``iolens.data_wait_share``, ``iolens.recommendation`` (the first one) and
  ``iolens.prediction`` (its prediction, in words), ``iolens.run_dir``;
- the artifact ``iolens/report.html`` (``iolens/report.txt`` where plotly is missing).

mlflow and wandb are imported in a thread of the recorder, never in the job and never before the
job starts: its import and its store's first connection take seconds. A tracker that
fails is dropped with a note, like the other sinks (NOTE [a sink never hurts the job]).
A run this sink made is ended (FINISHED, or FAILED for a non-zero exit); the job's own
run is left to the job.

W&B (Weights & Biases). The same metrics (step = ``seq``), the verdict in the run's summary
(the same keys as MLflow's tags) and the report as the file ``iolens/report.html`` of an
artifact of type ``iolens-report``. The run is always iolens' own: one W&B run takes
one writing process. W&B's own settings choose the project, entity and mode
(``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE``); with no W&B login here and no
``WANDB_MODE`` the run is recorded offline, for ``wandb sync``. When the job has a W&B
run of its own, iolens' run goes into its project and entity and into its group (the
job's run id where it has none), so the two sit side by side. W&B's own sampling of the
machine is off: iolens measures that.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import queue
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from iolens.analysis.pipeline import pipeline
from iolens.sinks.base import SinkError
from iolens.sinks.base import number as _num

TAG_MAX = 5000
"""Characters of a tag value at most (MLflow stores up to 8000)."""
JOIN_S = 60.0
"""How long the end waits for the tracker's thread to send what it holds."""
_MB = 1 << 20
_STOP = object()


def metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The metrics logged for one record (pure)."""
    out: dict[str, float | None] = {}
    train = record.get("train") or {}
    secs = _num(record.get("interval_s"))
    if train.get("batches") and secs:
        out["iolens.steps_per_s"] = train["batches"] / secs
        out["iolens.data_wait_share"] = _num(train.get("data_wait_share"))
    pipe = train.get("pipeline") or {}
    samples, batches = _num(pipe.get("samples")), _num(pipe.get("batches"))
    fetch, cpu = _num(pipe.get("fetch_s")), _num(pipe.get("fetch_cpu_s"))
    if samples and fetch is not None:
        out["iolens.fetch_ms"] = fetch / samples * 1000
        if fetch > 0 and cpu is not None:
            # (the workers' wait for a core is not "blocked": iolens.analysis.pipeline)
            stages = pipeline([dict(record)])
            queued = stages.fetch_queue_share if stages is not None else None
            out["iolens.fetch_queue_share"] = queued
            out["iolens.fetch_blocked_share"] = max(0.0, 1 - cpu / fetch - (queued or 0.0))
    if batches:
        collate = _num(pipe.get("collate_s"))
        out["iolens.collate_ms"] = collate / batches * 1000 if collate is not None else None
        hand = pipe.get("handover") or {}
        count, total = _num(hand.get("count")), _num(hand.get("sum_s"))
        out["iolens.handover_ms"] = total / count * 1000 if count and total is not None \
            else None
    busiest: tuple[float, float | None] | None = None
    for dev, d in (record.get("devices") or {}).items():
        util, wait = _num(d.get("util")), _num(d.get("r_await"))
        out[f"iolens.device.{dev}.util"] = util
        out[f"iolens.device.{dev}.r_await"] = wait
        if util is not None and (busiest is None or util > busiest[0]):
            busiest = (util, wait)
    if busiest is not None:
        out["iolens.busiest_util"], out["iolens.busiest_r_await"] = busiest
    read = _num((record.get("job") or {}).get("read_bytes_s"))
    out["iolens.read_MBps"] = read / _MB if read is not None else None
    return {k: v for k, v in out.items() if v is not None}


def job_run(timing_dir: str, tracker: str = "mlflow") -> dict[str, Any] | None:
    """The ``tracker`` run the job noted as its own (the lowest pid's, for several
    processes)."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(timing_dir), "tracker-*.json")):
        try:
            with open(path, encoding="utf-8") as fh:
                info = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("tracker") == tracker and info.get("run_id"):
            found.append(info)
    found.sort(key=lambda i: i.get("pid") or 0)
    return found[0] if found else None


class TrackerSink:
    """Sends :func:`metrics` of each record to a tracker from a thread; :meth:`finish`
    adds the verdict and the report once the run directory is complete. The tracker's
    run is chosen (:meth:`_decide`) at the first record with training batches, by when
    the job has noted its own run, or at the end."""

    option = ""
    """The command-line option that asks for it, for notes."""
    label = ""
    """The tracker's name in messages."""
    package = ""
    """The package it needs, and the extra that installs it."""

    def __init__(self, run_dir: str) -> None:
        """SinkError when the package is not installed (checked without importing it)."""
        if importlib.util.find_spec(self.package) is None:
            raise SinkError(f"{self.option} needs {self.label}: pip install "
                            f"'iolens[{self.package}]'")
        self.run_dir = run_dir
        """The run directory (set again when the recorder had to record elsewhere)."""
        self.run_id: str | None = None
        self.own = True
        """Whether this sink made the run (then it ends it)."""
        self._queue: queue.Queue[Any] = queue.Queue()
        self._last_seq = -1
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"iolens{self.option}",
                                        daemon=True)
        self._started = False

    # -- the recorder's side ---------------------------------------------------------------

    def write(self, record: Mapping[str, Any]) -> None:
        """Queue the record's metrics; raises what the thread met (the sink is dropped)."""
        if self._error is not None:
            raise self._error
        if not self._started:
            self._started = True
            self._thread.start()
        trained = bool((record.get("train") or {}).get("batches"))
        t = _num(record.get("t"))
        self._last_seq = max(self._last_seq, int(record.get("seq") or 0))
        self._queue.put((int(record.get("seq") or 0),
                         int((t if t is not None else time.time()) * 1000),
                         metrics(record), trained))

    @property
    def failed(self) -> bool:
        """Whether the tracker failed (the sink is then dropped, with a note)."""
        return self._error is not None

    def close(self) -> None:
        """Send what is queued (waiting up to JOIN_S); raises what the thread met."""
        if self._started:
            self._queue.put(_STOP)
            self._thread.join(JOIN_S)
            if self._thread.is_alive():
                self._error = TimeoutError(f"{self.label} took more than {JOIN_S:g} s to take "
                                           "the figures")
        if self._error is not None:
            raise self._error

    def finish(self, path: str, summary: Mapping[str, Any], exit_code: int) -> str:
        """Add the verdict and the report, end a run of our own; returns where the
        figures went, in words. Raises when the tracker fails."""
        if self._error is not None:
            raise self._error
        if self.run_id is None:
            self._decide()
        whole = run_figures(summary)
        if whole:
            # The run's last point is the whole run's figure, the value a run table and a
            # summary show: never the last interval's, which a run's end cuts short.
            self._send([(self._last_seq + 1, int(time.time() * 1000), whole)])
        tags = verdict_tags(summary)
        tags["iolens.run_dir"] = os.path.abspath(path)
        with tempfile.TemporaryDirectory(prefix="iolens-tracker-") as tmp:
            return self._finish(tags, report_file(path, tmp), exit_code)

    # -- the thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        pending: list[tuple[int, int, dict[str, float]]] = []
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    break
                seq, ms, values, trained = item
                pending.append((seq, ms, values))
                if self.run_id is None and trained:
                    self._decide()
                if self.run_id is not None:
                    self._send(pending)
                    pending.clear()
            if pending:
                if self.run_id is None:
                    self._decide()
                self._send(pending)
        except BaseException as exc:  # noqa: BLE001 - handed to the recorder's side
            self._error = exc

    def check(self) -> None:
        """Open the tracker's store now, before the job starts (NOTE [outputs fail before
        the job starts] in iolens/job/run.py): SinkError with one line when it cannot be
        used. This imports the tracker's package (a second or two)."""

    # -- what each tracker does -------------------------------------------------------------

    def _decide(self) -> None:
        """Choose the run and set ``run_id`` (and ``own``)."""
        raise NotImplementedError

    def _send(self, points: list[tuple[int, int, dict[str, float]]]) -> None:
        """Log ``(seq, epoch ms, metrics)`` points into the run."""
        raise NotImplementedError

    def _finish(self, tags: dict[str, str], report: str, exit_code: int) -> str:
        """Log the verdict's ``tags`` and the ``report`` file, end a run of our own."""
        raise NotImplementedError


class MLflowSink(TrackerSink):
    """MLflow: the job's own active run, or a new one."""

    option, label, package = "--mlflow", "MLflow", "mlflow"

    def __init__(self, run_dir: str) -> None:
        super().__init__(run_dir)
        self.tracking_uri: str | None = None
        self._client: Any = None

    def check(self) -> None:
        """MLflow's own settings' store (MLFLOW_TRACKING_URI, else MLflow's default: a
        sqlite ``mlflow.db`` in the current directory since MLflow 3), opened and read."""
        try:
            from mlflow.tracking import MlflowClient  # noqa: PLC0415 - optional and slow

            client = MlflowClient()
            client.search_experiments(max_results=1)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SinkError(f"--mlflow cannot use its tracking store: {first[:300]} (set "
                            "MLFLOW_TRACKING_URI, or pip install 'iolens[mlflow]' for the "
                            "sqlite store MLflow uses by default)") from exc

    def _finish(self, tags: dict[str, str], report: str, exit_code: int) -> str:
        client, run_id = self._client, self.run_id
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        client.log_artifact(run_id, report, artifact_path="iolens")
        if self.own:
            client.set_terminated(run_id, "FINISHED" if exit_code == 0 else "FAILED")
        whose = "a new MLflow run" if self.own else "the job's MLflow run"
        return f"{whose} {run_id} at {self.tracking_uri}"

    def _decide(self) -> None:
        """Log into the job's run if it noted one, else into a new run."""
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 - optional and slow

        theirs = job_run(os.path.join(self.run_dir, "timing"))
        if theirs is not None:
            self._client = MlflowClient(tracking_uri=theirs.get("tracking_uri") or None)
            self.run_id, self.own = str(theirs["run_id"]), False
        else:
            self._client = MlflowClient()
            run = self._client.create_run(
                _experiment(self._client), run_name=os.path.basename(
                    os.path.normpath(self.run_dir)), tags={"iolens.run_dir": self.run_dir})
            self.run_id, self.own = run.info.run_id, True
        self.tracking_uri = str(self._client.tracking_uri)

    def _send(self, points: list[tuple[int, int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415

        batch = [Metric(key, value, ms, seq) for seq, ms, values in points
                 for key, value in values.items()]
        for i in range(0, len(batch), 1000):  # MLflow takes 1000 metrics per call
            self._client.log_batch(self.run_id, metrics=batch[i:i + 1000])


class WandbSink(TrackerSink):
    """W&B: a run of iolens' own, beside the job's (module docstring)."""

    option, label, package = "--wandb", "W&B", "wandb"

    def __init__(self, run_dir: str) -> None:
        super().__init__(run_dir)
        self.offline = False
        """Whether the run is recorded offline (no login here and no WANDB_MODE)."""
        self._run: Any = None

    def check(self) -> None:
        """W&B imports, and an online run has a login: W&B's server is not asked (a run
        without a login is recorded offline, for ``wandb sync``)."""
        try:
            import wandb  # noqa: PLC0415 - optional and slow
        except Exception as exc:
            raise SinkError(f"--wandb cannot import wandb: {exc}") from exc
        if os.environ.get("WANDB_MODE") == "online" and not wandb_login():
            raise SinkError("--wandb: WANDB_MODE=online but there is no W&B login here "
                            "(wandb login, or WANDB_API_KEY); without WANDB_MODE the run is "
                            "recorded offline")
        del wandb

    def _decide(self) -> None:
        import wandb  # noqa: PLC0415 - optional and slow

        theirs = job_run(os.path.join(self.run_dir, "timing"), "wandb") or {}
        self.offline = not os.environ.get("WANDB_MODE") and not wandb_login()
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True,
                                  save_code=False, disable_git=True)
        self._run = wandb.init(
            project=theirs.get("project") or None, entity=theirs.get("entity") or None,
            group=theirs.get("group") or theirs.get("run_id") or None,
            name=os.path.basename(os.path.normpath(self.run_dir)), job_type="iolens",
            config={"iolens.run_dir": self.run_dir,
                    **({"iolens.job_run_id": theirs["run_id"]} if theirs else {})},
            mode="offline" if self.offline else None, reinit="create_new", settings=settings)
        self.run_id = str(self._run.id)

    def _send(self, points: list[tuple[int, int, dict[str, float]]]) -> None:
        for seq, _, values in points:
            self._run.log(values, step=seq)

    def _finish(self, tags: dict[str, str], report: str, exit_code: int) -> str:
        import wandb  # noqa: PLC0415

        run = self._run
        run.summary.update(tags)
        art = wandb.Artifact(f"iolens-report-{run.id}", type="iolens-report")
        art.add_file(report, name=f"iolens/{os.path.basename(report)}")
        run.log_artifact(art)
        folder = os.path.dirname(str(run.dir))  # run.dir is the run folder's files/
        run.finish(exit_code=exit_code)
        if self.offline:
            return (f"a new offline W&B run {run.id} in {folder} (no W&B login here: "
                    "`wandb sync` that folder to upload it)")
        return f"a new W&B run {run.id} in project {run.project}"


def wandb_login() -> bool:
    """Whether W&B has an API key here (the environment, or the netrc entry that ``wandb
    login`` writes), without asking for one."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("//")[-1]
    try:
        import netrc  # noqa: PLC0415

        return netrc.netrc(os.environ.get("NETRC")).authenticators(
            host.split("/")[0].split(":")[0]) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _experiment(client: Any) -> str:
    """The experiment MLflow's own settings name (made when it does not exist yet)."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if name:
        exp = client.get_experiment_by_name(name)
        return str(exp.experiment_id) if exp is not None else str(
            client.create_experiment(name))
    return os.environ.get("MLFLOW_EXPERIMENT_ID") or "0"


def run_figures(summary: Mapping[str, Any]) -> dict[str, float]:
    """The whole run's throughput and data-wait share, under the per-interval metrics'
    names (pure)."""
    v = summary.get("verdict")
    figures = (v.get("figures") if isinstance(v, Mapping) else None) or {}
    out = {"iolens.steps_per_s": _num(figures.get("steps_per_s")),
           "iolens.data_wait_share": _num(summary.get("data_wait_share"))}
    return {k: x for k, x in out.items() if x is not None}


def verdict_tags(summary: Mapping[str, Any]) -> dict[str, str]:
    """The verdict as tags: class, severity, data-wait share, the first recommendation
    and its prediction."""
    v = summary.get("verdict")
    if not isinstance(v, dict):
        return {"iolens.verdict": "none"}
    tags = {"iolens.verdict": str(v.get("class")), "iolens.severity": str(v.get("severity"))}
    share = _num(v.get("data_wait_share"))
    if share is not None:
        tags["iolens.data_wait_share"] = f"{share:.4f}"
    recs = v.get("recommendations") or []
    if recs and isinstance(recs[0], dict):
        r = recs[0]
        tags["iolens.recommendation"] = str(r.get("action"))[:TAG_MAX]
        p = r.get("prediction")
        if isinstance(p, dict) and p.get("steps_per_s") is not None:
            tags["iolens.prediction"] = (
                f"{p['steps_per_s']:.3g} steps/s ({p.get('low', 0):.3g}-{p.get('high', 0):.3g}, "
                f"then {p.get('limit')}-bound), now {p.get('now_steps_per_s', 0):.3g}")
        elif r.get("prediction_unavailable"):
            tags["iolens.prediction"] = f"none: {r['prediction_unavailable']}"[:TAG_MAX]
    return tags


def report_file(path: str, tmp: str) -> str:
    """The run's report written into ``tmp``: HTML, or text where plotly is missing."""
    from iolens._errors import IolensError  # noqa: PLC0415
    from iolens.analysis.rundata import load_run  # noqa: PLC0415
    from iolens.report.build import build_report  # noqa: PLC0415

    data = load_run(path)
    report = build_report(data)
    try:
        from iolens.report.html import plotly_js, render_html  # noqa: PLC0415

        text, name = render_html(report, data.series, plotlyjs=plotly_js()), "report.html"
    except IolensError:
        from iolens.report.text import render_text  # noqa: PLC0415

        text, name = render_text(report, to_terminal=False), "report.txt"
    out = os.path.join(tmp, name)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(text)
    return out
