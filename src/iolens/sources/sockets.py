"""A process's TCP connections and the bytes each one carried (pure parsers + readers).

Object-store clients, HTTP WebDataset shards and remote caches read sockets,
not files: their bytes show in no file's counters, and (see NOTE [rchar and
recv] below) mostly not in rchar either. The kernel still names every socket:
``/proc/<pid>/fd`` links to ``socket:[INODE]``, ``/proc/<pid>/net/tcp{,6}``
gives each inode's addresses and state, and the sock_diag netlink interface
gives each inode's byte counts (what ``ss -ti`` prints).

NOTE [rchar and recv]: /proc/<pid>/io's rchar grows in the VFS read path
(read, readv, pread), so ``os.read()`` on a socket's fd counts there, while
recv, recvfrom and recvmsg go straight to the socket layer and do not.
Python's sockets (``recv``, ``recv_into``, ``makefile().read()``, hence
http.client, urllib3, requests and most object-store SDKs) all call recv, so
their bytes are missing from rchar; :func:`tcp_bytes` is where they are.
tests/test_sockets.py checks both paths on the running kernel.

Readers take ``proc_root`` so tests and containers can point them elsewhere;
the table readers use the pid's own ``net/`` folder, so a process in another
network namespace (a container) is read in its own namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_MAX_TABLE_BYTES = 32 << 20
"""Read at most this much of one tcp table (about 200k sockets at ~150 bytes a line)."""
_MAX_DIAG_BYTES = 16 << 20
"""Stop a sock_diag dump after this much reply (~50k sockets with their tcp_info)."""
_DIAG_TIMEOUT_S = 2.0
"""A dump that has not finished in this time is abandoned (the kernel answers in ms)."""

TCP_STATES: dict[int, str] = {
    0x01: "ESTABLISHED",
    0x02: "SYN_SENT",
    0x03: "SYN_RECV",
    0x04: "FIN_WAIT1",
    0x05: "FIN_WAIT2",
    0x06: "TIME_WAIT",
    0x07: "CLOSE",
    0x08: "CLOSE_WAIT",
    0x09: "LAST_ACK",
    0x0A: "LISTEN",
    0x0B: "CLOSING",
    0x0C: "NEW_SYN_RECV",
}
"""The kernel's TCP states (include/net/tcp_states.h), by the number the tables print in hex."""


@dataclass(frozen=True, slots=True)
class TcpEntry:
    """One socket's line of /proc/<pid>/net/tcp or tcp6."""

    local_ip: str
    """Local address as text; an IPv4-mapped IPv6 address is given as its IPv4 text."""
    local_port: int
    remote_ip: str
    """Peer address ("0.0.0.0" or "::" for a listening socket)."""
    remote_port: int
    state: str
    """A name of :data:`TCP_STATES` ("ESTABLISHED", "LISTEN", ...), or "UNKNOWN_<hex>"."""
    inode: int
    """The socket's inode, as in the ``socket:[INODE]`` link of the fd that holds it."""


@dataclass(frozen=True, slots=True)
class TcpBytes:
    """Byte counts of one TCP socket from the kernel's struct tcp_info (RFC 4898 names)."""

    bytes_received: int
    """Payload bytes received in order (tcpi_bytes_received, Linux 4.1), read or not yet."""
    bytes_acked: int | None
    """Bytes the peer acknowledged (tcpi_bytes_acked, Linux 4.1; counts the SYN as one)."""
    bytes_sent: int | None
    """Payload bytes sent, retransmissions included (tcpi_bytes_sent, Linux 4.19)."""


# --- /proc/<pid>/net/tcp{,6} -------------------------------------------------------------


def _address(hex_addr: str, v6: bool, byteorder: str) -> str:
    """Address text of a table's hex address: 32-bit words, each printed in host order."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) != (16 if v6 else 4):
        raise ValueError(f"address of {len(raw)} bytes")
    if byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if not v6:
        return str(ipaddress.IPv4Address(raw))
    addr = ipaddress.IPv6Address(raw)
    mapped = addr.ipv4_mapped
    return str(mapped) if mapped is not None else str(addr)


def _endpoint(field: str, v6: bool, byteorder: str) -> tuple[str, int]:
    hex_addr, sep, hex_port = field.partition(":")
    if not sep:
        raise ValueError(f"no port in {field!r}")
    port = int(hex_port, 16)
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"port {port}")
    return _address(hex_addr, v6, byteorder), port


def parse_tcp(text: str, v6: bool, *, byteorder: str = sys.byteorder) -> dict[int, TcpEntry]:
    """The sockets of a /proc/net/tcp (``v6`` False) or tcp6 (``v6`` True) text, by inode.

    The kernel prints each address as 32-bit words in the byte order of the
    machine (``byteorder``, this one's by default), ports in hex. Lines with
    inode 0 (TIME_WAIT and request sockets, which no process holds) and lines
    that do not have the table's format (the header among them) are skipped.
    """
    out: dict[int, TcpEntry] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 10 or not parts[0].endswith(":"):
            continue
        try:
            local_ip, local_port = _endpoint(parts[1], v6, byteorder)
            remote_ip, remote_port = _endpoint(parts[2], v6, byteorder)
            state_n = int(parts[3], 16)
            inode = int(parts[9])
        except ValueError:
            continue
        if inode <= 0:
            continue
        state = TCP_STATES.get(state_n, f"UNKNOWN_{state_n:02X}")
        out[inode] = TcpEntry(local_ip, local_port, remote_ip, remote_port, state, inode)
    return out


def _read_capped(path: str, cap: int) -> str:
    """The text of ``path``, cut to whole lines when it is longer than ``cap`` bytes."""
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:
        # A line cut in the middle could still parse, with a wrong (shortened) inode.
        data = data[:data.rfind(b"\n", 0, cap) + 1]
    return data.decode("ascii", "replace")


def _read_tables(pid: int, proc_root: str) -> dict[int, TcpEntry] | None:
    """Both tcp tables of ``pid``'s network namespace; ``None`` when neither can be read.

    A kernel without IPv6 has no tcp6; that alone is not a failure.
    """
    out: dict[int, TcpEntry] = {}
    read_any = False
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            text = _read_capped(os.path.join(proc_root, str(pid), "net", name),
                                _MAX_TABLE_BYTES)
        except OSError:
            continue
        read_any = True
        out.update(parse_tcp(text, v6))
    return out if read_any else None


def read_tcp(pid: int, proc_root: str = "/proc") -> dict[int, TcpEntry]:
    """The TCP sockets of ``pid``'s network namespace (tcp and tcp6 merged), by inode.

    Empty when the tables cannot be read (the process is gone).
    """
    return _read_tables(pid, proc_root) or {}


# --- /proc/<pid>/fd and /proc/<pid>/ns/net ------------------------------------------------


def _socket_inode(target: str) -> int | None:
    if target.startswith("socket:[") and target.endswith("]"):
        with contextlib.suppress(ValueError):
            return int(target[8:-1])
    return None


def socket_inodes(pid: int, proc_root: str = "/proc") -> list[int]:
    """The inodes of the sockets process ``pid`` holds, once each, in fd order.

    Empty when its fd folder cannot be read (the process is gone, or another
    user's without the right to look). An fd closed during the scan is skipped.
    """
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    out: dict[int, None] = {}
    for name in sorted(names, key=lambda n: (len(n), n)):
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        inode = _socket_inode(target)
        if inode is not None:
            out.setdefault(inode, None)
    return list(out)


def net_namespace(pid: int, proc_root: str = "/proc") -> int | None:
    """The inode of ``pid``'s network namespace (``net:[N]``); ``None`` when unreadable."""
    path = os.path.join(proc_root, str(pid), "ns", "net")
    try:
        target = os.readlink(path)
    except OSError:
        target = ""
    if target.startswith("net:[") and target.endswith("]"):
        with contextlib.suppress(ValueError):
            return int(target[5:-1])
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


# --- peers ---------------------------------------------------------------------------------


def _established(inodes: Iterable[int], table: Mapping[int, TcpEntry]) -> list[TcpEntry]:
    out: list[TcpEntry] = []
    for inode in inodes:
        entry = table.get(inode)
        if entry is not None and entry.state == "ESTABLISHED":
            out.append(entry)
    return out


def peers(pid: int, proc_root: str = "/proc") -> list[TcpEntry]:
    """The established TCP connections of process ``pid``, one entry per socket.

    Reads the fd folder, then the tcp tables once (not at all when the process
    holds no socket). UDP and Unix sockets are not in these tables and are left out.
    """
    inodes = socket_inodes(pid, proc_root)
    if not inodes:
        return []
    return _established(inodes, read_tcp(pid, proc_root))


def peers_of(pids: Iterable[int], proc_root: str = "/proc") -> dict[int, list[TcpEntry]]:
    """:func:`peers` of many processes, reading each network namespace's tables once.

    A DataLoader job is eight or more processes in one namespace; the tables
    list every socket of that namespace, so they are read once for all of them.
    A process whose namespace cannot be told is read on its own. Every pid
    asked for is a key; a vanished one maps to an empty list.
    """
    inodes: dict[int, list[int]] = {}
    groups: dict[tuple[str, int], list[int]] = {}
    for pid in dict.fromkeys(pids):
        inodes[pid] = socket_inodes(pid, proc_root)
        if not inodes[pid]:
            continue
        ns = net_namespace(pid, proc_root)
        key = ("net", ns) if ns is not None else ("pid", pid)
        groups.setdefault(key, []).append(pid)
    out: dict[int, list[TcpEntry]] = {pid: [] for pid in inodes}
    for members in groups.values():
        table: dict[int, TcpEntry] | None = None
        for pid in members:  # the first member may have exited since; any other will do
            table = _read_tables(pid, proc_root)
            if table is not None:
                break
        if table is None:
            continue
        for pid in members:
            out[pid] = _established(inodes[pid], table)
    return out


# --- listeners ----------------------------------------------------------------------------

_ANY_V4 = ("0.0.0.0", "::")
"""Wildcards that serve an IPv4 peer ("::" does, unless the socket is IPV6_V6ONLY)."""
_ANY_V6 = ("::",)


def listening_sockets(table: Mapping[int, TcpEntry]) -> dict[tuple[str, int], int]:
    """The LISTEN sockets of a table: (local ip, port) to inode."""
    return {(e.local_ip, e.local_port): e.inode for e in table.values() if e.state == "LISTEN"}


def find_listener(ip: str, port: int, proc_root: str = "/proc",
                  ns_pid: int | None = None) -> int | None:
    """The pid of a local process that holds the LISTEN socket serving ``ip:port``.

    This traces a peer such as 127.0.0.1:9000 to the local server process (a
    MinIO, a caching proxy) behind it. ``ns_pid`` is a process of the network
    namespace to look in (the client's, usually; this process's when ``None``).
    A socket bound to the exact address wins over one bound to any address.

    Cost: the tables once, then every /proc/<pid>/fd until the first process
    that holds the inode (a pre-forked server's workers share it; the first pid
    found is returned). That walk is far dearer than a sample, so call this
    once per new peer and keep the answer, never every interval. Processes that
    cannot be read are skipped; ``None`` when nothing local listens there.
    """
    table = read_tcp(ns_pid if ns_pid is not None else os.getpid(), proc_root)
    listening = listening_sockets(table)
    inode = listening.get((ip, port))
    if inode is None:
        wildcards = _ANY_V6 if ":" in ip else _ANY_V4
        inode = next((listening[(a, port)] for a in wildcards if (a, port) in listening), None)
    if inode is None:
        return None
    try:
        names = os.listdir(proc_root)
    except OSError:
        return None
    for pid in sorted(int(n) for n in names if n.isdigit()):
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if _socket_inode(target) == inode:
                return pid
    return None


# --- sock_diag: bytes per socket ----------------------------------------------------------

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x01
_NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_INET_DIAG_INFO = 2

_NLMSG_HDR = struct.Struct("=IHHII")
"""struct nlmsghdr: length, type, flags, sequence, port id."""
_DIAG_REQ = struct.Struct("=BBBBI48x")
"""struct inet_diag_req_v2: family, protocol, ext, pad, states, then a zeroed sockid."""
_DIAG_MSG_LEN = 72
"""sizeof(struct inet_diag_msg); idiag_inode is its last field."""
_DIAG_INODE_OFFSET = 68
_RTATTR = struct.Struct("=HH")

# Offsets in struct tcp_info (include/uapi/linux/tcp.h); fields were only ever appended,
# so an older kernel sends a shorter struct that lacks the later ones.
_TCPI_BYTES_ACKED = 120
_TCPI_BYTES_RECEIVED = 128
_TCPI_BYTES_SENT = 200

_ALL_HELD_STATES = 0xFFFFFFFF & ~(1 << 6) & ~(1 << 12)
"""Every state but TIME_WAIT and NEW_SYN_RECV: those have inode 0, no process holds them,
and a busy server has tens of thousands of them."""


class DiagReplyError(ValueError):
    """A sock_diag reply that reports an error or cannot be parsed."""


def _align4(n: int) -> int:
    return (n + 3) & ~3


def _u64(info: bytes, offset: int) -> int | None:
    if len(info) < offset + 8:
        return None
    value: int = struct.unpack_from("=Q", info, offset)[0]
    return value


def parse_tcp_info(info: bytes) -> TcpBytes | None:
    """The byte counts of a struct tcp_info; ``None`` when it predates bytes_received."""
    received = _u64(info, _TCPI_BYTES_RECEIVED)
    if received is None:
        return None
    return TcpBytes(received, _u64(info, _TCPI_BYTES_ACKED), _u64(info, _TCPI_BYTES_SENT))


def parse_diag_messages(data: bytes, seq: int | None = None) -> tuple[dict[int, TcpBytes], bool]:
    """The sockets in one netlink datagram of a sock_diag dump, and whether it ended there.

    Messages of another sequence number than ``seq`` (when given) are ignored;
    sockets of inode 0 and those without tcp_info are left out. Raises
    :class:`DiagReplyError` on an error message (the kernel's answer to a family
    it does not have) or a message or attribute that overruns the datagram.
    """
    out: dict[int, TcpBytes] = {}
    pos = 0
    while pos + _NLMSG_HDR.size <= len(data):
        length, mtype, _flags, mseq, _port = _NLMSG_HDR.unpack_from(data, pos)
        if length < _NLMSG_HDR.size or pos + length > len(data):
            raise DiagReplyError(f"message of {length} bytes at {pos} of {len(data)}")
        body = data[pos + _NLMSG_HDR.size:pos + length]
        pos += _align4(length)
        if seq is not None and mseq != seq:
            continue
        if mtype == _NLMSG_DONE:
            return out, True
        if mtype == _NLMSG_ERROR:
            code = struct.unpack_from("=i", body)[0] if len(body) >= 4 else 0
            raise DiagReplyError(f"netlink error {code}")
        if mtype != _SOCK_DIAG_BY_FAMILY or len(body) < _DIAG_MSG_LEN:
            continue
        inode: int = struct.unpack_from("=I", body, _DIAG_INODE_OFFSET)[0]
        apos = _DIAG_MSG_LEN
        while apos + _RTATTR.size <= len(body):
            alen, atype = _RTATTR.unpack_from(body, apos)
            if alen < _RTATTR.size or apos + alen > len(body):
                raise DiagReplyError(f"attribute of {alen} bytes")
            if atype == _INET_DIAG_INFO and inode:
                counts = parse_tcp_info(body[apos + _RTATTR.size:apos + alen])
                if counts is not None:
                    out[inode] = counts
            apos += _align4(alen)
    return out, False


def _open_netlink() -> socket.socket:
    """A sock_diag netlink socket (one place, so tests can hand in a fake kernel)."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)


def _dump(sock: socket.socket, family: int, *, seq: int, budget: int, deadline: float,
          wanted: set[int] | None, out: dict[int, TcpBytes]) -> int:
    """Add one address family's dump to ``out``; returns the reply bytes it used."""
    header = _NLMSG_HDR.pack(_NLMSG_HDR.size + _DIAG_REQ.size, _SOCK_DIAG_BY_FAMILY,
                             _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0)
    request = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0,
                             _ALL_HELD_STATES)
    sock.sendto(header + request, (0, 0))
    used = 0
    while used < budget:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = sock.recv(1 << 16)
        if not data:
            break
        used += len(data)
        found, done = parse_diag_messages(data, seq)
        if wanted is None:
            out.update(found)
        else:
            out.update((i, c) for i, c in found.items() if i in wanted)
            if wanted <= out.keys():
                break
        if done:
            break
    return used


def tcp_bytes(inodes: set[int] | None = None) -> dict[int, TcpBytes]:
    """Bytes received and sent by each TCP socket, by inode (``ss -ti``'s figures).

    Asks the kernel over sock_diag netlink for every IPv4 and IPv6 TCP socket
    with its tcp_info; ``inodes`` keeps only those (and ends the dump once all
    are found). The counts are cumulative since the connection opened and,
    unlike rchar, hold bytes that recv() read (NOTE [rchar and recv]).

    It sees the caller's network namespace only: the recorder and the job
    share it in the normal case; a job in a container of its own is not seen.
    Never raises: without netlink (a sandbox, a seccomp filter) or on a reply
    it cannot parse it returns what it had (an IPv6-less kernel refuses only
    the IPv6 dump). At most 16 MiB of replies are read, about 50k sockets; on a
    machine with more, the rest are missing.
    """
    out: dict[int, TcpBytes] = {}
    if inodes is not None and not inodes:
        return out
    try:
        sock = _open_netlink()
    except (OSError, AttributeError):  # AttributeError: no AF_NETLINK off Linux
        return out
    deadline = time.monotonic() + _DIAG_TIMEOUT_S
    budget = _MAX_DIAG_BYTES
    with sock:
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            found: dict[int, TcpBytes] = {}
            try:
                budget -= _dump(sock, family, seq=seq, budget=budget, deadline=deadline,
                                wanted=inodes, out=found)
            except (OSError, ValueError, struct.error):  # DiagReplyError is a ValueError
                # This family's dump failed midway; later replies on this socket are
                # the rest of it, so no further family is asked on it.
                out.update(found)
                break
            out.update(found)
            if budget <= 0 or time.monotonic() >= deadline:
                break
            if inodes is not None and inodes <= out.keys():
                break
    return out
