"""DataLoader settings set from outside the job: ``iolens run --set KEY=VALUE -- CMD``.

The settings most advice is about belong to the DataLoader, which the bootstrap already
wraps (iolens.training._hooks): with ``--set`` its ``__init__`` takes the values given
instead of the job's own, for every loader the job makes or for those whose dataset class
``--set-loader`` names, so that a recommendation can be tried with no code change. What is
set travels to the job in the environment (``IOLENS_SET``, JSON), is checked here before
the job starts, and is recorded with each loader's settings (``set``) and in meta.json.

Pure and light: imported inside the training process.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

ENV = "IOLENS_SET"
CONTEXTS = ("fork", "spawn", "forkserver")
KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory",
        "multiprocessing_context")
"""The DataLoader keyword arguments ``--set`` takes."""
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
NEEDS_WORKERS = ("prefetch_factor", "persistent_workers", "multiprocessing_context")
"""Settings torch takes only from a loader with workers (num_workers > 0)."""


class SetError(ValueError):
    """A ``--set`` item that cannot be applied: the message says why, for the user."""


def parse(items: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items as DataLoader keyword arguments, checked; SetError if any is
    unknown, malformed, out of range, or contradicts another."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise SetError(f"--set {item!r}: expected KEY=VALUE, e.g. num_workers=4 (the "
                           "command to run goes after --)")
        if key not in KEYS:
            raise SetError(f"--set {key}: not a DataLoader setting iolens can set; one of "
                           + ", ".join(KEYS))
        if key in out:
            raise SetError(f"--set {key} is given twice")
        out[key] = _value(key, raw)
    if out.get("num_workers") == 0:
        bad = [k for k in NEEDS_WORKERS if k in out and out[k] not in (None, False)]
        if bad:
            raise SetError(f"--set {bad[0]}={text(out[bad[0]])} with num_workers=0: torch "
                           "takes it only from a loader with workers")
    return out


def _value(key: str, raw: str) -> Any:
    if key in ("num_workers", "prefetch_factor"):
        if not (raw.isascii() and raw.isdigit()):
            raise SetError(f"--set {key}={raw}: expected a whole number")
        n = int(raw)
        low = 0 if key == "num_workers" else 1
        if not low <= n <= 1024:
            raise SetError(f"--set {key}={n}: expected {low} to 1024")
        return n
    if key in ("persistent_workers", "pin_memory"):
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise SetError(f"--set {key}={raw}: expected true or false")
    if raw not in CONTEXTS:
        raise SetError(f"--set {key}={raw}: expected one of " + ", ".join(CONTEXTS))
    return raw


def text(v: Any) -> str:
    """A setting's value as ``--set`` takes it."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def line(settings: Mapping[str, Any]) -> str:
    """The ``--set`` arguments that give ``settings``."""
    return " ".join(f"--set {k}={text(v)}" for k, v in settings.items())


def to_env(settings: Mapping[str, Any], loaders: Iterable[str] = ()) -> str:
    return json.dumps({"set": dict(settings), "loaders": list(loaders)})


def from_env(value: str | None) -> tuple[dict[str, Any], list[str]]:
    """The settings and loader names an ``IOLENS_SET`` value holds (nothing if it is not
    one: a damaged value sets nothing)."""
    if not value:
        return {}, []
    try:
        data = json.loads(value)
        got = parse(f"{k}={text(v)}" for k, v in dict(data.get("set") or {}).items())
        names = [str(n) for n in data.get("loaders") or []]
    except (ValueError, TypeError, AttributeError):
        return {}, []
    return got, names


UNSET = {"prefetch_factor": None, "persistent_workers": False,
         "multiprocessing_context": None}
"""What a loader without workers must have for these (torch refuses anything else)."""


def merged(settings: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """The loader's keyword arguments ``given`` (its own, bound by name) with ``settings``
    applied. ``num_workers=0`` set on a loader whose code asks for prefetch_factor (or
    persistent workers, or a start method) drops those, as the code change would have to;
    SetError where a setting given needs workers the loader does not have (torch rejects
    it)."""
    out = dict(given)
    out.update(settings)
    if not int(out.get("num_workers") or 0):
        bad = [k for k in NEEDS_WORKERS if k in settings and settings[k] not in (None, False)]
        if bad:
            raise SetError(
                f"--set {bad[0]}={text(settings[bad[0]])}: this DataLoader has "
                "num_workers=0, and torch takes it only from a loader with workers; add "
                "--set num_workers=N, or --set-loader NAME for the loaders that have them")
        if "num_workers" in settings:
            for k, v in UNSET.items():
                if k in out and k not in settings:
                    out[k] = v
    return out


def names_of(dataset: Any) -> set[str]:
    """The names ``--set-loader`` matches for a loader of ``dataset``: its class's name,
    qualified name and module path, and those of the dataset a wrapper holds (a Subset,
    a ConcatDataset's first)."""
    out: set[str] = set()
    for _ in range(4):
        cls = type(dataset)
        out |= {cls.__name__, cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}"}
        inner = getattr(dataset, "dataset", None)
        if inner is None:
            many = getattr(dataset, "datasets", None)
            inner = many[0] if isinstance(many, list | tuple) and many else None
        if inner is None:
            break
        dataset = inner
    return out
