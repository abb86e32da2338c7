"""iolens: find out why a PyTorch training job waits for its data.

``import iolens`` loads the standard library only; optional features import
their packages when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from iolens._errors import IolensError, StatsUnavailableError, UnknownDeviceError
from iolens._version import __version__

if TYPE_CHECKING:
    from iolens._seed import get_disk_usage
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

_LAZY = {
    "get_disk_usage": "iolens._seed",
    "DiskLogger": "iolens.api", "InstrumentedLoader": "iolens.api", "Monitor": "iolens.api",
    "instrument": "iolens.api", "log_disk_usage": "iolens.api", "monitor": "iolens.api",
    "step": "iolens.api",
    "DeviceRates": "iolens.core.rates", "device_rates": "iolens.core.rates",
    "snapshot_rates": "iolens.core.rates",
    "DiskCounters": "iolens.sources.counters", "DiskSnapshot": "iolens.sources.counters",
    "DeviceMapping": "iolens.sources.devmap", "device_for_path": "iolens.sources.devmap",
    "DiskSampler": "iolens.sources.disk", "read_snapshot_dir": "iolens.sources.disk",
}
"""The public names of the API and the module each lives in: imported on first use, so
that the ``iolens`` command (whose subcommands import only what they need) does not load
the recorder to write a report."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'iolens' has no attribute {name!r}")
    import importlib  # noqa: PLC0415

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
