"""/proc/self/mountstats parsing and nfsiostat's figures, on fixture text.

The fixtures are two snapshots of one client 5 s apart: an NFSv4.2 mount
over TCP among non-NFS mounts. Each expected figure below is worked out by
hand from the snapshots' differences with nfsiostat's definitions
(nfs-utils, tools/nfs-iostat/nfs-iostat.py): op/s is xprt sends per second,
rpc bklog is (backlog sum / sends) / seconds, and per op kB is (bytes sent +
bytes received) / 1024, retrans is transmissions - ops, and RTT, exe and
queue are their millisecond sums / ops.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from iolens.sources.nfs import (
    EVENT_NAMES,
    NfsMount,
    NfsOpStats,
    nfs_rates,
    parse_mountstats,
    read_mountstats,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nfs"
T0 = (FIXTURES / "mountstats_0.txt").read_text()
T1 = (FIXTURES / "mountstats_1.txt").read_text()
MNT = "/mnt/datasets"


def test_only_nfs_mounts_are_kept() -> None:
    stats = parse_mountstats(T0)
    assert list(stats) == [MNT]
    assert stats.skipped == 0
    m = stats[MNT]
    assert (m.device, m.fstype, m.statvers, m.age) == (
        "fileserver.lab:/export/datasets", "nfs4", "1.1", 3600)


def test_counters_of_one_snapshot() -> None:
    m = parse_mountstats(T0.encode())[MNT]
    assert m.bytes.normalreadbytes == 10737418240
    assert m.bytes.serverreadbytes == 10737418240
    assert m.bytes.normalwritebytes == 13107200
    assert (m.bytes.directreadbytes, m.bytes.directwritebytes) == (0, 0)
    assert (m.bytes.readpages, m.bytes.writepages) == (2621440, 3200)
    assert len(m.events) == len(EVENT_NAMES)
    assert m.events["vfsopen"] == 820
    assert m.xprt is not None
    assert (m.xprt.protocol, m.xprt.sends, m.xprt.recvs, m.xprt.bad_xids) == (
        "tcp", 20600, 20600, 0)
    assert (m.xprt.req_u, m.xprt.bklog_u, m.xprt.count) == (41200, 9000, 1)
    assert m.ops["READ"] == NfsOpStats(10240, 10242, 0, 2293760, 10739957760,
                                       10240, 122880, 143360, 1)
    for name in ("READ", "WRITE", "GETATTR", "LOOKUP", "ACCESS", "OPEN", "NULL", "READ_PLUS"):
        assert name in m.ops
    assert m.ops["GETATTR"].ops == 5400
    assert m.ops["LOOKUP"].errors == 12


def test_rates_match_nfsiostat_by_hand() -> None:
    prev, cur = parse_mountstats(T0)[MNT], parse_mountstats(T1)[MNT]
    r = nfs_rates(prev, cur, 5.0)
    expected = {
        "ops_s": 1500 / 5,                      # 22100 - 20600 sends
        "avg_backlog": 600 / 1500,              # 9600 - 9000 backlog over the sends
        "rpc_bklog": 600 / 1500 / 5,            # nfsiostat divides once more by the time
        "read_ops_s": 1000 / 5,
        "read_kB_s": (224000 + 1048700000) / 1024 / 5,     # 204867.96875
        "read_kB_per_op": (224000 + 1048700000) / 1024 / 1000,
        "read_retrans": 10,                     # 1010 transmissions for 1000 ops
        "read_retrans_pct": 1.0,
        "read_avg_rtt_ms": 12500 / 1000,
        "read_avg_exe_ms": 15000 / 1000,
        "read_avg_queue_ms": 2000 / 1000,
        "read_errors": 2,
        "read_errors_pct": 0.2,
        "write_ops_s": 50 / 5,
        "write_kB_s": (3289200 + 8000) / 1024 / 5,         # 643.984375
        "write_kB_per_op": (3289200 + 8000) / 1024 / 50,   # 64.3984375
        "write_retrans": 0,
        "write_retrans_pct": 0.0,
        "write_avg_rtt_ms": 400 / 50,
        "write_avg_exe_ms": 750 / 50,
        "write_avg_queue_ms": 100 / 50,
        "write_errors": 0,
        "write_errors_pct": 0.0,
    }
    assert r == pytest.approx(expected)
    assert r["read_kB_s"] == pytest.approx(204867.96875)


def test_rates_of_an_idle_interval_are_zero() -> None:
    m = parse_mountstats(T0)[MNT]
    r = nfs_rates(m, m, 2.0)
    assert set(r.values()) == {0.0}


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_rates_need_a_positive_interval(seconds: float) -> None:
    m = parse_mountstats(T0)[MNT]
    with pytest.raises(ValueError, match="seconds must be positive"):
        nfs_rates(m, m, seconds)


def test_a_remount_counts_from_zero() -> None:
    """A smaller age is a new mount: its counters are all from within the interval."""
    prev = parse_mountstats(T1)[MNT]
    cur = parse_mountstats(_block(age=3, sends=30, bklog=0, mnt=MNT,
                                  read="10 10 0 2240 10486960 4 60 70 0"))[MNT]
    r = nfs_rates(prev, cur, 5.0)
    assert r["ops_s"] == pytest.approx(6.0)
    assert r["read_ops_s"] == pytest.approx(2.0)
    assert r["read_avg_rtt_ms"] == pytest.approx(6.0)
    assert r["read_errors"] == 0.0
    assert r["write_ops_s"] == 0.0 and "write_errors" not in r


def test_counters_that_go_back_count_as_zero() -> None:
    prev = parse_mountstats(T1)[MNT]
    cur = parse_mountstats(T0.replace("age:\t3600", "age:\t3610"))[MNT]
    assert all(v >= 0 for v in nfs_rates(prev, cur, 5.0).values())


def test_an_op_missing_from_one_snapshot_gives_no_spike() -> None:
    prev = parse_mountstats(T0)[MNT]
    cur_text = "\n".join(line for line in T1.splitlines() if "  READ:" not in line)
    cur = parse_mountstats(cur_text)[MNT]
    assert "READ" not in cur.ops
    r = nfs_rates(prev, cur, 5.0)
    assert r["read_ops_s"] == 0.0 and r["read_kB_s"] == 0.0
    assert r["write_ops_s"] == pytest.approx(10.0)


def _block(age: int = 60, sends: int = 100, bklog: int = 5, read: str = "",
           xprt: str = "", mnt: str = "/mnt/x", ops_extra: str = "") -> str:
    read = read or "40 41 0 8960 41947840 8 200 240"
    xprt = xprt or f"\txprt:\ttcp 700 1 1 0 0 {sends} {sends} 0 {sends * 2} {bklog} 65 0 0\n"
    return (f"device srv:/e mounted on {mnt} with fstype nfs statvers=1.1\n"
            f"\tage:\t{age}\n"
            "\tbytes:\t100 0 0 0 100 0 1 0\n"
            "\tRPC iostats version: 1.0  p/v: 100003/3 (nfs)\n"
            f"{xprt}"
            "\tper-op statistics\n"
            f"\t        READ: {read}\n"
            f"{ops_extra}")


def test_older_kernel_without_error_counts() -> None:
    """Before RPC iostats 1.1 the op lines hold eight counts and no errors are reported."""
    prev = parse_mountstats(_block(read="40 41 0 8960 41947840 8 200 240"))["/mnt/x"]
    cur = parse_mountstats(_block(age=62, sends=110, read="50 51 0 11200 52434800 9 250 300"))
    assert cur.skipped == 0
    m = cur["/mnt/x"]
    assert m.fstype == "nfs" and m.ops["READ"].errors is None
    r = nfs_rates(prev, m, 2.0)
    assert "read_errors" not in r and "write_errors" not in r
    assert r["read_ops_s"] == pytest.approx(5.0)
    assert r["read_kB_s"] == pytest.approx((2240 + 10486960) / 1024 / 2)
    assert r["read_avg_rtt_ms"] == pytest.approx(5.0)


def test_udp_and_several_transports() -> None:
    udp = "\txprt:\tudp 832 0 300 300 0 900 12 65 0 0\n"
    m = parse_mountstats(_block(xprt=udp))["/mnt/x"]
    assert m.xprt is not None
    assert (m.xprt.protocol, m.xprt.sends, m.xprt.recvs, m.xprt.req_u, m.xprt.bklog_u) == (
        "udp", 300, 300, 900, 12)
    # nconnect=2: one line per connection, summed
    two = ("\txprt:\ttcp 700 1 1 0 0 100 100 0 200 4 65 0 0\n"
           "\txprt:\ttcp 701 1 1 0 0 50 49 1 90 2 65 0 0\n")
    m = parse_mountstats(_block(xprt=two))["/mnt/x"]
    assert m.xprt is not None
    assert (m.xprt.sends, m.xprt.recvs, m.xprt.bad_xids, m.xprt.bklog_u, m.xprt.count) == (
        150, 149, 1, 6, 2)
    # an RDMA transport: the same counters as TCP, then its own
    rdma = "\txprt:\trdma 0 0 1 0 0 80 80 0 160 3 0 0 0 0 0 0 0 0 0 0 0\n"
    m = parse_mountstats(_block(xprt=rdma))["/mnt/x"]
    assert m.xprt is not None and (m.xprt.sends, m.xprt.bklog_u) == (80, 3)


def test_escaped_mount_point_and_later_block_wins() -> None:
    text = (_block(mnt="/mnt/my\\040data", age=5)
            + _block(mnt="/mnt/my\\040data", age=9))
    stats = parse_mountstats(text)
    assert list(stats) == ["/mnt/my data"]
    assert stats["/mnt/my data"].age == 9


@pytest.mark.parametrize(("line", "what"), [
    ("\tage:\tsoon\n", "age"),
    ("\tbytes:\t1 2 3\n", "short bytes"),
    ("\tbytes:\t1 2 3 4 5 6 7 -8\n", "negative"),
    ("\tevents:\t1 x 3\n", "events"),
    ("\txprt:\ttcp 700 1\n", "short xprt"),
    ("\txprt:\tquic 1 2 3 4 5 6 7 8 9\n", "unknown transport"),
])
def test_malformed_lines_are_skipped_and_counted(line: str, what: str) -> None:
    text = _block().replace("\tRPC iostats", line + "\tRPC iostats")
    stats = parse_mountstats(text)
    assert stats.skipped == 1, what
    assert "/mnt/x" in stats


def test_malformed_op_lines_are_skipped() -> None:
    extra = ("\t       WRITE: 1 2 3\n"        # truncated
             "\t      COMMIT: 1 2 3 4 5 6 7 eight\n"
             "\tGARBAGE 1 2 3 4 5 6 7 8\n"     # no colon
             "\t      ACCESS: 3 3 0 720 504 0 2 2 0\n")
    stats = parse_mountstats(_block(ops_extra=extra))
    assert stats.skipped == 3
    assert set(stats["/mnt/x"].ops) == {"READ", "ACCESS"}


def test_text_outside_blocks_and_bad_device_lines() -> None:
    text = ("stray words before any block\n"
            "device half a line\n"
            "\tage:\t7\n"                      # belongs to the unreadable block: passed over
            + _block())
    stats = parse_mountstats(text)
    assert stats.skipped == 2
    assert list(stats) == ["/mnt/x"]


def test_truncated_anywhere_never_raises() -> None:
    data = T1.encode()
    prev = parse_mountstats(T0)[MNT]
    for cut in range(0, len(data), 7):
        stats = parse_mountstats(data[:cut])
        for m in stats.values():
            assert isinstance(m, NfsMount)
            nfs_rates(prev, m, 1.0)
            nfs_rates(m, prev, 1.0)


def test_garbage_never_raises() -> None:
    rng = random.Random(7)
    lines = T1.splitlines()
    for _ in range(300):
        mutated = list(lines)
        for _ in range(5):
            i = rng.randrange(len(mutated))
            words = mutated[i].split(" ")
            j = rng.randrange(len(words))
            words[j] = rng.choice(["", "x", "-1", "99999999999999999999999", "\x00", "é", ":"])
            mutated[i] = " ".join(words)
        parse_mountstats("\n".join(mutated))
    for _ in range(100):
        parse_mountstats(bytes(rng.randrange(256) for _ in range(rng.randrange(2000))))
    parse_mountstats("")
    parse_mountstats("\ud800 device")


def test_read_mountstats_from_a_proc_root(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountstats").write_text(T0)
    stats = read_mountstats(str(tmp_path))
    assert stats is not None and list(stats) == [MNT]
    assert read_mountstats(str(tmp_path / "missing")) is None


def test_read_mountstats_of_this_machine() -> None:
    """The real file parses (this kernel may have no NFS client: then no mounts)."""
    stats = read_mountstats()
    if stats is None:
        pytest.skip("/proc/self/mountstats cannot be read here")
    assert stats.skipped == 0
    assert all(m.fstype in ("nfs", "nfs4") for m in stats.values())
