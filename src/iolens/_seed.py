"""The seed article's helper, kept for users of its script."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from iolens._errors import UnknownDeviceError
from iolens.core.rates import device_rates, interval_cs
from iolens.sources.disk import DiskSampler


def get_disk_usage(device: str = "nvme0n1", interval: float = 1.0, *,
                   proc_root: str = "/proc") -> dict[str, Any]:
    """Measure one device over ``interval`` seconds by reading its counters twice.

    Returns ``{"timestamp", "device", "tps", "read_MBps", "write_MBps",
    "await_ms", "util_percent"}``, the figures ``iostat -x`` would print for
    that interval (no subprocess, no iostat needed). Raises
    :class:`UnknownDeviceError` naming the device and listing those that exist.
    """
    if not interval > 0:
        raise ValueError(f"interval must be a positive number of seconds, not {interval!r}")
    sampler = DiskSampler(proc_root=proc_root)
    try:
        first = sampler.snapshot()
        if device not in first.devices:
            raise UnknownDeviceError(device, first.devices)
        time.sleep(interval)
        second = sampler.snapshot()
    finally:
        sampler.close()
    cur = second.devices.get(device)
    if cur is None:
        raise UnknownDeviceError(device, second.devices)
    rates = device_rates(first.devices[device], cur, interval_cs(first, second))
    return {
        "timestamp": datetime.now().isoformat(timespec="seconds"),
        "device": device,
        "tps": rates.tps,
        "read_MBps": rates.rMB_s,
        "write_MBps": rates.wMB_s,
        "await_ms": rates.await_ms,
        "util_percent": rates.util,
    }
