"""The public Python surface: names, lightness, the seed helper."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import iolens
from tests.kernelfake import FakeDevice, FakeSnapshot, counters, write_snapshot_dir


def test_public_names_are_exactly_these() -> None:
    assert sorted(iolens.__all__) == sorted([
        "DeviceMapping", "DeviceRates", "DiskCounters", "DiskLogger", "DiskSampler",
        "DiskSnapshot", "InstrumentedLoader", "IolensError", "Monitor", "StatsUnavailableError",
        "UnknownDeviceError", "__version__", "device_for_path", "device_rates", "get_disk_usage",
        "instrument", "log_disk_usage", "monitor", "read_snapshot_dir", "snapshot_rates", "step",
    ])
    for name in iolens.__all__:
        assert hasattr(iolens, name)


def test_import_loads_no_optional_dependency() -> None:
    code = ("import sys, iolens, iolens.cli; "
            "heavy = {'psutil', 'torch', 'rich', 'numpy', 'prometheus_client', 'pynvml', "
            "'plotly', 'hypothesis'} & set(sys.modules); print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_get_disk_usage_measures_over_the_interval(tmp_path: Path) -> None:
    before = FakeSnapshot("100.00", [FakeDevice(259, 0, "nvme0n1", counters(
        rd=1000, rd_s=20000, rd_t=500, wr=100, wr_s=4096, wr_t=300, io_t=1000, rq_t=900))])
    after = FakeSnapshot("100.50", [FakeDevice(259, 0, "nvme0n1", counters(
        rd=1400, rd_s=22048, rd_t=700, wr=200, wr_s=6144, wr_t=800, io_t=1250, rq_t=1000))])
    proc = write_snapshot_dir(before, tmp_path)

    def advance() -> None:
        time.sleep(0.1)
        # Same inode, as the kernel's files: the helper's open descriptor must see it.
        with open(proc / "diskstats", "r+") as fh:
            fh.write(after.diskstats_text())
        with open(proc / "uptime", "r+") as fh:
            fh.write("100.50 0.00\n")

    t = threading.Thread(target=advance)
    t.start()
    usage = iolens.get_disk_usage("nvme0n1", interval=0.3, proc_root=str(proc))
    t.join()
    assert list(usage) == ["timestamp", "device", "tps", "read_MBps", "write_MBps", "await_ms",
                           "util_percent"]
    assert usage["device"] == "nvme0n1"
    assert usage["tps"] == 1000.0  # 500 I/Os in 0.5 s
    assert usage["read_MBps"] == pytest.approx(2048 * 512 / 0.5 / 2**20)
    assert usage["write_MBps"] == pytest.approx(2048 * 512 / 0.5 / 2**20)
    assert usage["await_ms"] == pytest.approx(700 / 500)
    assert usage["util_percent"] == 50.0


def test_get_disk_usage_on_this_machine() -> None:
    snap = iolens.DiskSampler().snapshot()
    busy = next(n for n, rec in snap.devices.items() if rec.has_io)
    usage = iolens.get_disk_usage(busy, interval=0.1)
    assert usage["device"] == busy
    assert all(usage[k] >= 0 for k in ("tps", "read_MBps", "write_MBps", "await_ms",
                                       "util_percent"))


def test_get_disk_usage_names_the_devices_that_exist() -> None:
    with pytest.raises(iolens.UnknownDeviceError) as err:
        iolens.get_disk_usage("nvme77n1", interval=0.01)
    assert err.value.device == "nvme77n1" and err.value.available
    assert "devices reported by the kernel" in str(err.value)
    with pytest.raises(ValueError, match="positive"):
        iolens.get_disk_usage("x", interval=0)


def test_sampler_reads_the_real_kernel_like_the_file_says() -> None:
    sampler = iolens.DiskSampler()
    snap = sampler.snapshot()
    text = Path("/proc/diskstats").read_text()
    names = [line.split()[2] for line in text.splitlines() if len(line.split()) >= 14]
    assert list(snap.devices) == names
    assert snap.uptime_cs > 0 and snap.source == "/proc/diskstats"
    later = sampler.snapshot()
    rates = iolens.snapshot_rates(snap, later)
    assert set(rates) == set(later.devices)
    sampler.close()
    sampler.close()
