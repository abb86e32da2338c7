"""Argument checks that several commands share."""

from __future__ import annotations

import argparse

from iolens.core.rates import MAX_INTERVAL_S, MIN_INTERVAL_S
from iolens.sources.disk import DiskSampler

INTERVAL_RANGE = f"{MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g}"
"""For --interval's help text."""


def check_interval(p: argparse.ArgumentParser, interval: float) -> None:
    """A usage error (exit 2) unless ``interval`` is a sampling interval iolens takes."""
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        p.error(f"--interval must be between {MIN_INTERVAL_S:g} and {MAX_INTERVAL_S:g} "
                f"seconds, not {interval:g}")


def check_watch(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """``--path`` must name something and each ``--device`` must be a device the kernel
    reports (unchecked where no disk statistics can be read); else a usage error."""
    for path in ns.path:
        if not path:
            p.error("--path needs a path")
    if not ns.device:
        return
    sampler = DiskSampler(ns.proc_root, ns.sys_root)
    try:
        known = sampler.snapshot().devices
    except Exception:  # noqa: BLE001 - no disk statistics: --device cannot be checked
        known = {}
    finally:
        sampler.close()
    for d in ns.device:
        if known and d not in known:
            p.error(f"unknown device {d!r}; devices reported by the kernel: "
                    f"{', '.join(sorted(known))}")
