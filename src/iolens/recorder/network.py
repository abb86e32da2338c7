"""The dataset served over the network: the TCP peers the input pipeline reads from.

NOTE [network storage]: a dataset read over TCP (HTTP shards, an S3-compatible
store, ``pipe:curl`` children of the workers) shows in no mount table. The
recorder finds it from the sockets of the processes that fetch batches (the
DataLoader workers and their children, or the training process with
num_workers=0): ``/proc/PID/fd`` names each socket's inode and the
namespace's tcp tables its peer (iolens/sources/sockets.py). A peer is named
by the URL the job used where one is seen (a child's command line, such as
curl's, or Python's audit events in the job, NOTE [dataset folders]), else
``tcp://IP:PORT``. Per interval: the connections open, the new ones, and the
bytes received on them (the kernel's tcp_info: Python's recv() never counts in
rchar, NOTE [rchar and recv]). A peer served by a process on this machine (a
local server, a proxy) names that process: its disk reads are the job's, seen
one step away, never a neighbour's.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from iolens.sources import sockets
from iolens.sources.procfs import CLK_TCK, ProcessTable, ProcIO

_PEERS_MAX = 16
"""Peers followed at most: a job that talks to many hosts is not reading one dataset."""
_INODES_MAX = 4096
"""Connections remembered at most (their last byte counts)."""
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://[^\s/]+")
_DEFAULT_PORTS = {"http": 80, "https": 443, "s3": 443, "gs": 443}


def _is_local(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def url_parts(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a URL, the port filled in from the scheme; None when it has
    no host or no port can be told."""
    try:
        u = urlsplit(url)
        port = u.port or _DEFAULT_PORTS.get(u.scheme)
    except ValueError:
        return None
    if not u.scheme or not u.hostname or port is None:
        return None
    return u.scheme, u.hostname, port


@dataclass
class Peer:
    """One remote endpoint the input pipeline reads from."""

    ip: str
    port: int
    scheme: str = "tcp"
    host: str = ""
    url: str = ""
    """A URL the job read there (one example), where one was seen."""
    server_pid: int | None = None
    """The local process that serves it (a peer on this machine)."""
    server: str = ""
    """That process's command name."""
    connections: set[int] = field(default_factory=set)
    """Socket inodes seen connected to it, ever (bounded)."""
    _server_prev: tuple[int, ProcIO] | None = None

    @property
    def key(self) -> str:
        """``IP:PORT``: the peer's key in the records, which its name may change under (a
        URL seen after the first connection)."""
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"

    @property
    def name(self) -> str:
        """How the report names it: ``http://127.0.0.1:8000``."""
        host = self.host or self.ip
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mount": self.name, "fstype": self.scheme, "device": None,
                               "kind": "network", "source": self.url, "disks": [],
                               "folders": [], "peer": self.key,
                               "page_cache_visible": False, "opens": len(self.connections)}
        if self.server_pid is not None:
            out["server_pid"] = self.server_pid
            out["server"] = self.server
        return out


class NetWatch:
    """Finds the dataset's TCP peers and samples what the job received from them."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self.peers: dict[tuple[str, int], Peer] = {}
        self.urls: dict[tuple[str, int], str] = {}
        """(host, port) -> a URL the job's Python code asked for (audit events)."""
        self._bytes: dict[int, int] = {}
        """Socket inode -> bytes received at the last look."""
        self._new: dict[tuple[str, int], int] = {}
        """Peer -> connections first seen since the last sample."""
        self._rx: dict[tuple[str, int], int] = {}
        """Peer -> bytes received since the last sample."""
        self._open: dict[tuple[str, int], set[int]] = {}
        """Peer -> the sockets open at the last scan."""
        self._procs = ProcessTable(proc_root)
        self._cmdlines: dict[int, list[str]] = {}
        self._not_tcp: set[int] = set()
        """Socket inodes the tcp tables did not list (Unix, netlink ...)."""

    def note_url(self, url: str) -> None:
        """A URL the job's Python code opened (NOTE [dataset folders])."""
        parts = url_parts(url)
        if parts is not None and len(self.urls) < 256:
            self.urls.setdefault((parts[1], parts[2]), url)
            for peer in self.peers.values():
                if not peer.url:
                    self._name(peer, None)

    def scan(self, pids: list[int]) -> list[Peer]:
        """Look at the established connections of ``pids`` (the processes that fetch);
        returns the peers new among them. A connection seen for the first time counts
        every byte it received since it opened (in the job, all but the first moments of
        a connection the job itself opened)."""
        found: list[Peer] = []
        table = self._established(pids)
        seen: dict[tuple[str, int], set[int]] = {}
        for pid, entries in table.items():
            for e in entries:
                key = (e.remote_ip, e.remote_port)
                peer = self.peers.get(key)
                if peer is None:
                    if len(self.peers) >= _PEERS_MAX:
                        continue
                    peer = self.peers[key] = self._name(Peer(e.remote_ip, e.remote_port), pid)
                    if _is_local(e.remote_ip):
                        self._find_server(peer, pid)
                    found.append(peer)
                seen.setdefault(key, set()).add(e.inode)
                if e.inode not in peer.connections:
                    if len(peer.connections) < _INODES_MAX:
                        peer.connections.add(e.inode)
                    self._new[key] = self._new.get(key, 0) + 1
                    if not peer.url:
                        self._name(peer, pid)
        self._open = seen
        self._count_bytes()
        return found

    def _established(self, pids: list[int]) -> dict[int, list[sockets.TcpEntry]]:
        """The established TCP connections of each of ``pids``.

        The kernel's tcp tables take milliseconds to read whatever few sockets they
        hold (it walks its hash of every connection), and a DataLoader's processes hold
        Unix sockets all run long. So the tables are read only when a process holds a
        socket not known to be anything but TCP, or one of the connections of the last
        look: a socket the tables did not list is remembered as no TCP socket."""
        held = {pid: sockets.socket_inodes(pid, self.proc_root) for pid in pids}
        live = {i for inodes in self._open.values() for i in inodes}
        if not any(i not in self._not_tcp or i in live for inodes in held.values()
                   for i in inodes):
            return {pid: [] for pid in held}
        out: dict[int, list[sockets.TcpEntry]] = {pid: [] for pid in held}
        tables: dict[int | None, dict[int, sockets.TcpEntry]] = {}
        for pid, inodes in held.items():
            if not inodes:
                continue
            ns = sockets.net_namespace(pid, self.proc_root)
            table = tables.get(ns) if ns is not None else None
            if table is None:
                table = sockets.read_tcp(pid, self.proc_root)
                if ns is not None:
                    tables[ns] = table
            for i in inodes:
                entry = table.get(i)
                if entry is None:
                    if len(self._not_tcp) < _INODES_MAX * 4:
                        self._not_tcp.add(i)
                elif entry.state == "ESTABLISHED":
                    out[pid].append(entry)
        return out

    def _name(self, peer: Peer, pid: int | None) -> Peer:
        """The scheme, host and an example URL of a peer: from the command line of the
        process that holds the socket (curl URL), else from the job's audit events."""
        for url in self._urls_of(pid) if pid is not None else ():
            parts = url_parts(url)
            if parts is not None and parts[2] == peer.port and (
                    parts[1] == peer.ip or (parts[1] == "localhost" and _is_local(peer.ip))):
                peer.scheme, peer.host, peer.url = parts[0], parts[1], url
                return peer
        for (host, port), url in self.urls.items():
            if port == peer.port and (host in (peer.ip, "localhost") or not _is_ip(host)):
                parts = url_parts(url)
                if parts is not None:
                    peer.scheme, peer.host, peer.url = parts[0], parts[1], url
                    return peer
        return peer

    def _urls_of(self, pid: int) -> list[str]:
        args = self._cmdlines.get(pid)
        if args is None:
            try:
                with open(os.path.join(self.proc_root, str(pid), "cmdline"), "rb") as fh:
                    raw = fh.read(1 << 16)
            except OSError:
                raw = b""
            args = [a for a in os.fsdecode(raw).split("\0") if _URL.match(a)]
            if len(self._cmdlines) > 4096:
                self._cmdlines.clear()
            self._cmdlines[pid] = args
        return args

    def _find_server(self, peer: Peer, pid: int) -> None:
        try:
            server = sockets.find_listener(peer.ip, peer.port, self.proc_root, ns_pid=pid)
        except OSError:
            server = None
        if server is None:
            return
        st = self._procs.read_stat(server)
        peer.server_pid = server
        peer.server = st.comm if st is not None else ""

    def _count_bytes(self) -> None:
        live = {i for inodes in self._open.values() for i in inodes}
        if not live:
            return
        counts = sockets.tcp_bytes(live)
        for key, inodes in self._open.items():
            for inode in inodes:
                b = counts.get(inode)
                if b is None:
                    continue
                prev = self._bytes.get(inode, 0)
                if b.bytes_received > prev:
                    self._rx[key] = self._rx.get(key, 0) + b.bytes_received - prev
                self._bytes[inode] = b.bytes_received
        if len(self._bytes) > _INODES_MAX:
            self._bytes = {i: n for i, n in self._bytes.items() if i in live}

    def sample(self, seconds: float) -> dict[str, Any]:
        """This interval's figures of each peer, by its key (IP:PORT): connections open, new
        connections a second, bytes received a second, and its local server's CPU and
        reads."""
        out: dict[str, Any] = {}
        for key, peer in self.peers.items():
            fig: dict[str, Any] = {
                "connections": len(self._open.get(key, ())),
                "new_connections_s": round(self._new.get(key, 0) / seconds, 3),
                "rx_bytes_s": round(self._rx.get(key, 0) / seconds, 1),
            }
            if peer.server_pid is not None:
                fig.update(self._server(peer, seconds))
            out[peer.key] = fig
        self._new.clear()
        self._rx.clear()
        return out

    def _server(self, peer: Peer, seconds: float) -> dict[str, Any]:
        assert peer.server_pid is not None
        st = self._procs.read_stat(peer.server_pid)
        if st is None:
            peer._server_prev = None
            return {}
        io = self._procs.read_io(peer.server_pid) or ProcIO()
        ticks = st.utime_ticks + st.stime_ticks
        prev, peer._server_prev = peer._server_prev, (ticks, io)
        if prev is None or seconds <= 0:
            return {}
        return {"server_cpu_pct": round(max(0, ticks - prev[0]) / CLK_TCK / seconds * 100, 2),
                "server_read_bytes_s": round(max(0, io.read_bytes - prev[1].read_bytes)
                                             / seconds, 1)}

    def servers(self) -> list[tuple[int, str]]:
        """(pid, peer name) of the local processes that serve the dataset's peers."""
        return [(p.server_pid, p.name) for p in self.peers.values() if p.server_pid is not None]

    def meta(self) -> list[dict[str, Any]]:
        """The peers found, as storage entries of meta.json."""
        return [p.to_dict() for p in self.peers.values()]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
