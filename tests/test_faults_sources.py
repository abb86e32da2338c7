"""Faults in the sources: NVML present but failing, /proc/diskstats empty, unreadable or gone.

NVML: a stub ``libnvidia-ml.so.1``, compiled here with gcc, answers
pynvml's calls the way a failing driver does, chosen by IOLENS_NVML_STUB:

  ok          one GPU, every query answers
  init-fail   nvmlInit returns NVML_ERROR_DRIVER_NOT_LOADED
  init-hang   nvmlInit sleeps IOLENS_NVML_STUB_SLEEP seconds, then answers
  lost        init, count and names answer; every query NVML_ERROR_GPU_IS_LOST
  unknown     the same with NVML_ERROR_UNKNOWN
  flaky:N     the first N samples answer, then every query NVML_ERROR_UNKNOWN
  hang:N      the first N samples answer, the next one's query sleeps
              IOLENS_NVML_STUB_SLEEP seconds (default an hour), later ones answer

pynvml loads the library with CDLL("libnvidia-ml.so.1"), so LD_LIBRARY_PATH
puts the stub under ``iolens run``; in this process each test loads its own
copy into pynvml (a copy has its own call counter).

Disks: ``iolens run`` in a private mount namespace with an empty file, or a
mode-000 one read without CAP_DAC_OVERRIDE (root reads everything else),
bound over /proc/diskstats, with and without an empty /sys/block beside it.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from iolens.analysis.verdict import diagnose, verdict_lines
from iolens.recorder.sampler import Recorder
from iolens.sources.disk import DiskSampler
from iolens.sources.diskstats import parse_diskstats
from iolens.sources.gpu import GpuReader
from tests.conftest import can_unshare_mounts, need

pytest.importorskip("torch")

STUB_C = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned long long total, free, used; } mem_t;

static int device;   /* the one GPU's handle points here */
static int samples;  /* utilization queries so far: one per sample */

static const char *mode(void) {
    const char *m = getenv("IOLENS_NVML_STUB");
    return m ? m : "ok";
}
static int is(const char *m) { return strcmp(mode(), m) == 0; }
static int after(const char *prefix) {
    size_t n = strlen(prefix);
    return strncmp(mode(), prefix, n) == 0 ? atoi(mode() + n) : -1;
}
static void nap(void) {
    const char *s = getenv("IOLENS_NVML_STUB_SLEEP");
    sleep(s ? (unsigned int)atoi(s) : 3600);
}

/* The answer to a query of the GPU; `first` marks a sample's first query. */
static int answer(int first) {
    int n;
    if (is("lost")) return 15;      /* NVML_ERROR_GPU_IS_LOST */
    if (is("unknown")) return 999;  /* NVML_ERROR_UNKNOWN */
    if ((n = after("flaky:")) >= 0) {
        if (first) samples++;
        return samples > n ? 999 : 0;
    }
    if ((n = after("hang:")) >= 0 && first && ++samples == n + 1) nap();
    return 0;
}

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (is("init-fail")) return 9;  /* NVML_ERROR_DRIVER_NOT_LOADED */
    if (is("init-hang")) nap();
    return 0;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) {
    switch (r) {
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    case 999: return "Unknown Error";
    }
    return "stub error";
}
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
    if (i) return 2;  /* NVML_ERROR_INVALID_ARGUMENT */
    *h = &device;
    return 0;
}
int nvmlDeviceGetName(void *h, char *name, unsigned int len) {
    (void)h;
    strncpy(name, "iolens stub GPU", len);
    if (len) name[len - 1] = 0;
    return 0;
}
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
    int r = answer(1);
    (void)h;
    if (!r) { u->gpu = 42; u->memory = 7; }
    return r;
}
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    int r = answer(0);
    (void)h;
    if (!r) { m->total = 16ULL << 30; m->used = 1ULL << 30; m->free = m->total - m->used; }
    return r;
}
static int no_processes(unsigned int *count) {
    int r = answer(0);
    if (!r) *count = 0;
    return r;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, void *infos) {
    (void)h; (void)infos;
    return no_processes(count);
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned int *count, void *infos) {
    (void)h; (void)infos;
    return no_processes(count);
}
"""

TRAIN = textwrap.dedent("""
    import hashlib, os, sys, time, torch
    from torch.utils.data import DataLoader, Dataset

    class Files(Dataset):
        def __init__(self, folder):
            self.paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
        def __len__(self):
            return len(self.paths)
        def __getitem__(self, i):
            with open(self.paths[i], "rb") as fh:
                data = fh.read()
            time.sleep(0.01)  # decoding: the loop waits for its data
            return torch.frombuffer(bytearray(data), dtype=torch.uint8).float()

    if __name__ == "__main__":
        torch.manual_seed(0)
        torch.set_num_threads(1)
        loader = DataLoader(Files(sys.argv[1]), batch_size=4, num_workers=2)
        model = torch.nn.Linear(1024, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        digest = hashlib.sha256()
        for epoch in range(3):
            for x in loader:
                digest.update(x.numpy().tobytes())
                loss = model(x / 255).pow(2).mean()
                opt.zero_grad(); loss.backward(); opt.step()
        print("checksum", digest.hexdigest()[:16], "loss", f"{loss.item():.6f}", flush=True)
        sys.exit(int(sys.argv[2]))
""")

EXIT_CODE = 3
INTERVAL = 0.2
BLIND = "the verdict rests on the training loop's timing"


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stub, compiled once: ``<dir>/libnvidia-ml.so.1``."""
    need(shutil.which("gcc") is not None, "gcc is not installed (builds the NVML stub)")
    folder = tmp_path_factory.mktemp("nvml")
    src = folder / "stub.c"
    src.write_text(STUB_C)
    lib = folder / "libnvidia-ml.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(lib),
                    str(src)], check=True, capture_output=True, timeout=60)
    return lib


@pytest.fixture
def stub_nvml(stub_lib: Path, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``use(mode, sleep=3600)``: this process's pynvml calls a fresh copy of the stub."""
    import pynvml

    def use(mode: str, sleep: float = 3600) -> None:
        monkeypatch.setenv("IOLENS_NVML_STUB", mode)
        monkeypatch.setenv("IOLENS_NVML_STUB_SLEEP", str(int(sleep)))
        copy = tmp_path / f"libnvml-{re.sub(r'[^a-z0-9]', '-', mode)}.so"
        shutil.copy(stub_lib, copy)
        monkeypatch.setattr(pynvml, "nvmlLib", ctypes.CDLL(str(copy)))
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})

    return use


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The training script, its data, and what it prints and returns without iolens."""
    folder = tmp_path_factory.mktemp("job")
    data = folder / "data"
    data.mkdir()
    for i in range(64):
        (data / f"{i:03d}.bin").write_bytes(bytes((i * 7 + j) % 256 for j in range(1024)))
    script = folder / "train.py"
    script.write_text(TRAIN)
    command = [sys.executable, str(script), str(data), str(EXIT_CODE)]
    t0 = time.monotonic()
    plain = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    seconds = time.monotonic() - t0
    assert plain.returncode == EXIT_CODE, plain.stderr[-2000:]
    assert plain.stdout.startswith("checksum "), plain.stdout
    return {"command": command, "stdout": plain.stdout, "seconds": seconds}


def a_device() -> str:
    """A block device of this machine, watched with --device: the run then has device figures
    to record even where the test's folder is on no block device (tmpfs, overlay)."""
    with open("/proc/diskstats") as fh:
        names = list(parse_diskstats(fh.read()).devices)
    need(bool(names), "/proc/diskstats lists no block device here")
    return names[0]


def iolens_run(job: dict[str, Any], out: Path, *, env: dict[str, str] | None = None,
               prefix: list[str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    """``iolens run`` of the training (under ``prefix``); the result and its seconds."""
    cmd = [*(prefix or []), sys.executable, "-m", "iolens", "run", "--out", str(out),
           "--interval", str(INTERVAL), "--device", a_device(), "--no-live", "--",
           *job["command"]]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **(env or {})}, cwd=out.parent)
    return proc, time.monotonic() - t0


def read_run(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    meta = json.loads((out / "meta.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return meta, records


def report(out: Path, fmt: str) -> str:
    """``iolens report`` in ``fmt``; its output, whitespace and table borders folded."""
    proc = subprocess.run([sys.executable, "-m", "iolens", "report", str(out), "--format", fmt],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    if fmt == "json":
        return proc.stdout
    return " ".join(re.sub(r"[│┃┏┓┗┛┡┩└┘┌┐├┤─━╭╮╰╯|]", " ", proc.stdout).split())


def assert_job_unchanged(proc: subprocess.CompletedProcess[str], job: dict[str, Any]) -> None:
    assert proc.returncode == EXIT_CODE, proc.stderr[-3000:]
    assert proc.stdout == job["stdout"]


def assert_sampled_every_interval(records: list[dict[str, Any]], *, devices: bool,
                                  slack: float = 0.5) -> float:
    """CPU, the job's processes and (if ``devices``) a device in every record, no long gap;
    returns the largest gap between two records."""
    assert len(records) >= 5
    assert [r["seq"] for r in records] == list(range(len(records)))
    for r in records:
        assert set(r["cpu"]) >= {"user", "system", "iowait", "idle"}, r
        assert r["mem"], r
        assert bool(r["devices"]) is devices, r["devices"]
    assert all(r["job"]["pids"] >= 1 for r in records[:-1])  # the last may follow the exit
    assert sum(r["train"].get("batches", 0) for r in records) == 48
    gaps = [float(b["elapsed_s"]) - float(a["elapsed_s"]) for a, b in itertools.pairwise(records)]
    assert max(gaps) <= INTERVAL + slack, gaps
    return max(gaps)


# -- NVML present but failing: GpuReader against the stub ---------------------------------


def test_reader_nvml_init_fails_is_a_reason(stub_nvml: Callable[..., None]) -> None:
    """NVML init fails (driver not loaded): GpuReader unavailable, NVML's error as reason."""
    stub_nvml("init-fail")
    reader = GpuReader()
    assert not reader.available
    assert reader.reason == "NVML unavailable: Driver Not Loaded"
    assert reader.sample() == []
    reader.close()


@pytest.mark.parametrize(("mode", "text"), [("lost", "GPU is lost"), ("unknown", "Unknown Error")])
def test_reader_every_query_fails(stub_nvml: Callable[..., None], mode: str, text: str) -> None:
    """NVML up, every GPU query fails: each sample carries NVML's error, kept as reason."""
    stub_nvml(mode)
    reader = GpuReader()
    assert reader.available and reader.names == ["iolens stub GPU"]
    assert reader.sample() == [{"index": 0, "error": text}]
    assert reader.sample() == [{"index": 0, "error": text}]
    assert reader.reason == f"GPU 0: {text}"
    reader.close()
    reader.close()
    assert reader.sample() == []


def test_reader_queries_start_failing_mid_run(stub_nvml: Callable[..., None]) -> None:
    """NVML fails from the third sample on: figures first, then NVML's error each sample."""
    stub_nvml("flaky:2")
    reader = GpuReader()
    got = [reader.sample() for _ in range(4)]
    assert [g[0].get("util_pct") for g in got[:2]] == [42.0, 42.0]
    assert got[0][0]["mem_used_bytes"] == 1 << 30 and got[0][0]["pids"] == []
    assert got[2:] == [[{"index": 0, "error": "Unknown Error"}]] * 2
    reader.close()


def test_reader_hung_query_is_bounded_and_recovers(stub_nvml: Callable[..., None],
                                                  record_property: Callable[[str, Any], None]
                                                  ) -> None:
    """NVML query hangs 2 s: samples return within the timeout marked stale, then recover.

    The sample that meets the hung call waits its timeout once; the next ones
    return at once; figures come back once NVML answers."""
    stub_nvml("hang:1", sleep=2)
    reader = GpuReader(timeout=0.3)
    assert reader.sample()[0]["util_pct"] == 42.0
    t0 = time.monotonic()
    (first,) = reader.sample()  # the query that hangs
    waited = time.monotonic() - t0
    t1 = time.monotonic()
    (second,) = reader.sample()  # NVML still blocked: no second wait
    again = time.monotonic() - t1
    assert first["stale_s"] >= 0.2 and "NVML has not answered for" in first["error"]
    assert second["stale_s"] >= first["stale_s"] and waited < 1.0 and again < 0.2
    assert reader.reason.startswith("GPU 0: NVML has not answered")
    deadline = time.monotonic() + 10
    while "error" in (latest := reader.sample()[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert latest["util_pct"] == 42.0
    reader.close()
    record_property("measured", f"hung query: sample returned in {waited:.2f} s (timeout "
                                f"0.3 s), the next in {again * 1000:.1f} ms")


def test_reader_hung_init_does_not_block(stub_nvml: Callable[..., None],
                                         record_property: Callable[[str, Any], None]) -> None:
    """nvmlInit hangs 2 s: GpuReader() returns at its timeout with why, GPU sampled later."""
    stub_nvml("init-hang", sleep=2)
    t0 = time.monotonic()
    reader = GpuReader(timeout=0.3, init_timeout=0.3)
    waited = time.monotonic() - t0
    assert waited < 1.5 and not reader.available
    assert "NVML did not start within 0.3 s" in reader.reason
    assert reader.sample() == []
    deadline = time.monotonic() + 10
    while not reader.available and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reader.available and reader.reason == ""
    assert reader.sample()[0]["util_pct"] == 42.0
    reader.close()
    record_property("measured", f"hung nvmlInit: constructor returned in {waited:.2f} s")


# -- NVML present but failing: iolens run of a real training -------------------------------


@pytest.mark.parametrize(("mode", "text"), [
    ("init-fail", "NVML unavailable: Driver Not Loaded"),
    ("lost", "GPU is lost"),
    ("flaky:3", "Unknown Error"),
    ("hang:3", "NVML has not answered"),
])
def test_run_with_failing_nvml(stub_lib: Path, job: dict[str, Any], tmp_path: Path, mode: str,
                               text: str, record_property: Callable[[str, Any], None]) -> None:
    """iolens run, NVML failing: job output and exit code unchanged, NVML error reported.

    NVML fails at init, on every query, from the fourth sample on, or hangs
    in a call for an hour: disk, CPU, processes and training are recorded
    every interval all the same, the NVML error text is in the records, meta
    and report, and a hung call costs one sample its timeout at most."""
    out = tmp_path / "run"
    proc, seconds = iolens_run(job, out, env={
        "LD_LIBRARY_PATH": str(stub_lib.parent), "IOLENS_NVML_STUB": mode})
    assert_job_unchanged(proc, job)
    meta, records = read_run(out)
    # A hung call costs one sample at most the reader's timeout (1 s), then nothing.
    gap = assert_sampled_every_interval(records, devices=True, slack=1.5 if "hang" in mode
                                        else 0.5)
    gpu = meta["gpu"]
    assert text in gpu["reason"], gpu
    entries = [g for r in records for g in r.get("gpu", [])]
    if mode == "init-fail":
        assert not gpu["available"] and not entries
    else:
        assert gpu["names"] == ["iolens stub GPU"]
        assert text in entries[-1]["error"]
    if mode.startswith(("flaky", "hang")):
        assert [g.get("util_pct") for g in entries[:3]] == [42.0] * 3
    if mode.startswith("hang"):
        stale = [g["stale_s"] for g in entries[3:]]
        assert stale == sorted(stale) and stale[-1] > 1, entries  # blocked, and for longer
    rep = json.loads(report(out, "json"))
    assert rep["verdict"]["class"] and text in rep["gpus"]["reason"]
    assert rep["training"]["batches"] == 48
    text_report = report(out, "text")
    assert "verdict" in text_report
    if mode in ("init-fail", "lost"):
        assert f"GPU: none recorded ({gpu['reason']})" in text_report
    record_property("measured", f"NVML {mode}: iolens run {seconds:.1f} s against "
                                f"{job['seconds']:.1f} s without; {len(records)} records, "
                                f"largest gap {gap:.2f} s")


# -- /proc/diskstats absent, empty or unreadable ---------------------------------------------


def _fake_proc(root: Path, diskstats: str | None) -> Path:
    proc = root / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text("cpu  100 0 50 1000 10 0 0 0 0 0\n")
    (proc / "meminfo").write_text("MemAvailable: 1000 kB\nCached: 500 kB\nDirty: 0 kB\n")
    (proc / "uptime").write_text("100.00 0.00\n")
    if diskstats is not None:
        (proc / "diskstats").write_text(diskstats)
    return proc


def _vda(reads: int) -> str:
    return f" 253 0 vda {reads} 0 {reads * 8} {reads} 0 0 0 0 0 {reads} {reads} 0 0 0 0 0 0\n"


@pytest.mark.parametrize("diskstats", [None, ""])
def test_sampler_without_diskstats_or_sysfs(tmp_path: Path, diskstats: str | None) -> None:
    """/proc/diskstats absent or empty, no /sys/block: the snapshot error names both."""
    proc = _fake_proc(tmp_path, diskstats)
    sampler = DiskSampler(str(proc), str(tmp_path / "sys"))
    with pytest.raises(Exception, match=r"cannot read .*/diskstats \((No such file or "
                                        r"directory|it lists no block device); and cannot "
                                        r"read .*/sys/block"):
        sampler.snapshot()
    sampler.close()


def test_sampler_empty_diskstats_falls_back_to_sysfs(tmp_path: Path) -> None:
    """/proc/diskstats empty, /sys/block present: counters from sysfs, a note says so."""
    proc = _fake_proc(tmp_path, "")
    stat = tmp_path / "sys" / "block" / "vda"
    stat.mkdir(parents=True)
    (stat / "stat").write_text("10 0 80 10 0 0 0 0 0 10 10\n")
    (stat / "dev").write_text("253:0\n")
    sampler = DiskSampler(str(proc), str(tmp_path / "sys"))
    assert set(sampler.snapshot().devices) == {"vda"}
    assert sampler.notes == [f"cannot read {proc}/diskstats (it lists no block device); "
                             f"reading {tmp_path}/sys/block/*/stat instead"]
    sampler.close()


def test_diskstats_vanishing_mid_run(tmp_path: Path) -> None:
    """/proc/diskstats gone mid-run: device figures stop with a note, verdict says when.

    The recorder goes on with CPU and memory, and the verdict's caveat says
    from what time it rests on the training loop's timing alone."""
    proc = _fake_proc(tmp_path, _vda(0))
    rec = Recorder(None, None, 1.0, {"vda": "test"}, proc_root=str(proc),
                   sys_root=str(tmp_path / "sys"), discover=False)
    records = []
    for i in range(1, 7):
        (proc / "uptime").write_text(f"{100 + i}.00 0.00\n")
        (proc / "diskstats").write_text(_vda(10 * i) if i <= 3 else "")
        r = rec.sample()
        r["elapsed_s"], r["interval_s"] = float(i), 1.0
        r["train"] = {"batches": 10, "step_source": "dataloader",
                      "data_wait": {"count": 10, "sum_s": 0.5, "p50_s": 0.05},
                      "step": {"count": 10, "sum_s": 1.0, "p50_s": 0.1}}
        records.append(r)
    rec.close()
    assert [bool(r["devices"]) for r in records] == [True] * 3 + [False] * 3
    assert all("idle" in r["cpu"] for r in records)
    (stopped,) = [n for n in rec.notes if n.startswith("device statistics stopped")]
    assert "it lists no block device" in stopped
    v = diagnose(records, {"notes": rec.notes, "cpus": 4})
    assert v.caveat is not None and v.caveat.startswith(stopped)
    assert "(at 00:03); from then on " + BLIND in v.caveat
    assert verdict_lines(v.to_dict())[-1] == f"note: {v.caveat}"


def _namespace(tmp_path: Path, diskstats: str, sysfs: bool) -> list[str]:
    """A command prefix: a private mount namespace with ``diskstats`` (``empty`` or
    ``unreadable``) bound over /proc/diskstats, /sys/block emptied unless ``sysfs``."""
    fake = tmp_path / "diskstats"
    fake.write_text("")
    steps = [f"mount --bind {fake} /proc/diskstats"]
    if not sysfs:
        steps.append("mount -t tmpfs -o size=1m iolens-empty /sys/block")
    run = 'exec "$@"'
    if diskstats == "unreadable":
        fake.chmod(0)
        # Root reads a mode-000 file; without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
        # it gets EACCES like anyone else (the job's own files are root's: unaffected).
        drop = "-dac_override,-dac_read_search"
        run = f'exec setpriv --bounding-set {drop} --inh-caps {drop} -- "$@"'
    return ["unshare", "-m", "sh", "-ec", " && ".join([*steps, run]), "iolens-ns"]


@pytest.mark.parametrize(("diskstats", "sysfs"), [
    ("empty", True), ("unreadable", True), ("unreadable", False)])
def test_run_without_diskstats(job: dict[str, Any], tmp_path: Path, diskstats: str,
                               sysfs: bool, record_property: Callable[[str, Any], None]) -> None:
    """iolens run, /proc/diskstats empty or unreadable: job unchanged, verdict says its basis.

    CPU, processes and training are recorded every interval. With /sys/block
    the device figures come from sysfs (and a note says so); without, the
    verdict rests on the training loop's timing and says so in the run's
    last lines and in the text and JSON reports."""
    need(can_unshare_mounts(), "needs root and unshare(1) to bind a file over /proc/diskstats")
    need(shutil.which("setpriv") is not None, "setpriv(1) is not installed (drops CAP_DAC_*)")
    out = tmp_path / "run"
    proc, seconds = iolens_run(job, out, prefix=_namespace(tmp_path, diskstats, sysfs))
    assert_job_unchanged(proc, job)
    meta, records = read_run(out)
    gap = assert_sampled_every_interval(records, devices=sysfs)
    reason = "it lists no block device" if diskstats == "empty" else "Permission denied"
    rep = json.loads(report(out, "json"))
    text = report(out, "text")
    assert rep["verdict"]["class"] and rep["training"]["batches"] == 48
    record_property("measured", f"/proc/diskstats {diskstats}, /sys/block "
                                f"{'present' if sysfs else 'empty'}: iolens run {seconds:.1f} s "
                                f"against {job['seconds']:.1f} s without, {len(records)} records,"
                                f" largest gap {gap:.2f} s, verdict {rep['verdict']['class']}")
    # (the job exits EXIT_CODE on purpose, which the verdict notes after the rest)
    ended = (f"the job failed (exit code {EXIT_CODE}) after 48 batches: the verdict is of "
             "what it did until then")
    if sysfs:
        fallback = (f"cannot read /proc/diskstats ({reason}); reading /sys/block/*/stat "
                    "instead")
        assert meta["disk_source"] == "/sys/block" and rep["devices"]
        assert rep["verdict"]["caveat"] == ended
        assert fallback in meta["notes"]
        assert fallback in rep["notes"] and fallback in text
    else:
        caveat = rep["verdict"]["caveat"]
        blind = (f"no device statistics: cannot read /proc/diskstats ({reason}; and "
                 "cannot read /sys/block (it lists no block device)); " + BLIND
                 + " (data wait share, step time) and the job's processes alone")
        assert caveat == f"{blind}; {ended}"
        assert caveat in text and f"note: {caveat}" in proc.stderr
        assert [f["evidence"] for f in rep["findings"] if f["class"] == "no-disk-stats"] == [
            [blind]]
        assert "storage not measured" in " ".join(rep["verdict"]["evidence"])
