"""iostat's ``-x -d`` layout, text and JSON, column for column (docs/metrics.md, section 1)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from iolens.core.rates import DeviceRates


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the extended report."""

    title: str
    """Header text (the kB spelling)."""
    title_mb: str
    """Header text with ``-m``."""
    width: int
    """printf width of the value (``%W.2f``)."""
    attr: str
    """DeviceRates attribute holding the value in kB units."""
    attr_mb: str
    """Attribute with ``-m``."""
    json_key: str
    """iostat's JSON key (``-o JSON``)."""
    json_key_mb: str
    """JSON key with ``-m``."""


def _col(title: str, width: int, attr: str, json_key: str | None = None) -> Column:
    key = json_key if json_key is not None else title
    if "kB/s" in title:
        mb_attr = attr.replace("kB_s", "MB_s")
        return Column(title, title.replace("kB/s", "MB/s"), width, attr, mb_attr,
                      key, key.replace("kB/s", "MB/s"))
    return Column(title, title, width, attr, attr, key, key)


def _group(x: str) -> list[Column]:
    return [
        _col(f"{x}/s", 7, f"{x}_s"),
        _col(f"{x}kB/s", 9, f"{x}kB_s"),
        _col(f"{x}rqm/s", 8, f"{x}rqm_s"),
        _col(f"%{x}rqm", 6, f"{x}rqm_pct", f"{x}rqm"),
        _col(f"{x}_await", 7, f"{x}_await"),
        _col(f"{x}areq-sz", 8, f"{x}areq_sz"),
    ]


COLUMNS: tuple[Column, ...] = (
    *_group("r"),
    *_group("w"),
    *_group("d"),
    _col("f/s", 7, "f_s"),
    _col("f_await", 7, "f_await"),
    _col("aqu-sz", 7, "aqu_sz"),
    _col("%util", 6, "util", "util"),
)

# iostat's JSON lists the values grouped by kind rather than by column.
_JSON_ORDER = (
    "r/s", "w/s", "d/s", "f/s", "rkB/s", "wkB/s", "dkB/s", "rrqm/s", "wrqm/s", "drqm/s",
    "rrqm", "wrqm", "drqm", "r_await", "w_await", "d_await", "f_await",
    "rareq-sz", "wareq-sz", "dareq-sz", "aqu-sz", "util",
)
_BY_JSON_KEY = {c.json_key: c for c in COLUMNS}
JSON_COLUMNS: tuple[Column, ...] = tuple(_BY_JSON_KEY[k] for k in _JSON_ORDER)


def header_line(megabytes: bool = False) -> str:
    """The ``Device ...`` title line."""
    titles = "".join(" %*s" % (c.width, c.title_mb if megabytes else c.title) for c in COLUMNS)
    return "%-13s" % "Device" + titles


def device_line(rates: DeviceRates, megabytes: bool = False) -> str:
    """One device's values, ``%-13s`` then `` %W.2f`` per column."""
    values = "".join(
        " %*.2f" % (c.width, getattr(rates, c.attr_mb if megabytes else c.attr)) for c in COLUMNS
    )
    return "%-13s" % rates.device + values


def text_report(rates: Iterable[DeviceRates], megabytes: bool = False,
                timestamp: str | None = None) -> str:
    """A whole report block as iostat prints it, ending with its two blank lines."""
    lines = [] if timestamp is None else [timestamp]
    lines.append(header_line(megabytes))
    lines.extend(device_line(r, megabytes) for r in rates)
    return "\n".join(lines) + "\n\n\n"


def json_device(rates: DeviceRates, megabytes: bool = False) -> str:
    """One device as iostat's JSON object, numbers written with two decimals as iostat does."""
    parts = [f'"disk_device": {json.dumps(rates.device)}']
    for c in JSON_COLUMNS:
        key = c.json_key_mb if megabytes else c.json_key
        value = getattr(rates, c.attr_mb if megabytes else c.attr)
        parts.append(f'"{key}": {value:.2f}')
    return "{" + ", ".join(parts) + "}"


def json_report(rates: Iterable[DeviceRates], megabytes: bool = False,
                timestamp: str | None = None) -> str:
    """One report as a single-line JSON object: ``{"timestamp": ..., "disk": [...]}``."""
    head = "" if timestamp is None else f'"timestamp": {json.dumps(timestamp)}, '
    disks = ", ".join(json_device(r, megabytes) for r in rates)
    return "{" + head + '"disk": [' + disks + "]}"
