"""A real, slow FUSE mount for tests: a folder served over loopback WebDAV, mounted by rclone.

``rclone serve webdav`` serves the folder on a free 127.0.0.1 port and
``rclone mount`` mounts it with ``--tpslimit``: each HTTP request (one GET
per file opened) waits for a token, so reads are as slow as an object store
that throttles requests. Both run as children of the test, never daemons.

NOTE [fuse lab cleanup]: the mount is undone however the block ends:
``fusermount3 -u`` (lazily, ``-uz``, when something still holds it), then
SIGTERM and, after a bounded wait, SIGKILL to the mount and then the server.
fusectl is mounted on /sys/fs/fuse/connections when it is not already (its
folders are what the tests read) and unmounted again if the lab mounted it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from iolens.sources.devmap import read_mountinfo

FUSECTL = "/sys/fs/fuse/connections"
_START_TIMEOUT_S = 20.0
_STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class FuseLab:
    """A running slow FUSE mount."""

    mount_point: str
    """Where the folder is mounted (fstype ``fuse.rclone``)."""
    server_pid: int
    """The ``rclone serve webdav`` process."""
    mount_pid: int
    """The ``rclone mount`` process: the FUSE daemon."""
    port: int
    """The loopback port the WebDAV server listens on."""


def fuse_lab_skip_reason() -> str | None:
    """Why a slow FUSE mount cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to mount FUSE and fusectl"
    if shutil.which("rclone") is None:
        return "rclone is not installed (apt-get install rclone)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (the kernel has no FUSE, or the container does not expose it)"
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        return "/proc/filesystems cannot be read"
    names = {line.split()[-1] for line in filesystems.splitlines() if line.strip()}
    if "fuse" not in names:
        return "the kernel has no fuse filesystem"
    if "fusectl" not in names:
        return "the kernel has no fusectl filesystem (/sys/fs/fuse/connections)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _log_tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "(no log)"
    return text[-2000:] or "(empty)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(_STOP_TIMEOUT_S)


def _fusectl_mounted() -> bool:
    return any(m.mount_point == FUSECTL and m.fstype == "fusectl"
               for m in read_mountinfo() or [])


def _is_mounted(mount_point: str) -> bool:
    return any(m.mount_point == mount_point and m.fstype == "fuse.rclone"
               for m in read_mountinfo() or [])


def _unmount(mount_point: str) -> None:
    if not _is_mounted(mount_point):
        return
    done = subprocess.run(["fusermount3", "-u", mount_point], capture_output=True,
                          check=False, timeout=30)
    if done.returncode != 0 and _is_mounted(mount_point):
        subprocess.run(["fusermount3", "-uz", mount_point], capture_output=True,
                       check=False, timeout=30)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rclone serve webdav exited ({proc.returncode}) before "
                               f"listening on 127.0.0.1:{port}: {_log_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"rclone serve webdav did not listen on 127.0.0.1:{port} within "
                       f"{_START_TIMEOUT_S:.0f} s: {_log_tail(log)}")


def _wait_mounted(mount_point: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if _is_mounted(mount_point):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"rclone mount exited ({proc.returncode}) before {mount_point} "
                               f"appeared in /proc/self/mountinfo: {_log_tail(log)}")
        time.sleep(0.05)
    raise RuntimeError(f"{mount_point} did not appear in /proc/self/mountinfo as fuse.rclone "
                       f"within {_START_TIMEOUT_S:.0f} s: {_log_tail(log)}")


def _start_server(data_dir: str, env: dict[str, str],
                  log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    attempts = 3  # the free port may be taken by another program before rclone binds it
    for attempt in range(attempts):
        port = _free_port()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                ["rclone", "serve", "webdav", data_dir, "--addr", f"127.0.0.1:{port}",
                 "--read-only", "--log-level", "ERROR"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_listening(port, proc, log_path)
        except BaseException as exc:
            _stop(proc)
            if attempt == attempts - 1 or not isinstance(exc, RuntimeError):
                raise
            continue
        return proc, port
    raise AssertionError("unreachable")


@contextlib.contextmanager
def slow_fuse(data_dir: str, tps: float, *, tmp: Path) -> Iterator[FuseLab]:
    """``data_dir`` mounted read-only through rclone at ``tps`` HTTP requests per second.

    ``tmp`` holds the mount point, rclone's (empty) config and cache, and the
    two logs quoted in errors. Raises RuntimeError when the lab cannot run
    here or the mount never appears; cleans up in every case (see NOTE
    [fuse lab cleanup]).
    """
    if tps <= 0:
        raise ValueError(f"tps must be positive (got {tps}): it is rclone's --tpslimit")
    reason = fuse_lab_skip_reason()
    if reason is not None:
        raise RuntimeError(f"cannot make a FUSE lab here: {reason}")
    if not os.path.isdir(data_dir):
        raise ValueError(f"{data_dir} is not a folder")
    mnt = tmp / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    mount_point = os.path.realpath(mnt)
    config = tmp / "rclone.conf"
    config.touch()
    env = {**os.environ, "RCLONE_CONFIG": str(config),
           "RCLONE_CACHE_DIR": str(tmp / "rclone-cache")}
    server_log, mount_log = tmp / "serve.log", tmp / "mount.log"
    server: subprocess.Popen[bytes] | None = None
    mount: subprocess.Popen[bytes] | None = None
    mounted_fusectl = False
    try:
        if not _fusectl_mounted():
            subprocess.run(["mount", "-t", "fusectl", "fusectl", FUSECTL], check=True,
                           capture_output=True, timeout=30)
            mounted_fusectl = True
        server, port = _start_server(data_dir, env, server_log)
        with mount_log.open("wb") as log:
            mount = subprocess.Popen(
                ["rclone", "mount", f":webdav,url='http://127.0.0.1:{port}':", mount_point,
                 "--vfs-cache-mode", "off", "--tpslimit", str(tps), "--read-only",
                 # The listing is fetched once; after that only the GETs of opened files
                 # spend tokens, so the read time is files / tps.
                 "--dir-cache-time", "1h", "--poll-interval", "0",
                 "--no-modtime", "--no-checksum", "--log-level", "ERROR"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        _wait_mounted(mount_point, mount, mount_log)
        yield FuseLab(mount_point, server.pid, mount.pid, port)
    finally:
        try:
            _unmount(mount_point)
        finally:
            if mount is not None:
                _stop(mount)
            if server is not None:
                _stop(server)
            if mounted_fusectl:
                subprocess.run(["umount", FUSECTL], capture_output=True, check=False,
                               timeout=30)
