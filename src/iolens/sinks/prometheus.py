"""The Prometheus endpoint: a custom collector over the recorder's latest state, served over HTTP.

Names follow node_exporter's diskstats under the ``iolens_`` prefix
(docs/metrics.md): raw cumulative counters in base units
(bytes, seconds; discards in sectors, as node_exporter has them), so PromQL
written for node_exporter carries over: %util is
``100 * rate(iolens_disk_io_time_seconds_total[1m])``. Every series carries
``host``, ``job`` and ``rank``; device series add ``device``, process-tree
series ``role``, GPU series ``gpu``, FUSE series ``mount``. The training
series (histograms, steps, epochs) carry the rank of the process that timed
them (its RANK variable, as torchrun sets it), every other series the job's
own rank. The input
pipeline's counters (``iolens_pipeline_*``) sum what the DataLoader workers
timed per batch, so ``rate(iolens_pipeline_fetch_seconds_total[1m]) /
rate(iolens_pipeline_samples_total[1m])`` is the fetch time per sample.

prometheus-client is optional: this module imports it only where it is
used, and :func:`require_client` says what to install when it is missing.
The collector has its own registry, never the process-wide default one.

NOTE [scrapes never block sampling] (in :mod:`iolens.recorder.totals`): the
collector only takes the latest published state; building the answer runs
in the server's request thread.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from iolens._version import __version__
from iolens.recorder.totals import ExportState, HistogramState
from iolens.sinks.base import SinkError
from iolens.sources.procfs import CLK_TCK

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

    from prometheus_client.metrics_core import Metric

DEFAULT_PORT = 9478
"""The standalone exporter's port when --listen gives none."""
INSTALL_HINT = "pip install 'iolens[prometheus]'"


class ExporterError(SinkError):
    """The endpoint cannot serve: bad address, port in use, prometheus-client missing.

    The message is one line that says why.
    """


def require_client() -> None:
    """Raise :class:`ExporterError` naming the package to install when prometheus-client is
    missing."""
    try:
        import prometheus_client  # noqa: F401, PLC0415 - optional; checked before serving
    except ImportError:
        raise ExporterError(f"the Prometheus endpoint needs prometheus-client: "
                            f"{INSTALL_HINT}") from None


def parse_listen(text: str, default_port: int | None = None) -> tuple[str, int]:
    """``[HOST:]PORT`` -> (host, port); the host defaults to 127.0.0.1 (also for ``:PORT``).

    IPv6 hosts go in brackets (``[::1]:9478``). Port 0 takes any free port.
    With ``default_port``, a bare host is allowed too. ValueError says what is wrong.
    """
    text = text.strip()
    host, port_text = "", text
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"{text!r}: an IPv6 address needs its closing ']'")
        host, rest = text[1:end], text[end + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r}: expected [HOST]:PORT")
        port_text = rest[1:]
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        if ":" in host:
            raise ValueError(f"{text!r}: put an IPv6 address in brackets, e.g. [::1]:9478")
    elif not text.isdigit():
        host, port_text = text, ""
    if not port_text:
        if default_port is None or not host:
            raise ValueError(f"{text!r}: expected [HOST:]PORT, e.g. 9478 or 0.0.0.0:9478")
        port_text = str(default_port)
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 0 to 65535")
    return host or "127.0.0.1", int(port_text)


@dataclass(frozen=True)
class ExportLabels:
    """The labels every series carries."""

    host: str
    """The machine's name."""
    job: str
    """The run's name: the run directory's name, or --job."""
    rank: str = "0"
    """The job's rank (RANK in its environment), "0" when unknown."""


_BASE = ("host", "job", "rank")

# (name without _total, help, DiskCounters field, unit conversion, fields the kernel must print)
_DISK_COUNTERS: tuple[tuple[str, str, str, str, int], ...] = (
    ("iolens_disk_reads_completed", "Reads completed.", "reads", "", 11),
    ("iolens_disk_reads_merged", "Adjacent reads merged.", "reads_merged", "", 11),
    ("iolens_disk_read_bytes", "Bytes read.", "sectors_read", "sectors", 11),
    ("iolens_disk_read_time_seconds", "Seconds spent by all reads.", "read_ms", "ms", 11),
    ("iolens_disk_writes_completed", "Writes completed.", "writes", "", 11),
    ("iolens_disk_writes_merged", "Adjacent writes merged.", "writes_merged", "", 11),
    ("iolens_disk_written_bytes", "Bytes written.", "sectors_written", "sectors", 11),
    ("iolens_disk_write_time_seconds", "Seconds spent by all writes.", "write_ms", "ms", 11),
    ("iolens_disk_io_time_seconds", "Seconds the device had I/O in flight (busy time).",
     "io_ms", "ms", 11),
    ("iolens_disk_io_time_weighted_seconds",
     "Seconds spent doing I/O weighted by the I/Os in flight (queue time).", "weighted_ms",
     "ms", 11),
    ("iolens_disk_discards_completed", "Discards completed.", "discards", "", 15),
    ("iolens_disk_discards_merged", "Adjacent discards merged.", "discards_merged", "", 15),
    ("iolens_disk_discarded_sectors", "512-byte sectors discarded.", "sectors_discarded", "", 15),
    ("iolens_disk_discard_time_seconds", "Seconds spent by all discards.", "discard_ms", "ms",
     15),
    ("iolens_disk_flush_requests", "Flush requests completed.", "flushes", "", 17),
    ("iolens_disk_flush_requests_time_seconds", "Seconds spent by all flush requests.",
     "flush_ms", "ms", 17),
)

_JOB_IO = (
    ("iolens_job_read_bytes", "Bytes the job's processes made the block layer read "
     "(/proc/<pid>/io read_bytes), processes that ended included.", "read_bytes"),
    ("iolens_job_write_bytes", "Bytes the job's processes dirtied for writeback (write_bytes).",
     "write_bytes"),
    ("iolens_job_cancelled_write_bytes", "Dirtied bytes never written back "
     "(cancelled_write_bytes).", "cancelled_write_bytes"),
    ("iolens_job_rchar_bytes", "Bytes the job's processes read through syscalls, page-cache "
     "hits and pipes included (rchar).", "rchar"),
    ("iolens_job_wchar_bytes", "Bytes the job's processes wrote through syscalls (wchar).",
     "wchar"),
)

_CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

_MEMORY = (
    ("iolens_memory_cached_bytes", "Page cache (Cached in /proc/meminfo).", "cached_bytes"),
    ("iolens_memory_dirty_bytes", "Memory waiting to be written back (Dirty).", "dirty_bytes"),
    ("iolens_memory_writeback_bytes", "Memory being written back now (Writeback).",
     "writeback_bytes"),
    ("iolens_memory_available_bytes", "Memory available without swapping (MemAvailable).",
     "available_bytes"),
)

_GPU = (
    ("iolens_gpu_utilization_ratio", "Share of the last sample period a kernel ran (NVML), "
     "0 to 1.", "util_pct", 100.0),
    ("iolens_gpu_memory_utilization_ratio", "Share of the period device memory was read or "
     "written (NVML), 0 to 1.", "mem_util_pct", 100.0),
    ("iolens_gpu_memory_used_bytes", "Device memory in use.", "mem_used_bytes", 1.0),
    ("iolens_gpu_memory_total_bytes", "Device memory in all.", "mem_total_bytes", 1.0),
)


_PIPELINE = (
    ("iolens_pipeline_fetch_seconds", "Wall seconds the DataLoader workers (or the training "
     "process, with num_workers=0) spent fetching samples: reading and decoding them.",
     "fetch_s"),
    ("iolens_pipeline_fetch_cpu_seconds", "The part of the fetch on the fetching thread's CPU "
     "clock; the rest was blocked off CPU (I/O, network, FUSE, locks, sleeps).",
     "fetch_cpu_s"),
    ("iolens_pipeline_collate_seconds", "Seconds the workers spent collating samples into "
     "batches.", "collate_s"),
    ("iolens_pipeline_idle_seconds", "Seconds the workers waited for indices to fetch (the "
     "loader ahead of the training loop).", "idle_s"),
    ("iolens_pipeline_handover_seconds", "Seconds from a worker handing a batch over to the "
     "training loop having it (queue, unpickling, pin_memory).", "handover_s"),
    ("iolens_pipeline_handovers", "Batches whose hand-over to the training loop was timed.",
     "handovers"),
    ("iolens_pipeline_batches", "Batches whose fetch the workers timed.", "batches"),
    ("iolens_pipeline_samples", "Samples the workers fetched in those batches.", "samples"),
    ("iolens_pipeline_files_opened", "Files the workers opened while fetching.", "files"),
)
"""The input pipeline's counters (without _total): name, help, PipelineState field."""


def _seconds(ms: int) -> float:
    return ms / 1000


class IolensCollector:
    """One ``collect()`` over the latest :class:`ExportState` of a recording.

    ``source`` returns that state (None before the first sample). The live
    verdict is drawn with :func:`iolens.analysis.verdict.diagnose` from the
    state's recent records, once per new sample, whichever scrape comes first.
    """

    def __init__(self, source: Callable[[], ExportState | None], labels: ExportLabels,
                 verdict_meta: Mapping[str, Any] | None = None) -> None:
        self.source = source
        self.labels = labels
        self.verdict_meta = dict(verdict_meta or {"cpus": os.cpu_count()})
        self._base = (labels.host, labels.job, labels.rank)
        self._verdict_lock = threading.Lock()
        self._verdict: tuple[int, dict[str, Any] | None] = (-1, None)

    def collect(self) -> Iterator[Metric]:
        """Every metric of the latest state, built afresh (nothing is cached but the verdict)."""
        from prometheus_client.core import (  # noqa: PLC0415 - optional dependency
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        base = self._base
        info = InfoMetricFamily("iolens_build", "The iolens version serving these metrics.",
                                labels=_BASE)
        info.add_metric(base, {"version": __version__})
        yield info
        state = self.source()
        if state is None:
            return
        samples = CounterMetricFamily("iolens_samples", "Samples the recorder has taken.",
                                      labels=_BASE)
        samples.add_metric(base, state.samples)
        yield samples
        if state.time:
            stamp = GaugeMetricFamily("iolens_last_sample_timestamp_seconds",
                                      "When the latest sample was taken, Unix time.",
                                      labels=_BASE)
            stamp.add_metric(base, state.time)
            yield stamp
        yield from self._disks(state)
        yield from self._job(state)
        yield from self._machine(state)
        yield from self._gpus(state)
        yield from self._storage(state)
        if state.training:
            yield from self._training(state)
            yield from self._pipeline(state)

    def _disks(self, state: ExportState) -> Iterator[Metric]:
        from prometheus_client.core import (  # noqa: PLC0415 - optional dependency
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        if not state.devices:
            return
        names = (*_BASE, "device")
        base = self._base
        for name, doc, attr, unit, need in _DISK_COUNTERS:
            fam = CounterMetricFamily(name, doc, labels=names)
            for d in state.devices:
                if d.fields < need:
                    continue  # the kernel does not report it (discards 4.18+, flushes 5.5+)
                raw: int = getattr(d, attr)
                value: float = (raw * 512 if unit == "sectors"
                                else _seconds(raw) if unit == "ms" else raw)
                fam.add_metric((*base, d.name), value)
            if fam.samples:
                yield fam
        now = GaugeMetricFamily("iolens_disk_io_now", "I/Os in flight now.", labels=names)
        for d in state.devices:
            now.add_metric((*base, d.name), d.in_flight)
        yield now

    def _job(self, state: ExportState) -> Iterator[Metric]:
        from prometheus_client.core import (  # noqa: PLC0415 - optional dependency
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        if not state.roles:
            return
        names = (*_BASE, "role")
        base = self._base
        for name, doc, attr in _JOB_IO:
            fam = CounterMetricFamily(name, doc, labels=names)
            for role, rs in state.roles.items():
                fam.add_metric((*base, role), getattr(rs.io, attr))
            yield fam
        cpu = CounterMetricFamily("iolens_job_cpu_seconds", "CPU seconds (user and system) of "
                                  "the job's processes, processes that ended included.",
                                  labels=names)
        procs = GaugeMetricFamily("iolens_job_processes", "The job's processes now.",
                                  labels=names)
        for role, rs in state.roles.items():
            cpu.add_metric((*base, role), rs.cpu_s)
            procs.add_metric((*base, role), rs.pids)
        yield cpu
        yield procs

    def _machine(self, state: ExportState) -> Iterator[Metric]:
        from prometheus_client.core import (  # noqa: PLC0415 - optional dependency
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        base = self._base
        if state.cpu is not None:
            fam = CounterMetricFamily("iolens_cpu_seconds", "CPU seconds of all CPUs together "
                                      "by mode (/proc/stat).", labels=(*_BASE, "mode"))
            for mode in _CPU_MODES:
                fam.add_metric((*base, mode), getattr(state.cpu, mode) / CLK_TCK)
            yield fam
            count = GaugeMetricFamily("iolens_cpu_count", "CPUs of the machine.", labels=_BASE)
            count.add_metric(base, os.cpu_count() or 1)
            yield count
        for name, doc, key in _MEMORY:
            if key in state.mem:
                fam_g = GaugeMetricFamily(name, doc, labels=_BASE)
                fam_g.add_metric(base, state.mem[key])
                yield fam_g

    def _gpus(self, state: ExportState) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415 - optional

        if not state.gpus:
            return
        names = (*_BASE, "gpu")
        base = self._base
        for name, doc, key, div in _GPU:
            fam = GaugeMetricFamily(name, doc, labels=names)
            for g in state.gpus:
                if isinstance(g.get(key), int | float):
                    fam.add_metric((*base, str(g.get("index"))), g[key] / div)
            if fam.samples:
                yield fam
        fam = GaugeMetricFamily("iolens_gpu_job_processes", "The job's processes using the GPU.",
                                labels=names)
        for g in state.gpus:
            fam.add_metric((*base, str(g.get("index"))), len(g.get("job_pids") or ()))
        yield fam

    def _storage(self, state: ExportState) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415 - optional

        if not state.fuse_waiting:
            return
        fam = GaugeMetricFamily("iolens_fuse_requests_waiting", "Requests waiting on the FUSE "
                                "connection of a mount that serves the dataset "
                                "(/sys/fs/fuse/connections/<N>/waiting).",
                                labels=(*_BASE, "mount"))
        for mount, waiting in state.fuse_waiting.items():
            fam.add_metric((*self._base, mount), waiting)
        yield fam

    def _pipeline(self, state: ExportState) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily  # noqa: PLC0415 - optional

        for name, doc, attr in _PIPELINE:
            fam = CounterMetricFamily(name, doc, labels=_BASE)
            fam.add_metric(self._base, getattr(state.pipeline, attr))
            yield fam

    def _training(self, state: ExportState) -> Iterator[Metric]:
        from prometheus_client.core import (  # noqa: PLC0415 - optional dependency
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            InfoMetricFamily,
        )

        host, job, rank = self._base
        wait = HistogramMetricFamily(
            "iolens_data_wait_seconds", "How long the training loop waited for each batch "
            "(next() on the DataLoader).", labels=_BASE)
        step = HistogramMetricFamily(
            "iolens_step_seconds", "Time from one batch to the next (the whole step, data wait "
            "included), or between step marks.", labels=_BASE)
        steps = CounterMetricFamily("iolens_steps", "Training steps timed.", labels=_BASE)
        epochs = CounterMetricFamily("iolens_epochs", "Epochs started.", labels=_BASE)
        for r in state.ranks:
            labels = (host, job, r.rank)
            wait.add_metric(labels, _buckets(r.data_wait), r.data_wait.sum_s)
            step.add_metric(labels, _buckets(r.step), r.step.sum_s)
            steps.add_metric(labels, r.step.count)
            epochs.add_metric(labels, r.epochs)
        yield wait
        yield step
        yield steps
        yield epochs
        verdict = self._live_verdict(state)
        if verdict is None:
            return
        info = InfoMetricFamily("iolens_verdict", "What holds the training back, from the "
                                "records of about the last minute: class and severity.",
                                labels=_BASE)
        info.add_metric(self._base, {"class": str(verdict.get("class")),
                                     "severity": str(verdict.get("severity"))})
        yield info
        share = verdict.get("data_wait_share")
        if isinstance(share, int | float):
            g = GaugeMetricFamily("iolens_verdict_data_wait_ratio", "Share of step time the loop "
                                  "waited for data over the verdict's records, 0 to 1.",
                                  labels=_BASE)
            g.add_metric((host, job, rank), share)
            yield g

    def _live_verdict(self, state: ExportState) -> dict[str, Any] | None:
        from iolens.analysis.verdict import diagnose  # noqa: PLC0415 - only when scraped

        with self._verdict_lock:
            seen, verdict = self._verdict
            if seen == state.samples:
                return verdict
            try:
                verdict = diagnose(list(state.recent), self.verdict_meta).to_dict()
            except Exception:  # noqa: BLE001 - a scrape answers without the verdict
                verdict = None
            self._verdict = (state.samples, verdict)
            return verdict


def _buckets(h: HistogramState) -> list[tuple[str, float]]:
    # repr() writes these bounds as client_python does ("0.001", "1.0", "60.0").
    out: list[tuple[str, float]] = [(repr(float(b)), c)
                                    for b, c in zip(h.bounds, h.cumulative, strict=False)]
    out.append(("+Inf", h.count))
    return out


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class Exporter:
    """Serves ``/metrics`` from a private registry in a daemon thread.

    Binds in the constructor, so that a port in use is known before
    anything else starts; :meth:`start` begins serving; :meth:`close` stops
    and is safe to call twice.
    """

    def __init__(self, host: str, port: int, collector: IolensCollector) -> None:
        require_client()
        from prometheus_client import CollectorRegistry, make_wsgi_app  # noqa: PLC0415

        self.collector = collector
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        metrics = make_wsgi_app(registry)

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            path = environ.get("PATH_INFO") or "/"
            if path in ("/metrics", "/metrics/"):
                out: Iterable[bytes] = metrics(environ, start_response)
                return out
            status = "200 OK" if path == "/" else "404 Not Found"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [b"iolens exporter: the metrics are at /metrics\n"]

        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                        flags=socket.AI_PASSIVE)[0][0]
        except OSError as exc:
            raise ExporterError(f"cannot listen on {where}: {_why(exc)}") from None

        class Server(_Server):
            address_family = family

        try:
            self._server: WSGIServer | None = make_server(host, port, app, Server,
                                                          handler_class=_QuietHandler)
        except OSError as exc:
            raise ExporterError(f"cannot listen on {where}: {_why(exc)}") from None
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the metrics are served."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach the endpoint (it listens on a loopback
        address)."""
        host = self._bound_host().partition("%")[0]
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def _bound_host(self) -> str:
        server = self._server
        return str(server.server_address[0]) if server is not None else self.host

    def notice(self, flag: str) -> str:
        """Where the metrics are served and who can reach them, for a line on stderr at
        start; ``flag`` is the option that chooses the address (``--listen``)."""
        if self.loopback:
            return (f"{self.url}, on loopback only (reachable from this machine alone; "
                    f"{flag} 0.0.0.0:{self.port} serves every interface)")
        return (f"{self.url}; warning: on this address the metrics (host, job and device "
                f"names, I/O figures) are open to the network, without authentication; "
                f"{flag} 127.0.0.1:{self.port} keeps them on this machine")

    def start(self) -> None:
        """Serve in a daemon thread."""
        if self._server is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="iolens-exporter", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        if self._thread is not None:
            server.shutdown()
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            server.server_close()


def _why(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the address is already in use (another exporter there?)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no such address on this machine"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror or exc})"
    return str(exc.strerror or exc).lower()


def start_exporter(listen: str, source: Callable[[], ExportState | None], labels: ExportLabels,
                   verdict_meta: Mapping[str, Any] | None = None) -> Exporter:
    """Bind ``[HOST:]PORT`` and serve the recording's metrics; ExporterError says why not."""
    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise ExporterError(f"bad address {exc}") from None
    exporter = Exporter(host, port, IolensCollector(source, labels, verdict_meta))
    exporter.start()
    return exporter
