"""iolens: find out why a PyTorch training job waits for its data.

``import iolens`` loads the standard library only; optional features import
their packages when used.
"""

from __future__ import annotations

from iolens._errors import IolensError, StatsUnavailableError, UnknownDeviceError
from iolens._seed import get_disk_usage
from iolens._version import __version__
from iolens.api import (
    DiskLogger,
    InstrumentedLoader,
    Monitor,
    instrument,
    log_disk_usage,
    monitor,
    step,
)
from iolens.core.rates import DeviceRates, device_rates, snapshot_rates
from iolens.sources.counters import DiskCounters, DiskSnapshot
from iolens.sources.devmap import DeviceMapping, device_for_path
from iolens.sources.disk import DiskSampler, read_snapshot_dir

__all__ = [
    "DeviceMapping",
    "DeviceRates",
    "DiskCounters",
    "DiskLogger",
    "DiskSampler",
    "DiskSnapshot",
    "InstrumentedLoader",
    "IolensError",
    "Monitor",
    "StatsUnavailableError",
    "UnknownDeviceError",
    "__version__",
    "device_for_path",
    "device_rates",
    "get_disk_usage",
    "instrument",
    "log_disk_usage",
    "monitor",
    "read_snapshot_dir",
    "snapshot_rates",
    "step",
]
