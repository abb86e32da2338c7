"""Argument checks that several commands share."""

from __future__ import annotations

import argparse

from iolens.sources.disk import DiskSampler


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
