"""NFS client statistics per mount: /proc/self/mountstats, and the figures nfsiostat prints.

NOTE [mountstats format]: the file has one block per mount, opened by
``device SRC mounted on MNT with fstype TYPE`` (``no device mounted on ...``
when there is no source). NFS blocks (fs/nfs/super.c, nfs_show_stats) go on
with tab-indented ``key: values`` lines: ``age:`` (seconds since mount),
``events:``, ``bytes:``, then the RPC client's part (net/sunrpc/stats.c):
``RPC iostats version:``, one ``xprt:`` line per transport (several with
nconnect or session trunking) and, after ``per-op statistics``, one line
per procedure: ops, transmissions, timeouts, bytes sent, bytes received,
then queue, RTT and execute time in milliseconds, all cumulative. RPC
iostats 1.1 (2019, Linux 5.x) added a ninth count, the ops that ended in
an error. Names are octal-escaped as in mountinfo.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from iolens.sources._files import MAX_BYTES, as_bytes
from iolens.sources.devmap import _unescape

NFS_FSTYPES = frozenset({"nfs", "nfs4"})

EVENT_NAMES = (
    "inoderevalidates", "dentryrevalidates", "datainvalidates", "attrinvalidates",
    "vfsopen", "vfslookup", "vfsaccess", "vfsupdatepage", "vfsreadpage", "vfsreadpages",
    "vfswritepage", "vfswritepages", "vfsgetdents", "vfssetattr", "vfsflush", "vfsfsync",
    "vfslock", "vfsrelease", "congestionwait", "setattrtrunc", "extendwrite",
    "sillyrenames", "shortreads", "shortwrites", "delay", "pnfsreads", "pnfswrites",
)
"""The ``events:`` counters in kernel order (include/linux/nfs_iostat.h); older
kernels print fewer."""

# Where the counters sit in an ``xprt:`` line, counted after the protocol name
# (net/sunrpc/xprtsock.c and xprtrdma/transport.c): udp has no connection fields,
# local (AF_LOCAL) has no port.
_XPRT_SENDS_AT = {"udp": 2, "tcp": 5, "rdma": 5, "local": 4}


@dataclass(frozen=True, slots=True)
class NfsBytes:
    """The ``bytes:`` line: cumulative bytes since mount."""

    normalreadbytes: int = 0
    """Bytes applications read through the page cache (read(2) on files without O_DIRECT)."""
    normalwritebytes: int = 0
    """Bytes applications wrote through the page cache."""
    directreadbytes: int = 0
    """Bytes read with O_DIRECT."""
    directwritebytes: int = 0
    """Bytes written with O_DIRECT."""
    serverreadbytes: int = 0
    """Bytes fetched from the server by READ (both paths): below normal + direct means
    the client's cache served the rest."""
    serverwritebytes: int = 0
    """Bytes sent to the server by WRITE."""
    readpages: int = 0
    """Pages read through readpage/readahead."""
    writepages: int = 0
    """Pages written through writepage(s)."""


@dataclass(frozen=True, slots=True)
class NfsXprt:
    """The RPC transports of a mount, summed when there are several (nconnect)."""

    protocol: str
    """``tcp``, ``udp``, ``rdma``... (the first transport's when they differ)."""
    sends: int = 0
    """RPC requests transmitted, retransmissions included."""
    recvs: int = 0
    """RPC replies received."""
    bad_xids: int = 0
    """Replies that matched no outstanding request."""
    req_u: int = 0
    """Sum, over sends, of the requests outstanding at that moment."""
    bklog_u: int = 0
    """Sum, over sends, of the length of the backlog queue (requests waiting for a
    transport slot) at that moment."""
    count: int = 1
    """How many ``xprt:`` lines were summed."""


@dataclass(frozen=True, slots=True)
class NfsOpStats:
    """One RPC procedure's cumulative counters (a ``per-op statistics`` line)."""

    ops: int
    """Operations completed."""
    trans: int
    """Transmissions: ops plus retransmissions."""
    timeouts: int
    """Major timeouts."""
    bytes_sent: int
    """Request bytes, RPC headers included."""
    bytes_recv: int
    """Reply bytes, RPC headers included."""
    queue_ms: int
    """Time from the request being queued to its transmission."""
    rtt_ms: int
    """Time from transmission to the reply: network plus server."""
    execute_ms: int
    """Time from the request being made to its completion: queue, RTT and the client's
    own work."""
    errors: int | None = None
    """Ops that completed with an error; None before RPC iostats 1.1 (kernels before 5.x)."""


@dataclass(frozen=True, slots=True)
class NfsMount:
    """One NFS mount's block of mountstats."""

    device: str
    """The export, ``server:/path``."""
    mount_point: str
    """Where it is mounted."""
    fstype: str
    """``nfs`` (v2, v3) or ``nfs4``."""
    statvers: str = ""
    """Version of the NFS statistics format (``1.1``)."""
    age: int = 0
    """Seconds since the mount was made: a smaller age in a later snapshot is a remount."""
    events: Mapping[str, int] = field(default_factory=dict)
    """The ``events:`` counters by name (see EVENT_NAMES)."""
    bytes: NfsBytes = field(default_factory=NfsBytes)
    """The ``bytes:`` counters."""
    xprt: NfsXprt | None = None
    """The RPC transport counters; None when the block has none."""
    ops: Mapping[str, NfsOpStats] = field(default_factory=dict)
    """Per-procedure counters by upper-case name (READ, WRITE, GETATTR, LOOKUP...)."""


class MountStats(dict[str, NfsMount]):
    """NFS mounts by mount point, with the count of lines that did not fit."""

    skipped: int = 0
    """Lines that are not blank and could not be read: a known key with values that are
    not counts, an op line without eight counts, text outside any block."""


def _counts(words: list[bytes]) -> list[int] | None:
    try:
        nums = [int(w) for w in words]
    except ValueError:
        return None
    return nums if min(nums, default=0) >= 0 else None


class _Block:
    """The NFS block being read."""

    def __init__(self, device: str, mount_point: str, fstype: str, statvers: str) -> None:
        self.device, self.mount_point, self.fstype = device, mount_point, fstype
        self.statvers = statvers
        self.age = 0
        self.events: dict[str, int] = {}
        self.bytes = NfsBytes()
        self.xprt: NfsXprt | None = None
        self.ops: dict[str, NfsOpStats] = {}
        self.in_ops = False

    def mount(self) -> NfsMount:
        return NfsMount(self.device, self.mount_point, self.fstype, self.statvers, self.age,
                        self.events, self.bytes, self.xprt, self.ops)

    def line(self, words: list[bytes]) -> bool:
        """Take one line; False when it is malformed."""
        key = words[0]
        if self.in_ops:
            return self._op(words)
        if key == b"age:":
            nums = _counts(words[1:2])
            if not nums:
                return False
            self.age = nums[0]
        elif key == b"events:":
            nums = _counts(words[1:])
            if not nums:
                return False
            self.events = dict(zip(EVENT_NAMES, nums, strict=False))
        elif key == b"bytes:":
            nums = _counts(words[1:9])
            if nums is None or len(nums) < 8:
                return False
            self.bytes = NfsBytes(*nums)
        elif key == b"xprt:":
            return self._xprt(words[1:])
        elif key == b"per-op" and words[1:2] == [b"statistics"]:
            self.in_ops = True
        return True  # opts, caps, sec, nfsv4, fsc, RPC iostats version: not needed

    def _xprt(self, words: list[bytes]) -> bool:
        if not words:
            return False
        proto = words[0].decode("ascii", "replace")
        at = _XPRT_SENDS_AT.get(proto.partition("-")[0])  # tcp-tls reads as tcp
        if at is None:
            return False
        nums = _counts(words[1 + at:1 + at + 5])
        if nums is None or len(nums) < 5:
            return False
        sends, recvs, bad_xids, req_u, bklog_u = nums
        old = self.xprt
        if old is None:
            self.xprt = NfsXprt(proto, sends, recvs, bad_xids, req_u, bklog_u)
        else:
            self.xprt = NfsXprt(old.protocol, old.sends + sends, old.recvs + recvs,
                                old.bad_xids + bad_xids, old.req_u + req_u,
                                old.bklog_u + bklog_u, old.count + 1)
        return True

    def _op(self, words: list[bytes]) -> bool:
        name = words[0]
        if not name.endswith(b":") or len(name) < 2:
            return False
        nums = _counts(words[1:10])
        if nums is None or len(nums) < 8:
            return False
        ops, trans, timeouts, sent, recv, queue, rtt, execute = nums[:8]
        self.ops[name[:-1].decode("ascii", "replace")] = NfsOpStats(
            ops, trans, timeouts, sent, recv, queue, rtt, execute,
            nums[8] if len(nums) > 8 else None)
        return True


def parse_mountstats(text: str | bytes) -> MountStats:
    """The NFS mounts (nfs, nfs4) of mountstats text, by mount point.

    Other filesystems' blocks are passed over. Lines that cannot be read are
    skipped and counted in ``skipped``; nothing raises. A mount point listed
    twice (a mount over a mount) keeps the later block, which is the visible one.
    """
    data = as_bytes(text)
    out = MountStats()
    block: _Block | None = None
    in_block = False  # inside any device block, NFS or not

    def close() -> None:
        if block is not None:
            out[block.mount_point] = block.mount()

    for line in data.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == b"device" or words[:2] == [b"no", b"device"]:
            close()
            block = None
            in_block = True
            head = words[1:] if words[0] == b"device" else [b"", *words[2:]]
            # SRC mounted on MNT with fstype TYPE [statvers=V]
            if len(head) < 7 or head[1:3] != [b"mounted", b"on"] or \
                    head[4:6] != [b"with", b"fstype"]:
                out.skipped += 1
                continue
            fstype = head[6].decode("ascii", "replace")
            if fstype not in NFS_FSTYPES:
                continue
            statvers = ""
            if len(head) > 7 and head[7].startswith(b"statvers="):
                statvers = head[7][len(b"statvers="):].decode("ascii", "replace")
            block = _Block(_unescape(head[0]), _unescape(head[3]), fstype, statvers)
            continue
        if block is None:
            if not in_block:
                out.skipped += 1
            continue
        if not block.line(words):
            out.skipped += 1
    close()
    return out


def read_mountstats(proc_root: str = "/proc") -> MountStats | None:
    """This process's NFS mounts, or None when mountstats cannot be read."""
    try:
        with open(os.path.join(proc_root, "self", "mountstats"), "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return None
    return parse_mountstats(data)


_NO_OP = NfsOpStats(0, 0, 0, 0, 0, 0, 0, 0, 0)


def _op_rates(prefix: str, prev: NfsOpStats | None, cur: NfsOpStats | None,
              seconds: float, out: dict[str, float]) -> None:
    with_errors = (prev is not None and cur is not None and prev.errors is not None
                   and cur.errors is not None)
    if prev is None or cur is None:  # no baseline: no figures, rather than a spike
        prev = cur = _NO_OP

    def delta(a: int, b: int) -> int:
        return max(0, a - b)

    ops = delta(cur.ops, prev.ops)
    kilobytes = (delta(cur.bytes_sent, prev.bytes_sent)
                 + delta(cur.bytes_recv, prev.bytes_recv)) / 1024
    retrans = max(0, delta(cur.trans, prev.trans) - ops)

    def per_op(amount: float) -> float:
        return amount / ops if ops else 0.0

    out[f"{prefix}_ops_s"] = ops / seconds
    out[f"{prefix}_kB_s"] = kilobytes / seconds
    out[f"{prefix}_kB_per_op"] = per_op(kilobytes)
    out[f"{prefix}_retrans"] = float(retrans)
    out[f"{prefix}_retrans_pct"] = per_op(retrans * 100)
    out[f"{prefix}_avg_rtt_ms"] = per_op(delta(cur.rtt_ms, prev.rtt_ms))
    out[f"{prefix}_avg_exe_ms"] = per_op(delta(cur.execute_ms, prev.execute_ms))
    out[f"{prefix}_avg_queue_ms"] = per_op(delta(cur.queue_ms, prev.queue_ms))
    if with_errors:
        errors = delta(cur.errors or 0, prev.errors or 0)
        out[f"{prefix}_errors"] = float(errors)
        out[f"{prefix}_errors_pct"] = per_op(errors * 100)


def nfs_rates(prev: NfsMount, cur: NfsMount, seconds: float) -> dict[str, float]:
    """The figures of nfsiostat's default report for the interval between two snapshots.

    ``ops_s``: RPC requests sent per second (all procedures, retransmissions
    included); ``rpc_bklog``: the mean backlog queue length per request sent,
    divided once more by the interval as nfsiostat does (``avg_backlog`` is
    the same mean without that division). For ``read`` and ``write``:
    ``*_ops_s``, ``*_kB_s`` and ``*_kB_per_op`` (request and reply bytes,
    headers included, as nfsiostat counts them), ``*_retrans`` (transmissions
    beyond one per op) and ``*_retrans_pct``, ``*_avg_rtt_ms``,
    ``*_avg_exe_ms``, ``*_avg_queue_ms`` per op, and ``*_errors`` and
    ``*_errors_pct`` when the kernel counts errors. Counters that went back
    count as zero; a remount (a smaller age) takes the counters since it.
    Raises ValueError unless ``seconds`` is positive.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive (got {seconds}): pass the time between "
                         "the two snapshots (nfsiostat's first report uses the mount's age)")
    if cur.age < prev.age:
        prev = NfsMount(prev.device, prev.mount_point, prev.fstype,
                        xprt=NfsXprt(cur.xprt.protocol) if cur.xprt else None,
                        ops={k: _NO_OP for k in cur.ops})
    sends = bklog = 0
    if prev.xprt is not None and cur.xprt is not None:
        sends = max(0, cur.xprt.sends - prev.xprt.sends)
        bklog = max(0, cur.xprt.bklog_u - prev.xprt.bklog_u)
    avg_backlog = bklog / sends if sends else 0.0
    out = {"ops_s": sends / seconds, "rpc_bklog": avg_backlog / seconds,
           "avg_backlog": avg_backlog}
    for name in ("READ", "WRITE"):
        _op_rates(name.lower(), prev.ops.get(name), cur.ops.get(name), seconds, out)
    return out
