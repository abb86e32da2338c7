"""Per-process and system counters: /proc/<pid>/stat and io, /proc/stat, /proc/meminfo.

Parsers are pure; :class:`ProcessTable` walks a process tree under a proc
root. A process may exit between any two reads: readers then return
``None`` and the caller moves on.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass

from iolens._errors import StatsUnavailableError
from iolens.sources._files import PreadFile, read_text

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie does, and so does another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(slots=True)
class ProcStat:
    """The fields of /proc/<pid>/stat that iolens uses."""

    pid: int
    comm: str
    """Process name (at most 15 characters; PyTorch names DataLoader workers pt_data_worker)."""
    state: str
    """R running, S sleeping, D waiting for I/O (uninterruptible), Z zombie, ..."""
    ppid: int
    utime_ticks: int
    """User CPU time in clock ticks (CLK_TCK per second)."""
    stime_ticks: int
    """System CPU time in clock ticks."""
    children_ticks: int = 0
    """cutime + cstime: CPU of the children this process has reaped (waited for)."""


def parse_proc_stat(text: str) -> ProcStat | None:
    """Parse /proc/<pid>/stat; ``None`` if it does not have the expected shape.

    The name is in parentheses and may itself hold spaces and parentheses,
    so the fields are split after the *last* closing parenthesis.
    """
    head, sep, tail = text.rpartition(")")
    if not sep:
        return None
    pid_s, _, comm = head.partition(" (")
    fields = tail.split()
    try:
        st = ProcStat(
            pid=int(pid_s),
            comm=comm,
            state=fields[0],
            ppid=int(fields[1]),
            utime_ticks=int(fields[11]),
            stime_ticks=int(fields[12]),
            children_ticks=int(fields[13]) + int(fields[14]),
        )
    except (IndexError, ValueError):
        return None
    # The kernel prints none of these below zero; a negative one is not a stat file
    # and would make a negative CPU rate.
    if min(st.pid, st.ppid, st.utime_ticks, st.stime_ticks, int(fields[13]),
           int(fields[14])) < 0:
        return None
    return st


@dataclass(slots=True)
class ProcIO:
    """/proc/<pid>/io: bytes through syscalls and bytes the block layer moved."""

    rchar: int = 0
    """Bytes read through read-like syscalls, page-cache hits and pipes included."""
    wchar: int = 0
    """Bytes written through write-like syscalls."""
    read_bytes: int = 0
    """Bytes this process made the block layer fetch."""
    write_bytes: int = 0
    """Bytes this process dirtied for writeback."""
    cancelled_write_bytes: int = 0
    """Dirtied bytes that were never written (truncated before writeback)."""

    def __add__(self, other: ProcIO) -> ProcIO:
        return ProcIO(self.rchar + other.rchar, self.wchar + other.wchar,
                      self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes,
                      self.cancelled_write_bytes + other.cancelled_write_bytes)

    def __sub__(self, other: ProcIO) -> ProcIO:
        return ProcIO(self.rchar - other.rchar, self.wchar - other.wchar,
                      self.read_bytes - other.read_bytes, self.write_bytes - other.write_bytes,
                      self.cancelled_write_bytes - other.cancelled_write_bytes)


_IO_KEYS = {"rchar", "wchar", "read_bytes", "write_bytes", "cancelled_write_bytes"}


def parse_proc_io(text: str) -> ProcIO | None:
    """Parse /proc/<pid>/io; ``None`` if none of its keys is there with a count.

    A known key whose value is not a non-negative integer is left out (read as 0).
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in _IO_KEYS:
            try:
                n = int(value)
            except ValueError:
                continue
            if n >= 0:  # the kernel's counters are unsigned
                values[key] = n
    return ProcIO(**values) if values else None


@dataclass(slots=True)
class CpuTimes:
    """The aggregate ``cpu`` line of /proc/stat, in clock ticks."""

    user: int = 0
    nice: int = 0
    system: int = 0
    idle: int = 0
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0

    @property
    def total(self) -> int:
        """All ticks (guest time is already inside user and nice)."""
        return (self.user + self.nice + self.system + self.idle + self.iowait + self.irq
                + self.softirq + self.steal)


def parse_cpu_times(text: str) -> CpuTimes | None:
    """The first ``cpu`` line of /proc/stat; older kernels' shorter lines fill with zeros.

    ``None`` when that line holds a value that is not a non-negative integer.
    """
    for line in text.splitlines():
        if line.startswith("cpu "):
            parts = line.split()[1:9]
            try:
                nums = [int(p) for p in parts]
            except ValueError:
                return None
            if nums and min(nums) < 0:
                return None
            nums.extend([0] * (8 - len(nums)))
            return CpuTimes(*nums)
    return None


def cpu_percentages(prev: CpuTimes, cur: CpuTimes) -> dict[str, float]:
    """Share of all CPUs' time per state over the interval, in percent (as top and vmstat)."""
    total = cur.total - prev.total
    if total <= 0:
        return {k: 0.0 for k in ("user", "system", "iowait", "idle", "steal")}

    def pct(a: int, b: int) -> float:
        # Clamped: the aggregate line loses an offlined CPU's ticks (hot-unplug), so a
        # state's counter may go back, or forward by more than the total did.
        return min(100.0, max(0.0, (a - b) / total * 100))

    return {
        "user": pct(cur.user + cur.nice, prev.user + prev.nice),
        "system": pct(cur.system + cur.irq + cur.softirq, prev.system + prev.irq + prev.softirq),
        "iowait": pct(cur.iowait, prev.iowait),
        "idle": pct(cur.idle, prev.idle),
        "steal": pct(cur.steal, prev.steal),
    }


_MEMINFO_KEYS = ("MemTotal", "MemAvailable", "Cached", "Buffers", "Dirty", "Writeback")


def parse_meminfo(text: str) -> dict[str, int]:
    """Page cache and writeback figures of /proc/meminfo, in bytes (the file says kB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _MEMINFO_KEYS:
            parts = rest.split()
            # isascii too: isdigit() accepts digits such as "²" that int() refuses.
            if parts and parts[0].isascii() and parts[0].isdigit():
                out[key] = int(parts[0]) * 1024
    return out


class SystemReader:
    """CPU times and memory of the whole machine, files kept open."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._stat = PreadFile(os.path.join(proc_root, "stat"))
        self._meminfo = PreadFile(os.path.join(proc_root, "meminfo"))

    def cpu(self) -> CpuTimes | None:
        """Current CPU times, or None when /proc/stat cannot be read."""
        try:
            return parse_cpu_times(self._stat.read())
        except StatsUnavailableError:
            return None

    def memory(self) -> dict[str, int]:
        """Current memory figures in bytes ({} when /proc/meminfo cannot be read)."""
        try:
            return parse_meminfo(self._meminfo.read())
        except StatsUnavailableError:
            return {}

    def close(self) -> None:
        """Close the files."""
        self._stat.close()
        self._meminfo.close()


_SYSCALLS_X86_64 = {0: "read", 1: "write", 7: "poll", 23: "select", 35: "nanosleep",
                    61: "wait4", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
                    270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 45: "recvfrom",
                    47: "recvmsg", 17: "pread64", 19: "readv", 295: "preadv", 2: "open",
                    257: "openat", 43: "accept", 288: "accept4", 42: "connect"}
"""The syscalls a blocked process usually sits in, by their x86_64 number (other machines
and other numbers are given as numbers)."""


def parse_wait(wchan: str, syscall: str, machine: str) -> dict[str, str]:
    """Where a process waits, from /proc/PID/wchan (the kernel function it sleeps in; "0"
    when running or hidden) and /proc/PID/syscall (its syscall's number, ``running``, or
    nothing where it may not be read): ``{"wchan", "syscall"}``, each left out when
    unknown (pure)."""
    out: dict[str, str] = {}
    w = wchan.strip()
    if w and w != "0":
        out["wchan"] = w
    first = syscall.split(None, 1)[0] if syscall.strip() else ""
    if first.lstrip("-").isdigit():
        n = int(first)
        name = _SYSCALLS_X86_64.get(n) if machine == "x86_64" else None
        out["syscall"] = name or str(n)
    elif first == "running":
        out["syscall"] = "running"
    return out


def read_wait(pid: int, proc_root: str = "/proc") -> dict[str, str]:
    """:func:`parse_wait` of process ``pid``; empty when neither file can be read."""
    texts = []
    for name in ("wchan", "syscall"):
        try:
            with open(os.path.join(proc_root, str(pid), name)) as fh:
                texts.append(fh.read(512))
        except OSError:
            texts.append("")
    return parse_wait(texts[0], texts[1], os.uname().machine)


def parse_run_delay(text: str) -> int | None:
    """The run-queue wait in /proc/<pid>/schedstat's text ("cpu_ns run_delay_ns slices"),
    in nanoseconds; None where the text holds no such figure (pure)."""
    parts = text.split()
    if len(parts) < 2 or not parts[1].isascii() or not parts[1].isdigit():
        return None
    return int(parts[1])


@dataclass(slots=True)
class ProcSample:
    """One process at one moment."""

    stat: ProcStat
    io: ProcIO | None
    """None when /proc/<pid>/io is not readable (another user's process without root)."""
    run_delay_ns: int | None = None
    """Nanoseconds its main thread has waited on a run queue, runnable but not running
    (/proc/<pid>/schedstat); None where the kernel does not keep it."""


class ProcessTable:
    """Finds a process and all its descendants and reads their counters.

    NOTE [parent cache]: finding descendants needs every process's parent,
    and reading every /proc/<pid>/stat at each sample was 95% of a sample's
    cost (2.1 ms with 67 processes). Parents are kept between samples, keyed
    by pid and the inode of /proc/<pid> (a new process under a reused pid
    gets a new inode), so only new processes and the job's own are read. A
    process outside the job that a subreaper inside it adopts is missed until
    its /proc entry changes; the job's own processes are read afresh anyway.
    """

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._parents: dict[int, tuple[int, int]] = {}
        """pid -> (inode of /proc/<pid>, parent pid), from the last sample."""

    def read_stat(self, pid: int) -> ProcStat | None:
        """/proc/<pid>/stat, or None if the process is gone."""
        try:
            return parse_proc_stat(read_text(os.path.join(self.proc_root, str(pid), "stat")))
        except StatsUnavailableError:
            return None

    def read_io(self, pid: int) -> ProcIO | None:
        """/proc/<pid>/io, or None if gone or not permitted."""
        try:
            return parse_proc_io(read_text(os.path.join(self.proc_root, str(pid), "io")))
        except StatsUnavailableError:
            return None

    def read_run_delay(self, pid: int) -> int | None:
        """:func:`parse_run_delay` of /proc/<pid>/schedstat, or None if gone or not kept."""
        try:
            with open(os.path.join(self.proc_root, str(pid), "schedstat")) as fh:
                return parse_run_delay(fh.read(256))
        except OSError:
            return None

    def descendants(self, root: int, prune: Collection[int] = ()) -> list[ProcStat]:
        """``root`` and every process below it, each with a fresh stat (root first),
        less the processes in ``prune`` and everything below them."""
        try:
            entries = list(os.scandir(self.proc_root))
        except OSError:
            return []
        fresh: dict[int, ProcStat] = {}
        children: dict[int, list[int]] = {}
        parents: dict[int, tuple[int, int]] = {}
        for entry in entries:
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                ino = entry.inode()
            except OSError:
                continue
            known = self._parents.get(pid)
            if known is not None and known[0] == ino:
                ppid = known[1]
            else:
                st = self.read_stat(pid)
                if st is None:
                    continue
                fresh[pid] = st
                ppid = st.ppid
            parents[pid] = (ino, ppid)
            children.setdefault(ppid, []).append(pid)
        self._parents = parents
        if root not in parents:
            return []
        out: list[ProcStat] = []
        todo = [root]
        while todo:
            pid = todo.pop()
            if pid in prune:
                continue
            st = fresh.get(pid) or self.read_stat(pid)
            if st is None:
                continue
            if st.ppid != parents[pid][1]:
                parents[pid] = (parents[pid][0], st.ppid)
            out.append(st)
            todo.extend(children.get(pid, ()))
        return out

    def sample(self, root: int, prune: Collection[int] = ()) -> dict[int, ProcSample]:
        """Stat, io and run-queue wait of the whole tree under ``root`` (less ``prune``'s
        subtrees), by pid."""
        return {st.pid: ProcSample(st, self.read_io(st.pid), self.read_run_delay(st.pid))
                for st in self.descendants(root, prune)}

    def thread_children(self, pid: int) -> list[int]:
        """The children that threads of ``pid`` other than its main thread started (the
        kernel's ``task/<tid>/children``; empty where it has none). NOTE [the recorder's
        own children] in iolens/recorder/sampler.py."""
        task = os.path.join(self.proc_root, str(pid), "task")
        try:
            tids = [t for t in os.listdir(task) if t.isdigit() and int(t) != pid]
        except OSError:
            return []
        out: list[int] = []
        for tid in tids:
            try:
                out += [int(c) for c in read_text(os.path.join(task, tid, "children")).split()]
            except (StatsUnavailableError, ValueError):
                continue
        return out
