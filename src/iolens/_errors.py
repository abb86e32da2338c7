"""The exceptions iolens raises. Library code raises; only the CLI turns them into exit codes."""

from __future__ import annotations

from collections.abc import Iterable


class IolensError(Exception):
    """Base class of every error iolens raises on purpose."""


class StatsUnavailableError(IolensError):
    """A kernel statistics file cannot be read at all (missing or not permitted).

    Seen in gVisor, AWS Fargate and locked-down containers, which hide
    ``/proc/diskstats``. ``path`` is the file, ``reason`` the OS error text.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot read {path} ({reason})")


class UnknownDeviceError(IolensError, LookupError):
    """A device was named that the kernel does not report."""

    def __init__(self, device: str, available: Iterable[str]) -> None:
        self.device = device
        self.available = sorted(available)
        listing = ", ".join(self.available) if self.available else "none"
        super().__init__(f"unknown device {device!r}; devices reported by the kernel: {listing}")
