"""`iolens probe --storage PATH` tells the storage cases apart on real storage, read-only:

- a throttled loop device (SlowDisk) limited in reads/s is IOPS-bound, one limited in
  bytes/s bandwidth-bound, each ceiling within 30% of its throttle; the device's write
  counter and the files' mtimes do not move, and the run stays within its time bound;
- on an ordinary folder the page cache is left as found (warm files stay cached, cold
  ones stay out), by O_DIRECT and by the evicted method alike;
- an rclone FUSE mount limited in requests/s is rate-limited; one whose server only adds
  latency to each request is latency-bound;
- bad arguments are usage errors (exit 2); the classification on constructed figures.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

# Imported here, so that their files are in the page cache before a probe joins a
# throttled cgroup whose limit also holds the disk they sit on.
import iolens.cli.probe
import iolens.recorder.storage
from iolens.cli import probe as probe_cmd
from iolens.loaderbench import storageprobe as sp
from iolens.loaderbench.storageprobe import Phase
from tests.conftest import need
from tests.fuselab import fuse_lab_skip_reason, slow_fuse

assert iolens.cli.probe is probe_cmd and iolens.recorder.storage

START_ALLOWANCE_S = 8.0
"""Interpreter start-up, listing and the reads in flight at the deadline: the bound over
--seconds (a bound check, not a speed test)."""
TOLERANCE = 0.3
"""How far a measured ceiling may sit from the throttle that sets it."""
KEYS = {"path", "mount", "fstype", "device", "kind", "files_seen", "sample_bytes", "method",
        "random_1", "random_k", "sequential", "iops_ceiling", "bandwidth_ceiling", "limit",
        "parallel_gain", "summary", "seconds", "notes"}
PHASE_KEYS = {"concurrency", "reads", "seconds", "reads_per_s", "bytes_per_s",
              "latency_p50_ms"}
SEQUENTIAL_KEYS = {"request_bytes", "source", "reads", "seconds", "bytes_per_s"}


def run_probe(*args: str, cgroup: str | None = None,
              timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    """``python -m iolens probe ARGS`` as a user runs it (inside ``cgroup`` when given: the
    throttle holds only its processes); the result and its wall time."""
    cmd = [sys.executable, "-m", "iolens", "probe", *args]
    if cgroup is not None:
        cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *cmd]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                         cwd="/")
    return out, time.monotonic() - t0


def probe_json(*args: str, seconds: float, cgroup: str | None = None) -> dict[str, Any]:
    """The JSON result of a probe run for ``seconds``, checked for its shape and time bound."""
    out, wall = run_probe(*args, "--seconds", f"{seconds:g}", "--format", "json",
                          cgroup=cgroup)
    assert out.returncode == 0, out.stderr
    r: dict[str, Any] = json.loads(out.stdout)
    assert set(r) == KEYS, set(r) ^ KEYS
    assert set(r["random_1"]) == PHASE_KEYS and set(r["random_k"]) == PHASE_KEYS
    assert r["sequential"] is None or set(r["sequential"]) == SEQUENTIAL_KEYS
    assert wall < seconds + START_ALLOWANCE_S, (wall, r)
    assert r["seconds"] < seconds + sp.JOIN_GRACE_S + 0.5, r
    return r


def near(value: float, target: float) -> bool:
    return abs(value - target) <= TOLERANCE * target


def write_files(folder: Path, count: int, size: int, prefix: str = "") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{prefix}{i:04d}.bin" for i in range(count)]
    for p in paths:
        p.write_bytes(os.urandom(size))
    return paths


# -- the classification, on constructed figures ------------------------------------------


def phase(concurrency: int, reads_per_s: float, size: int = 64 << 10,
          seconds: float = 2.0) -> Phase:
    n = round(reads_per_s * seconds)
    return Phase(concurrency, reads=n, seconds=seconds, bytes=n * size)


def seq(bytes_per_s: float, seconds: float = 2.0) -> Phase:
    n = round(bytes_per_s * seconds / sp.REQUEST_BYTES)
    return Phase(1, reads=n, seconds=seconds, bytes=n * sp.REQUEST_BYTES)


@pytest.mark.parametrize(("kind", "r1", "rk", "sequential", "limit"), [
    # 100 reads/s of 64 KiB (6.25 MiB/s) and 1 MiB reads at 50 MiB/s: requests bind
    ("block", 100, 100, 50 << 20, "iops"),
    # 8 MiB/s either way: bytes bind
    ("block", 128, 128, 8 << 20, "bandwidth"),
    # just at and just under the packing threshold, over the better random phase
    ("block", 100, 160, int(160 * (64 << 10) * sp.PACK_GAIN) + (1 << 20), "iops"),
    ("block", 100, 160, int(160 * (64 << 10) * 1.4), "bandwidth"),
    # FUSE: in-flight reads deliver more, or they do not
    ("fuse", 30, 220, None, "latency"),
    ("fuse", 20, 20, None, "rate"),
    ("nfs", 50, 60, 100 << 20, "rate"),  # a sequential figure does not decide for NFS
    # a block device whose sequential bandwidth could not be measured (not root)
    ("block", 100, 700, None, "latency"),
    ("block", 100, 101, None, "rate"),
])
def test_the_classification_on_constructed_figures(kind: str, r1: float, rk: float,
                                                    sequential: int | None,
                                                    limit: str) -> None:
    got, why = sp.classify(kind, "direct", phase(1, r1), phase(8, rk),
                           None if sequential is None else seq(sequential),
                           sample_bytes=64 << 10)
    assert got == limit, why
    assert why.startswith({"iops": "IOPS-bound", "bandwidth": "bandwidth-bound",
                           "latency": "latency-bound", "rate": "rate-limited"}[limit])


def test_too_few_reads_or_memory_reads_are_unknown() -> None:
    few, why = sp.classify("block", "direct", phase(1, 5), phase(8, 100), seq(50 << 20))
    assert few == "unknown" and "too few reads" in why and "--seconds" in why
    cached, why = sp.classify("tmpfs", "cached", phase(1, 5000), phase(8, 9000), None)
    assert cached == "unknown" and "memory" in why
    skipped = Phase(1, skipped=300)
    warm, why = sp.classify("block", "evicted", skipped, Phase(8, skipped=300), None)
    assert warm == "unknown" and "page cache" in why and "drop_caches" in why


def test_ceilings_and_gain_come_from_the_phases() -> None:
    r = sp.StorageProbe("/d", "/", "ext4", "vda", "block", 10, 64 << 10, "direct",
                        phase(1, 50), phase(8, 200), sp.Sequential("device", seq(90 << 20)))
    d = r.to_dict()
    assert d["iops_ceiling"] == 200.0 and d["parallel_gain"] == 4.0
    assert d["bandwidth_ceiling"] == 90 << 20
    assert d["sequential"]["request_bytes"] == 1 << 20 and d["sequential"]["source"] == "device"


# -- a throttled loop device ------------------------------------------------------------------


def loop_writes(loop_name: str) -> int:
    """Writes completed on the device (/sys/block/<dev>/stat, field 5)."""
    return int(Path(f"/sys/block/{loop_name}/stat").read_text().split()[4])


@pytest.mark.parametrize(("throttle", "limit"), [
    ({"read_iops": 100}, "iops"),
    ({"read_bps": 8 << 20}, "bandwidth"),
])
def test_a_throttled_disk_is_told_iops_or_bandwidth_bound_and_never_written(
        tmp_path: Path, throttle: dict[str, int], limit: str,
        record_property: Any) -> None:
    """300 files of 64 KiB on a loop device throttled in reads/s or in bytes/s: the limit
    named, the throttled ceiling within 30%; no write reaches the device, no mtime moves,
    the run ends within --seconds plus a start-up allowance; --run writes the result."""
    from iolens.demo.slowdisk import SlowDisk, missing_requirements

    need(os.geteuid() == 0, "needs root to attach loop devices, mount and make blkio cgroups")
    missing = missing_requirements()
    need(not missing, "cannot make a slow disk here: needs " + "; ".join(missing))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "meta.json").write_text("{}\n")
    with SlowDisk(128 << 20, **throttle) as disk:  # type: ignore[arg-type]
        data = Path(disk.mount_point) / "data"
        files = write_files(data, 300, 64 << 10)
        disk.evict()  # syncs first: nothing left to write back
        mtimes = [p.stat().st_mtime_ns for p in files]
        writes = loop_writes(disk.loop_name)
        r = probe_json("--storage", str(data), "--run", str(run_dir), seconds=6,
                       cgroup=disk.cgroup)
        assert loop_writes(disk.loop_name) == writes, "the probe wrote to the device"
        assert [p.stat().st_mtime_ns for p in files] == mtimes
    record_property("measured", f"{throttle}: {r['limit']}, {r['iops_ceiling']} reads/s, "
                                f"{r['bandwidth_ceiling'] / (1 << 20):.2f} MiB/s, "
                                f"random_k {r['random_k']}, sequential {r['sequential']}")
    assert r["limit"] == limit, r
    assert (r["kind"], r["fstype"], r["device"], r["method"]) == ("block", "ext4",
                                                                    disk.loop_name, "direct")
    assert r["files_seen"] == 300 and r["sample_bytes"] == 64 << 10
    assert r["sequential"]["source"] == "device", r  # every file is small
    assert any(f"/dev/{disk.loop_name}" in n and "read-only" in n for n in r["notes"]), r
    if limit == "iops":
        assert near(r["iops_ceiling"], 100), r
        assert r["sequential"]["bytes_per_s"] >= sp.PACK_GAIN * r["random_k"]["bytes_per_s"]
    else:
        assert near(r["bandwidth_ceiling"], 8 << 20), r
        assert near(r["random_k"]["bytes_per_s"], 8 << 20), r
        assert near(r["sequential"]["bytes_per_s"], 8 << 20), r
    written = json.loads((run_dir / "storage_probe.json").read_text())
    assert written == r


# -- the page cache -------------------------------------------------------------------------


def drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


DAMON = Path("/sys/kernel/mm/damon/admin/kdamonds")


@contextlib.contextmanager
def no_proactive_reclaim() -> Iterator[None]:
    """This machine's kernel runs DAMON with a ``pageout`` scheme: it writes out pages it
    judges cold, page-cache pages of files just read among them (a clean-clone CI run saw
    512 of 2528 warm pages go in the seconds of this test, the probe's reads touching none
    of them). Paused here, as root, for the test's few seconds, and turned on again."""
    paused = []
    try:
        for state in sorted(DAMON.glob("*/state")):
            schemes = state.parent.glob("contexts/*/schemes/*/action")
            if state.read_text().strip() == "on" and any(
                    a.read_text().strip() == "pageout" for a in schemes):
                need(os.access(state, os.W_OK), f"{state} (proactive reclaim) needs root to "
                                                "pause for an exact page-cache check")
                state.write_text("off")
                paused.append(state)
        yield
    finally:
        for state in paused:
            state.write_text("on")


def test_the_page_cache_is_left_as_found(tmp_path: Path, record_property: Any) -> None:
    """Half the files read (cached), half dropped (cold), on an ordinary folder; after a
    probe with O_DIRECT and one with the evicted method (reads of cold ranges only, each
    dropped again), every warm file is still cached and every cold one still out."""
    with no_proactive_reclaim():
        _page_cache_left_as_found(tmp_path, record_property)


def _page_cache_left_as_found(tmp_path: Path, record_property: Any) -> None:
    data = tmp_path / "data"
    files = write_files(data, 60, 64 << 10) + write_files(data, 2, 8 << 20, prefix="big")
    kind = iolens.recorder.storage.kind_of(*_fs_of(data))
    need(kind == "block", f"{data} is on {kind} storage, whose pages cannot be dropped")
    os.sync()
    warm, cold = files[0::2], files[1::2]
    for p in cold:
        drop(p)
    for p in warm:
        p.read_bytes()
    pages = {p: -(-p.stat().st_size // sp.ALIGN) for p in files}

    def check(label: str) -> None:
        cached_warm = sum(sp.resident_pages_of(str(p)) for p in warm)
        cached_cold = sum(sp.resident_pages_of(str(p)) for p in cold)
        record_property("measured", f"{label}: warm {cached_warm}/{sum(pages[p] for p in warm)}"
                                    f" pages cached, cold {cached_cold}")
        assert cached_warm >= 0.99 * sum(pages[p] for p in warm), label
        assert cached_cold <= 0.01 * sum(pages[p] for p in cold), label

    check("before")
    r = probe_json("--storage", str(data), seconds=2)
    assert r["method"] == "direct" and r["random_1"]["reads"] > 0, r
    assert r["sequential"]["source"] == "files", r
    check("after O_DIRECT")
    result = sp.probe_storage(str(data), seconds=2, allow_direct=False)
    assert result.method == "evicted", result.notes
    assert result.random_1.reads > 0 and result.random_1.skipped > 0, result
    assert result.sequential is not None and result.sequential.phase.reads > 0
    check("after evicted")


def _fs_of(path: Path) -> tuple[str, str | None]:
    from iolens.sources.devmap import device_for_path

    m = device_for_path(str(path))
    return m.fstype, m.device


# -- FUSE ---------------------------------------------------------------------------------


def test_a_request_limited_fuse_mount_is_rate_limited(tmp_path: Path,
                                                      record_property: Any) -> None:
    """rclone at 30 requests/s over loopback WebDAV: 8 reads in flight deliver no more
    reads/s than one, so the limit is a rate; the ceiling is the request limit."""
    reason = fuse_lab_skip_reason()
    need(reason is None, reason or "")
    src = tmp_path / "bucket"
    write_files(src, 200, 32 << 10)
    with slow_fuse(str(src), 30, tmp=tmp_path) as lab:
        r = probe_json("--storage", lab.mount_point, seconds=4)
    record_property("measured", f"rate: {r['iops_ceiling']} reads/s, gain "
                                f"{r['parallel_gain']}")
    assert r["limit"] == "rate", r
    assert (r["kind"], r["fstype"], r["device"], r["sequential"]) == (
        "fuse", "fuse.rclone", None, None), r
    assert r["parallel_gain"] < sp.PARALLEL_GAIN and near(r["iops_ceiling"], 30), r
    assert any("sequential bandwidth not measured" in n for n in r["notes"]), r


class _SlowHandler(SimpleHTTPRequestHandler):
    """Serves a folder; each file's GET waits DELAY_S first (a store's latency, no limit)."""

    DELAY_S = 0.03

    def do_GET(self) -> None:
        if not self.path.endswith("/"):
            time.sleep(self.DELAY_S)
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@contextlib.contextmanager
def latency_fuse(data: Path, tmp: Path) -> Iterator[str]:
    """``data`` served over loopback HTTP with a delay per file and mounted by rclone (its
    http backend, no request limit); the mount point."""
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_SlowHandler, directory=str(data)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    mnt = tmp / "mnt"
    mnt.mkdir()
    (tmp / "rclone.conf").touch()
    env = {**os.environ, "RCLONE_CONFIG": str(tmp / "rclone.conf"),
           "RCLONE_CACHE_DIR": str(tmp / "rclone-cache")}
    port = server.server_address[1]
    mount = subprocess.Popen(
        ["rclone", "mount", f":http,url='http://127.0.0.1:{port}/':", str(mnt),
         "--vfs-cache-mode", "off", "--read-only", "--dir-cache-time", "1h",
         "--poll-interval", "0", "--no-modtime", "--no-checksum", "--log-level", "ERROR"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mnt):
            if mount.poll() is not None or time.monotonic() > deadline:
                err = mount.stderr.read().decode(errors="replace") if mount.stderr else ""
                raise RuntimeError(f"rclone mount of http://127.0.0.1:{port}/ failed: {err}")
            time.sleep(0.05)
        yield str(mnt)
    finally:
        if os.path.ismount(mnt) and subprocess.run(
                ["fusermount3", "-u", str(mnt)], capture_output=True, check=False,
                timeout=30).returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True, check=False,
                           timeout=30)
        mount.terminate()
        try:
            mount.wait(5)
        except subprocess.TimeoutExpired:
            mount.kill()
            mount.wait(5)
        server.shutdown()
        server.server_close()


def test_a_fuse_mount_with_latency_alone_is_latency_bound(tmp_path: Path,
                                                          record_property: Any) -> None:
    """rclone over an HTTP server that adds 30 ms to each file's GET and limits nothing:
    8 reads in flight deliver several times the reads/s of one: latency-bound."""
    reason = fuse_lab_skip_reason()
    need(reason is None, reason or "")
    with socket.socket() as s:  # loopback TCP is there (the server binds it)
        s.bind(("127.0.0.1", 0))
    src = tmp_path / "bucket"
    write_files(src, 200, 32 << 10)
    with latency_fuse(src, tmp_path) as mnt:
        # rclone lists the folder once (a HEAD a file), as for a job that uses the mount
        assert len(os.listdir(mnt)) == 200
        r = probe_json("--storage", mnt, seconds=4)
    record_property("measured", f"latency: {r['random_1']['reads_per_s']} -> "
                                f"{r['random_k']['reads_per_s']} reads/s, gain "
                                f"{r['parallel_gain']}")
    assert r["limit"] == "latency", r
    assert r["kind"] == "fuse" and r["parallel_gain"] >= 3, r
    # one in flight: about one read per 30 ms
    assert r["random_1"]["reads_per_s"] < 1 / _SlowHandler.DELAY_S, r


# -- the command line ---------------------------------------------------------------------


def test_the_help_teaches_the_storage_probe_with_its_thresholds() -> None:
    text = probe_cmd.build_parser().format_help()
    assert "iolens probe --storage PATH [--seconds S] [--concurrency K] [--run DIR]" in text
    assert "iolens probe --storage /data/train\n" in text  # an example
    assert f"{sp.PACK_GAIN:g}x the bytes/s" in text and f"{sp.PARALLEL_GAIN:g}x the" in text
    assert f"under {sp.MIN_READS} a phase" in text and "storage_probe.json" in text


def test_text_output_and_the_import_stays_light(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_files(data, 20, 16 << 10)
    out, _ = run_probe("--storage", str(data), "--seconds", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"iolens probe --storage {data}\n"), out.stdout
    for text in ("random reads, 1 in flight", "random reads, 8 in flight", "IOPS ceiling",
                 "bandwidth ceiling", "\nlimit: "):
        assert text in out.stdout, out.stdout
    assert "iolens probe: [2/" in out.stderr and "random 16 KiB reads, 1 in flight: " \
        in out.stderr, out.stderr
    light = subprocess.run(
        [sys.executable, "-c", "import sys, iolens, iolens.cli; "
         "print('iolens.loaderbench.storageprobe' in sys.modules)"],
        capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "False"


@pytest.mark.parametrize(("args", "message"), [
    (["--storage", "{data}", "--folder", "{data}"], "not allowed with argument"),
    (["--storage", "{data}", "--model", "m:f"], "--model applies to the stage probe"),
    (["--storage", "/no/such/dataset"], "--storage /no/such/dataset: no such file or folder"),
    (["--storage", "{empty}"], "{empty}: no readable file under it"),
    (["--storage", "{data}", "--run", "{data}"], "not an iolens run directory (no meta.json"),
    (["--storage", "{data}", "--run", "/no/such/run"], "--run /no/such/run: no such folder"),
    (["--storage", "{data}", "--concurrency", "1"], "--concurrency must be from 2 to 256"),
    (["--storage", "{data}", "--seconds", "0"], "--seconds must be above 0"),
    (["--folder", "{data}", "--concurrency", "4"], "--concurrency applies to --storage"),
    ([], "one of --dataset MODULE:FACTORY, --folder DIR or --storage PATH is required"),
])
def test_bad_arguments_exit_2_with_a_message(tmp_path: Path, args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    data, empty = tmp_path / "data", tmp_path / "empty"
    write_files(data, 3, 4096)
    empty.mkdir()
    (empty / "zero.bin").touch()

    def fill(s: str) -> str:
        return s.replace("{data}", str(data)).replace("{empty}", str(empty))

    assert probe_cmd.main([fill(a) for a in args] + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert fill(message) in err and err.startswith("usage: iolens probe"), err
    assert not (data / "storage_probe.json").exists()


def test_the_sequential_reads_are_the_devices_readahead_window(tmp_path: Path) -> None:
    from iolens.loaderbench.storageprobe import (
        REQUEST_BYTES,
        REQUEST_BYTES_MAX,
        sequential_request_bytes,
    )

    def disk(name: str, kib: str) -> None:
        queue = tmp_path / "devices" / name / "queue"
        queue.mkdir(parents=True)
        (queue / "read_ahead_kb").write_text(kib + "\n")
        (tmp_path / "devices" / name / f"{name}1").mkdir()
        (tmp_path / "class" / "block").mkdir(parents=True, exist_ok=True)
        (tmp_path / "class" / "block" / name).symlink_to(tmp_path / "devices" / name)
        (tmp_path / "class" / "block" / f"{name}1").symlink_to(
            tmp_path / "devices" / name / f"{name}1")

    disk("loop0", "2560")
    disk("sda", "128")
    disk("md0", "65536")
    disk("bad", "many")
    got = {d: sequential_request_bytes(d, str(tmp_path))
           for d in ("loop0", "sda", "sda1", "md0", "bad", "nvme9n1", None)}
    assert got == {"loop0": 2560 << 10, "sda": REQUEST_BYTES, "sda1": REQUEST_BYTES,
                   "md0": REQUEST_BYTES_MAX, "bad": REQUEST_BYTES, "nvme9n1": REQUEST_BYTES,
                   None: REQUEST_BYTES}
    (tmp_path / "devices" / "loop0" / "queue" / "read_ahead_kb").write_text("4096")
    assert sequential_request_bytes("loop01", str(tmp_path)) == 4 << 20  # its partition


def test_packed_files_are_read_at_the_jobs_sample_size(tmp_path: Path) -> None:
    """One file of 8 MiB that a job read 64 KiB a sample of (HDF5, LMDB): the random reads
    are 64 KiB, not the file's first 4 MiB, which on a device that limits requests read as
    a bandwidth limit. Files a few samples large keep their own size."""
    data = tmp_path / "data"
    write_files(data, 1, 8 << 20, prefix="pack")
    packed = sp.probe_storage(str(data), seconds=1, sample_bytes=65_000)
    assert packed.sample_bytes == 64 << 10, packed.notes
    assert any("the job's bytes per sample" in n for n in packed.notes), packed.notes
    whole = sp.probe_storage(str(data), seconds=1, sample_bytes=1 << 20)
    assert whole.sample_bytes == 4 << 20, whole.notes
    assert sp.probe_storage(str(data), seconds=1).sample_bytes == 4 << 20
