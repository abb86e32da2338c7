"""Per-process and system parsers on fixture text, and the process tree on this machine."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iolens.sources.procfs import (
    CpuTimes,
    ProcessTable,
    cpu_percentages,
    parse_cpu_times,
    parse_meminfo,
    parse_proc_io,
    parse_proc_stat,
)

STAT = ("4242 (pt (data) worker) S 4200 4242 4200 0 -1 4194560 2117 0 0 0 "
        "153 27 0 0 20 0 1 0 12345 103088128 3100 18446744073709551615 1 1 0 0 0 0 0 "
        "16781312 16386 0 0 0 17 1 0 0 9 0 0")


def test_stat_name_with_spaces_and_parentheses() -> None:
    st = parse_proc_stat(STAT)
    assert st is not None
    assert (st.pid, st.comm, st.state, st.ppid) == (4242, "pt (data) worker", "S", 4200)
    assert (st.utime_ticks, st.stime_ticks) == (153, 27)
    assert parse_proc_stat("garbage") is None
    assert parse_proc_stat("1 (x) S") is None


def test_io_keys() -> None:
    io = parse_proc_io("rchar: 100\nwchar: 20\nsyscr: 3\nread_bytes: 40\nwrite_bytes: 8\n"
                       "cancelled_write_bytes: 4\nbogus: x\n")
    assert io is not None
    assert (io.rchar, io.wchar, io.read_bytes, io.write_bytes, io.cancelled_write_bytes) == (
        100, 20, 40, 8, 4)
    assert (io - io).rchar == 0 and (io + io).read_bytes == 80
    assert parse_proc_io("") is None


def test_cpu_line_and_percentages() -> None:
    a = parse_cpu_times("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    b = parse_cpu_times("cpu  160 0 70 900 70 0 0 0 0 0\n")
    assert a == CpuTimes(100, 0, 50, 800, 50)
    assert b is not None and a is not None
    pct = cpu_percentages(a, b)
    assert pct == {"user": 30.0, "system": 10.0, "iowait": 10.0, "idle": 50.0, "steal": 0.0}
    assert parse_cpu_times("cpu  1 2 3\n") == CpuTimes(1, 2, 3)  # an old kernel's short line
    assert parse_cpu_times("intr 5\n") is None
    assert cpu_percentages(a, a)["idle"] == 0.0


def test_meminfo_in_bytes() -> None:
    m = parse_meminfo("MemTotal:  100 kB\nCached:   2 kB\nDirty: 1 kB\nWriteback: x kB\n")
    assert m == {"MemTotal": 102400, "Cached": 2048, "Dirty": 1024}


@contextlib.contextmanager
def parent_and_child() -> Iterator[tuple[int, int]]:
    """A real process with a child of its own, for 5 s: their pids."""
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(5)']); print(p.pid, flush=True); time.sleep(5)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        yield parent.pid, int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()


def test_descendants_of_a_real_process_tree() -> None:
    with parent_and_child() as (parent, child):
        table = ProcessTable()
        tree = table.descendants(parent)
        assert [p.pid for p in tree][:1] == [parent]
        assert child in {p.pid for p in tree}
        sample = table.sample(parent)
        assert sample[child].io is not None and sample[child].stat.ppid == parent
        assert table.descendants(os.getpid() + 10_000_000) == []


def test_a_pruned_process_and_its_subtree_are_left_out() -> None:
    with parent_and_child() as (parent, child):
        table = ProcessTable()
        assert {p.pid for p in table.descendants(os.getpid())} >= {parent, child}
        pruned = {p.pid for p in table.descendants(os.getpid(), {parent})}
        assert os.getpid() in pruned and not pruned & {parent, child}
        assert child not in table.sample(os.getpid(), [parent])


def test_thread_children_are_those_other_threads_started() -> None:
    """The recorder's own children (NOTE [the recorder's own children]): a process a helper
    thread started is listed, one the main thread started is not."""
    if not os.path.exists(f"/proc/self/task/{os.getpid()}/children"):
        pytest.skip("this kernel has no /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN)")
    assert threading.current_thread() is threading.main_thread()
    mine = subprocess.Popen(["sleep", "30"])
    started: list[subprocess.Popen[bytes]] = []
    looked = threading.Event()

    def start_one() -> None:
        started.append(subprocess.Popen(["sleep", "30"]))
        looked.wait(30)  # a thread that ends hands its children to the main thread

    helper = threading.Thread(target=start_one)
    try:
        helper.start()
        while not started and helper.is_alive():
            time.sleep(0.01)
        table = ProcessTable()
        assert table.thread_children(os.getpid()) == [started[0].pid]
        assert ProcessTable("/nonexistent").thread_children(os.getpid()) == []
    finally:
        looked.set()
        helper.join()
        for proc in [mine, *started]:
            proc.kill()
            proc.wait()

REAPED = """
import os, sys, time
time.sleep(0.6)
pid = os.fork()
if pid == 0:
    with open(sys.argv[1], "wb") as fh:
        fh.write(os.urandom(8 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    end = time.process_time() + 0.5
    while time.process_time() < end:  # CPU after the write, some of it after the last look
        pass
    os._exit(0)
os.waitpid(pid, 0)  # the kernel adds the child's I/O and CPU to this process
time.sleep(0.8)
"""


def test_a_reaped_childs_io_is_counted_once(tmp_path: Path) -> None:
    from iolens.recorder.sampler import Recorder

    proc = subprocess.Popen([sys.executable, "-c", REAPED, str(tmp_path / "out.bin")])
    rec = Recorder(None, proc.pid, 0.1, {}, discover=False)
    written = cpu_s = 0.0
    while True:
        done = proc.poll() is not None
        time.sleep(0.1)
        r = rec.sample()
        written += r["job"]["write_bytes_s"] * r["interval_s"]
        cpu_s += r["job"]["cpu_pct"] / 100 * r["interval_s"]
        if done:
            break
    rec.close()
    assert 7.9 * 2**20 <= written <= 8.6 * 2**20  # once, not twice
    assert cpu_s >= 0.45  # the child's CPU, including what it used after the last look


FORKS = """
import os, sys, time
sys.stdin.readline()
if os.fork() == 0:
    end = time.process_time() + 0.3
    while time.process_time() < end:  # CPU before the recorder first sees this process
        pass
    print("busy", flush=True)
    time.sleep(30)
print("forked", flush=True)
time.sleep(30)
"""


def test_a_fork_is_counted_from_its_start_once_it_has_a_name() -> None:
    """NOTE [a fork not yet named]: a copy of the training process under its name is left
    out of the sample that first sees it (a DataLoader worker, unnamed for a moment,
    was counted as another process of the job), and counted, from its start, by the next."""
    from iolens.recorder.sampler import Recorder

    proc = subprocess.Popen([sys.executable, "-c", FORKS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        rec = Recorder(None, proc.pid, 0.1, {}, discover=False)
        assert set(rec.sample()["job"]["roles"]) == {"main"}
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert {proc.stdout.readline().strip(), proc.stdout.readline().strip()} == {
            "forked", "busy"}
        first = rec.sample()["job"]
        assert set(first["roles"]) == {"main"} and first["pids"] == 1, first
        time.sleep(0.1)
        second = rec.sample()
        other = second["job"]["roles"]["other"]
        assert other["pids"] == 1 and second["job"]["pids"] == 2, second["job"]
        # Its 0.3 s of CPU, all spent before the first sample that saw it.
        assert other["cpu_pct"] / 100 * second["interval_s"] >= 0.28, other
        rec.close()
    finally:
        proc.kill()
        proc.wait()


def test_descendants_follow_new_and_ended_processes() -> None:
    # The parent of each process is kept between calls (NOTE [parent cache]);
    # children that appear or end between two calls must still be seen.
    code = ("import os, sys, time\n"
            "sys.stdin.readline()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    time.sleep(30)\n"
            "print(pid, flush=True)\n"
            "sys.stdin.readline()\n"
            "os.kill(pid, 9); os.waitpid(pid, 0)\n"
            "print('gone', flush=True)\n"
            "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    table = ProcessTable()
    try:
        assert [s.pid for s in table.descendants(proc.pid)] == [proc.pid]
        proc.stdin.write("\n")
        proc.stdin.flush()
        child = int(proc.stdout.readline())
        assert sorted(s.pid for s in table.descendants(proc.pid)) == sorted([proc.pid, child])
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "gone"
        assert [s.pid for s in table.descendants(proc.pid)] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


def test_an_unreadable_io_file_never_makes_a_negative_rate(tmp_path: Path) -> None:
    """/proc/<pid>/io unreadable for one sample (a process exiting between its stat and its
    io): that interval adds nothing, the next starts from the last figures read, and no
    rate is negative (a real run recorded write_bytes_s of -245658.8 before)."""
    import dataclasses

    from iolens.recorder.sampler import Recorder

    proc = subprocess.Popen([sys.executable, "-c", REAPED, str(tmp_path / "out.bin")])
    rec = Recorder(None, proc.pid, 0.1, {}, discover=False)
    real = rec.procs.sample
    calls = [0]

    def sample(pid: int, prune: Any = ()) -> Any:
        calls[0] += 1
        got = real(pid, prune)
        if calls[0] % 3 == 2:  # every third look, the io file cannot be read
            got = {p: dataclasses.replace(s, io=None) for p, s in got.items()}
        return got

    rec.procs.sample = sample  # type: ignore[method-assign,assignment]
    written = 0.0
    while True:
        done = proc.poll() is not None
        time.sleep(0.1)
        r = rec.sample()
        for figures in [r["job"], *r["job"].get("roles", {}).values()]:
            assert all(figures[k] >= 0 for k in ("read_bytes_s", "write_bytes_s", "rchar_s",
                                                 "wchar_s", "cpu_pct")), r["job"]
        written += r["job"]["write_bytes_s"] * r["interval_s"]
        if done:
            break
    rec.close()
    assert written <= 8.6 * 2**20  # never counted twice


def test_where_a_process_waits() -> None:
    from iolens.sources.procfs import parse_wait

    assert parse_wait("wait_for_partner", "257 0xffffff9c 0x7f 0x8000 0x0", "x86_64") == {
        "wchan": "wait_for_partner", "syscall": "openat"}
    assert parse_wait("0", "running", "x86_64") == {"syscall": "running"}
    assert parse_wait("do_epoll_wait", "232 0x3", "aarch64") == {
        "wchan": "do_epoll_wait", "syscall": "232"}  # (numbers differ per machine)
    assert parse_wait("", "", "x86_64") == {}


def test_a_process_run_queue_wait() -> None:
    from iolens.sources.procfs import parse_run_delay

    assert parse_run_delay("145322144 12295426 394\n") == 12295426
    assert parse_run_delay("") is None and parse_run_delay("1 x 2") is None


def test_run_queue_wait_is_read_where_the_kernel_keeps_it() -> None:
    """Two busy processes on one core: each waits for it about as long as it runs."""
    from iolens.sources.procfs import ProcessTable
    from tests.conftest import need

    need(os.path.exists(f"/proc/{os.getpid()}/schedstat"),
         "this kernel keeps no /proc/PID/schedstat (CONFIG_SCHED_INFO off)")
    spin = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", spin])
             for _ in range(2)]
    try:
        time.sleep(0.8)
        table = ProcessTable()
        delays = [table.read_run_delay(p.pid) for p in procs]
    finally:
        for p in procs:
            p.wait(timeout=30)
    assert all(d is not None and d > 0.1e9 for d in delays), delays
    assert table.read_run_delay(procs[0].pid) is None  # gone
