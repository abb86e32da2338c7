"""The columns of the maps of figures a record names: each device's, each role's, each
storage entry's, each rank's and each GPU's, and the machine's CPU (NOTE [columns] in
iolens/analysis/columns/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from iolens.analysis.columns.stage import _dict, _train, added, amount


@dataclass
class DeviceLoad:
    """One device over a set of intervals, time-weighted as iostat would over the whole span."""

    name: str
    secs: float = 0.0
    util: float = 0.0
    r_s: float = 0.0
    w_s: float = 0.0
    rkB_s: float = 0.0
    wkB_s: float = 0.0
    r_await: float = 0.0
    w_await: float = 0.0
    aqu_sz: float = 0.0

    @property
    def rareq_kib(self) -> float:
        return self.rkB_s / self.r_s if self.r_s else 0.0

    @property
    def rMB_s(self) -> float:
        return self.rkB_s / 1024

    @property
    def wMB_s(self) -> float:
        return self.wkB_s / 1024


@dataclass(frozen=True)
class DeviceColumns:
    """One device's figures of each interval that has them, by column: seconds, the
    figures times seconds (I/O counts), and the awaits times their I/O counts (each as
    the records hold it, finite and non-negative, else 0), with the index of each
    interval among the run's."""

    name: str
    at: tuple[int, ...]
    secs: tuple[float, ...]
    util: tuple[float, ...]
    """%util as recorded (the others below are over the interval's seconds)."""
    peak: tuple[float, ...]
    """The highest %util in the interval: a long run's bucket's ``util_max`` (a
    checkpoint's seconds vanish in its mean), else its %util."""
    rkb_s: tuple[float, ...]
    """kB read and written a second, as recorded."""
    wkb_s: tuple[float, ...]
    util_s: tuple[float, ...]
    rkb: tuple[float, ...]
    wkb: tuple[float, ...]
    aqu_s: tuple[float, ...]
    r_ios: tuple[float, ...]
    w_ios: tuple[float, ...]
    r_wait: tuple[float, ...]
    w_wait: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[str, DeviceColumns]:
        """Each device's columns, in the order the records name them."""
        return _named(cls, records, lambda rec: rec.get("devices"))

    @staticmethod
    def _entry(d: dict[str, Any], s: float) -> tuple[Any, ...]:
        ri, wi = amount(d, "r_s") * s, amount(d, "w_s") * s
        util, rkb, wkb = amount(d, "util"), amount(d, "rkB_s"), amount(d, "wkB_s")
        return (util, amount(d, "util_max") if "util_max" in d else util, rkb, wkb, util * s,
                rkb * s, wkb * s, amount(d, "aqu_sz") * s, ri, wi, amount(d, "r_await") * ri,
                amount(d, "w_await") * wi)

    def load(self, within: Container[int] | None = None) -> DeviceLoad:
        """The device over all its intervals, or those of the run's intervals ``within``
        (the sums a loop over their records makes, in the same order: a test holds them
        to one)."""
        if within is None:
            def col(c: tuple[float, ...]) -> Iterable[float]:
                return c
        else:
            keep = [k for k, i in enumerate(self.at) if i in within]

            def col(c: tuple[float, ...]) -> Iterable[float]:
                return (c[k] for k in keep)
        out = DeviceLoad(self.name)
        out.secs = secs = added(col(self.secs))
        if secs > 0:
            r_ios, w_ios = added(col(self.r_ios)), added(col(self.w_ios))
            out.util, out.rkB_s = added(col(self.util_s)) / secs, added(col(self.rkb)) / secs
            out.wkB_s, out.aqu_sz = added(col(self.wkb)) / secs, added(col(self.aqu_s)) / secs
            out.r_s, out.w_s = r_ios / secs, w_ios / secs
            out.r_await = added(col(self.r_wait)) / r_ios if r_ios else 0.0
            out.w_await = added(col(self.w_wait)) / w_ios if w_ios else 0.0
        return out


@dataclass(frozen=True)
class RoleColumns:
    """One role's figures (the training process, its workers, a cache copier ...) of
    each interval that has it, by column: seconds, the most processes, and the CPU and the
    bytes times seconds (each as the records hold it, finite and non-negative, else 0)."""

    name: str
    at: tuple[int, ...]
    secs: tuple[float, ...]
    pids: tuple[float, ...]
    cpu: tuple[float, ...]
    """%CPU times seconds."""
    read: tuple[float, ...]
    write: tuple[float, ...]
    rchar: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[str, RoleColumns]:
        """Each role's columns, in the order the records name the roles."""
        return _named(cls, records, lambda rec: _dict(rec.get("job"), "roles"))

    @staticmethod
    def _entry(d: dict[str, Any], s: float) -> tuple[Any, ...]:
        return (amount(d, "pids"), amount(d, "cpu_pct") * s, amount(d, "read_bytes_s") * s,
                amount(d, "write_bytes_s") * s, amount(d, "rchar_s") * s)


@dataclass(frozen=True)
class StoreColumns:
    """One storage entry's figures (a FUSE mount's, a network store's peer) of each
    interval that has it, by column, with the index of each interval among the run's: the
    requests waiting on the FUSE connection (None where not read), and the connections,
    new connections and bytes received a second (as the records hold them, finite and
    non-negative, else 0)."""

    name: str
    at: tuple[int, ...]
    secs: tuple[float, ...]
    waiting: tuple[float | None, ...]
    connections: tuple[float, ...]
    new_connections_s: tuple[float, ...]
    rx_bytes_s: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[str, StoreColumns]:
        """Each storage entry's columns, in the order the records name them."""
        return _named(cls, records, lambda rec: rec.get("storage"))

    @staticmethod
    def _entry(d: dict[str, Any], s: float) -> tuple[Any, ...]:
        return (None if d.get("waiting") is None else amount(d, "waiting"),
                amount(d, "connections"), amount(d, "new_connections_s"),
                amount(d, "rx_bytes_s"))

    def rows(self, within: Container[int]) -> list[int]:
        """The positions (in these columns) of the intervals ``within`` (run indices)."""
        return [k for k, i in enumerate(self.at) if i in within]

    def mean(self, column: str, rows: Sequence[int]) -> float | None:
        """``column`` over ``rows``, weighted by their seconds, the intervals without it
        left out; None where none has it or they last no time."""
        col: Sequence[float | None] = getattr(self, column)
        vals = [(x, self.secs[k]) for k in rows if (x := col[k]) is not None]
        secs = sum(s for _, s in vals)
        return sum(x * s for x, s in vals) / secs if secs else None


@dataclass(frozen=True)
class RankColumns:
    """One rank's figures (a multi-rank job's, as its own loop timed them) of each
    interval that has it, by column: the batches and the seconds of data wait and of step
    (as the records hold them, finite and non-negative, else 0)."""

    name: str
    at: tuple[int, ...]
    secs: tuple[float, ...]
    batches: tuple[float, ...]
    wait_s: tuple[float, ...]
    step_s: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[str, RankColumns]:
        """Each rank's columns, in the order the records name the ranks."""
        return _named(cls, records, lambda rec: _train(rec).get("ranks"))

    @staticmethod
    def _entry(d: dict[str, Any], s: float) -> tuple[Any, ...]:
        return amount(d, "batches"), amount(d, "data_wait_s"), amount(d, "step_s")


@dataclass(frozen=True)
class CpuColumns:
    """The machine's CPU time shares (%) of each interval that recorded them, by column,
    with the index of each interval among the run's (as the records hold them, finite and
    non-negative, else 0)."""

    at: tuple[int, ...]
    user: tuple[float, ...]
    system: tuple[float, ...]
    iowait: tuple[float, ...]
    idle: tuple[float, ...]
    steal: tuple[float, ...]

    SHARES = ("user", "system", "iowait", "idle", "steal")

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> CpuColumns:
        cols: dict[str, list[Any]] = {name: [] for name in ("at", *cls.SHARES)}
        for i, rec in enumerate(records):
            c = rec.get("cpu") if isinstance(rec, dict) else None
            if not isinstance(c, dict) or not c:
                continue
            cols["at"].append(i)
            for name in cls.SHARES:
                cols[name].append(amount(c, name))
        return cls(**{k: tuple(v) for k, v in cols.items()})


@dataclass(frozen=True)
class GpuColumns:
    """One GPU's figures in each interval NVML answered for it, by column: its %util and
    its memory used and in all (bytes), with the index of each interval among the run's
    (as the records hold them, finite and non-negative, else 0)."""

    index: int
    at: tuple[int, ...]
    util: tuple[float, ...]
    mem_used: tuple[float, ...]
    mem_total: tuple[float, ...]

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> dict[int, GpuColumns]:
        """Each GPU's columns, by its index, in the order the records name them; an
        entry without its %util (NVML failed) is left out."""
        cols: dict[int, tuple[list[int], list[float], list[float], list[float]]] = {}
        for i, rec in enumerate(records):
            gpus = rec.get("gpu") if isinstance(rec, dict) else None
            for g in gpus if isinstance(gpus, list) else ():
                if not isinstance(g, dict) or g.get("util_pct") is None:
                    continue
                c = cols.setdefault(int(amount(g, "index")), ([], [], [], []))
                c[0].append(i)
                c[1].append(amount(g, "util_pct"))
                c[2].append(amount(g, "mem_used_bytes"))
                c[3].append(amount(g, "mem_total_bytes"))
        return {k: cls(k, tuple(at), tuple(util), tuple(used), tuple(total))
                for k, (at, util, used, total) in cols.items()}


def _named(cls: Any, records: Sequence[dict[str, Any]],
           maps: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """The columns of class ``cls`` of each name of the maps ``maps`` finds in a record, in
    the order the records name them: ``at`` (the interval's index), ``secs`` (its seconds)
    and, in the order of the class's fields after them, the entries its ``_entry`` makes of
    the name's figures in each interval that has them."""
    rows: dict[str, list[tuple[Any, ...]]] = {}
    entry = cls._entry
    for i, rec in enumerate(records):
        named = maps(rec) if isinstance(rec, dict) else None
        if not isinstance(named, dict) or not named:
            continue
        s = amount(rec, "interval_s")
        for name, d in named.items():
            if not isinstance(d, dict):
                continue
            have = rows.get(name)
            if have is None:
                have = rows[name] = []
            have.append((i, s, *entry(d, s)))
    return {name: cls(name, *zip(*have, strict=True)) for name, have in rows.items()}
