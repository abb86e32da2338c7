"""``iolens doctor``: what iolens can measure on this machine, and why not where it cannot."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass

from iolens._errors import StatsUnavailableError
from iolens.sources.disk import DiskSampler

_EPILOG = """\
Each line is one capability: ok, or missing with the reason and what would
give it. Lines marked [needs ...] name the privilege that feature takes
(root, or a capability such as CAP_SYS_PTRACE); recording your own jobs
takes none. Nothing here changes the machine.

exit codes: 0 the core works (device statistics and /proc readable), 1 it does not
"""


@dataclass
class Check:
    """One capability and whether it is there."""

    name: str
    ok: bool
    detail: str
    needed_for: str
    core: bool = False
    """Without it iolens cannot do its main job (the exit code says so)."""
    privilege: str = ""
    """The privilege the feature takes beyond an ordinary user ("" for none)."""


def _module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _disk_stats(proc_root: str, sys_root: str) -> Check:
    sampler = DiskSampler(proc_root, sys_root)
    try:
        snap = sampler.snapshot()
    except StatsUnavailableError as exc:
        return Check("device statistics", False, str(exc), "every disk figure", core=True)
    finally:
        sampler.close()
    return Check("device statistics", True,
                 f"{len(snap.devices)} devices from {sampler.source}", "every disk figure",
                 core=True)


def _proc(proc_root: str) -> Check:
    path = os.path.join(proc_root, str(os.getpid()), "io")
    try:
        with open(path) as fh:
            fh.read()
    except OSError as exc:
        return Check("process I/O", False, f"{path}: {exc.strerror or exc}",
                     "the job's own reads and page-cache hits", core=True)
    return Check("process I/O", True, f"{proc_root}/<pid>/io readable",
                 "the job's own reads and page-cache hits", core=True)


# Capability numbers (linux/capability.h).
CAP_NET_BIND_SERVICE = 10
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21


def effective_caps(proc_root: str = "/proc") -> int:
    """This process's effective capability set (CapEff of /proc/<pid>/status); 0 if unknown."""
    try:
        with open(os.path.join(proc_root, str(os.getpid()), "status")) as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _who(proc_root: str) -> tuple[bool, int, str]:
    """(root?, effective capabilities, "running as ...")."""
    root = os.geteuid() == 0
    caps = effective_caps(proc_root)
    return root, caps, "running as root" if root else f"running as uid {os.geteuid()}"


def _has(caps: int, cap: int) -> bool:
    return bool(caps >> cap & 1)


def _own_jobs(proc_root: str) -> Check:
    _, _, who = _who(proc_root)
    return Check("recording your own jobs", True,
                 f"{who}: an ordinary user suffices (no root, no capability)",
                 "iolens run, iolens.monitor(), the exporter and top on your own processes, "
                 "the reports")


def _hidepid(proc_root: str) -> str:
    try:
        with open(os.path.join(proc_root, "self", "mountinfo")) as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and fields[4] == proc_root and "hidepid=" in line:
                    return f"; {proc_root} is mounted with hidepid: others' processes are hidden"
    except OSError:
        pass
    return ""


def _others(proc_root: str) -> Check:
    root, caps, who = _who(proc_root)
    ok = root or _has(caps, CAP_SYS_PTRACE)
    detail = (f"{who}" if root else
              f"{who} with CAP_SYS_PTRACE" if ok else
              f"{who} without CAP_SYS_PTRACE: other users' {proc_root}/<pid>/io and fd cannot "
              "be read, so their I/O is missed")
    return Check("other users' processes", ok, detail + _hidepid(proc_root),
                 "the I/O of processes of other users (iolens top, exporter --pid, the "
                 "noisy-neighbor finding's evidence)", privilege="root or CAP_SYS_PTRACE")


def _drop_caches(proc_root: str) -> Check:
    path = os.path.join(proc_root, "sys", "vm", "drop_caches")
    ok = os.access(path, os.W_OK)
    _, _, who = _who(proc_root)
    return Check("dropping the page cache", ok,
                 f"{who}: {path} is writable" if ok else f"{who}: {path} is not writable",
                 "cold-cache measurements: iolens probe --drop-caches, make demo-slow, the "
                 "lab tests (iolens probe --evict needs no privilege)", privilege="root")


def _lab(proc_root: str) -> Check:
    root, caps, who = _who(proc_root)
    ok = root or _has(caps, CAP_SYS_ADMIN)
    return Check("slow-disk lab", ok,
                 who if ok else f"{who}: cannot attach loop devices, mount or set blkio "
                 "throttles", "make demo-slow, the lab tests (loop device, mount, cgroup "
                 "blkio throttle)", privilege="root (CAP_SYS_ADMIN)")


def _low_port(proc_root: str) -> Check:
    root, caps, who = _who(proc_root)
    start = 1024
    try:
        with open(os.path.join(proc_root, "sys", "net", "ipv4", "ip_unprivileged_port_start")
                  ) as fh:
            start = int(fh.read().strip())
    except (OSError, ValueError):
        pass
    ok = root or _has(caps, CAP_NET_BIND_SERVICE) or start == 0
    return Check("ports below 1024", ok,
                 who if root else f"{who}; unprivileged ports start at {start}",
                 "--listen / --prometheus on a port under "
                 f"{start} (the default 9478 needs nothing)",
                 privilege="root or CAP_NET_BIND_SERVICE")


def _loop() -> Check:
    ok = os.path.exists("/dev/loop-control") and shutil.which("losetup") is not None
    return Check("loop devices", ok,
                 "/dev/loop-control and losetup present" if ok
                 else "no /dev/loop-control or no losetup", "make demo-slow, the lab tests",
                 privilege="root to attach one")


def _blkio() -> Check:
    from iolens.demo.slowdisk import find_blkio_root  # noqa: PLC0415 - only here

    root = find_blkio_root()
    return Check("cgroup v1 blkio", root is not None,
                 f"mounted at {root}" if root else "not mounted (cgroup v2 alone has no "
                 "blkio.throttle files)", "make demo-slow, the lab tests",
                 privilege="root to set a throttle")


def _nvml() -> Check:
    from iolens.sources.gpu import GpuReader  # noqa: PLC0415

    g = GpuReader()
    try:
        if g.available and g.names:
            return Check("GPUs (NVML)", True, ", ".join(g.names), "GPU utilization and memory")
        return Check("GPUs (NVML)", False, g.reason or "NVML found no GPU",
                     "GPU utilization and memory")
    finally:
        g.close()


def _package(name: str, module: str, extra: str, needed_for: str) -> Callable[[], Check]:
    def check() -> Check:
        if _module(module):
            return Check(name, True, f"{module} importable", needed_for)
        return Check(name, False, f"pip install 'iolens[{extra}]'", needed_for)
    return check


def _iostat() -> Check:
    path = shutil.which("iostat")
    return Check("sysstat iostat", path is not None, path or "not installed (apt install "
                 "sysstat)", "the test suite's oracle only")


def _pidfd() -> Check:
    try:
        fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError) as exc:
        return Check("pidfd", False, f"{exc}", "waiting for the job without polling")
    os.close(fd)
    return Check("pidfd", True, "available", "waiting for the job without polling")


def checks(proc_root: str = "/proc", sys_root: str = "/sys") -> list[Check]:
    """Every capability, core ones first."""
    makers: list[Callable[[], Check]] = [
        lambda: _disk_stats(proc_root, sys_root), lambda: _proc(proc_root), _pidfd,
        lambda: _own_jobs(proc_root), lambda: _others(proc_root),
        lambda: _drop_caches(proc_root), lambda: _lab(proc_root), lambda: _low_port(proc_root),
        _loop, _blkio, _nvml,
        _package("PyTorch", "torch", "demo", "timing DataLoaders (the job's own PyTorch)"),
        _package("HTML report", "plotly", "html", "iolens report --format html"),
        _package("Prometheus", "prometheus_client", "prometheus", "--prometheus, exporter"),
        _package("TensorBoard", "tensorboard", "tensorboard", "--tensorboard"),
        _package("MLflow", "mlflow", "mlflow", "--mlflow"),
        _package("W&B", "wandb", "wandb", "--wandb"),
        _package("packing", "lmdb", "pack", "iolens pack, iolens.data's datasets"),
        _iostat,
    ]
    out = []
    for make in makers:
        try:
            out.append(make())
        except Exception as exc:  # noqa: BLE001 - a failing check is itself the finding
            out.append(Check(getattr(make, "__name__", "check"), False, repr(exc), "-"))
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iolens doctor``."""
    p = argparse.ArgumentParser(
        prog="iolens doctor", usage="iolens doctor [--format text|json]",
        description="What iolens can measure on this machine, and why not where it cannot.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    p.add_argument("--sys-root", default="/sys", help=argparse.SUPPRESS)
    return p


def run(ns: argparse.Namespace) -> int:
    """Print the checks; 0 when the core works, 1 when it does not."""
    found = checks(ns.proc_root, ns.sys_root)
    if ns.format == "json":
        print(json.dumps([c.__dict__ for c in found], indent=2))
    else:
        width = max(len(c.name) for c in found)
        for c in found:
            mark = "ok     " if c.ok else "missing"
            needs = f"  [needs {c.privilege}]" if c.privilege else ""
            print(f"{mark}  {c.name:<{width}}  {c.detail}  (for: {c.needed_for}){needs}")
    return 0 if all(c.ok for c in found if c.core) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(build_parser().parse_args()))
