"""What a sink of interval records is, and the fan-out that feeds several of them.

NOTE [a sink never hurts the job]: records.jsonl is the primary record; every
other sink (the live view, CSV, TensorBoard) is a copy. A sink that raises
while writing or closing is closed and dropped for the rest of the run, with
one note saying why (into meta.json through the recorder's notes) and one
warning line; the other sinks and the recording go on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from iolens._errors import IolensError


class Sink(Protocol):
    """Takes each interval record as it is written, then is closed once."""

    def write(self, record: Mapping[str, Any]) -> None:
        """Take one record; raise when it cannot be written (the sink is then dropped)."""

    def close(self) -> None:
        """Flush and release; called once, also after a failed write."""


class SinkError(IolensError):
    """An output cannot start (a bad path, a port in use, a missing package): one line
    saying why."""


class CallbackSink:
    """A function as a sink (the live view's ``update``), with an optional closer."""

    def __init__(self, write: Callable[[Mapping[str, Any]], None],
                 close: Callable[[], None] | None = None) -> None:
        self._write = write
        self._close = close

    def write(self, record: Mapping[str, Any]) -> None:
        self._write(record)

    def close(self) -> None:
        if self._close is not None:
            self._close()


class FanOut:
    """Hands each record to every sink in turn, each one's failure caught on its own.

    ``notes`` is the list that ends up in meta.json (the recorder's); ``warn``
    prints one line. See NOTE [a sink never hurts the job].
    """

    def __init__(self, notes: list[str], warn: Callable[[str], None]) -> None:
        self.notes = notes
        self.warn = warn
        self._sinks: dict[str, Sink] = {}

    def add(self, name: str, sink: Sink) -> None:
        """Feed ``sink`` from now on; ``name`` says which one in notes (``--csv out.csv``)."""
        self._sinks[name] = sink

    @property
    def names(self) -> list[str]:
        """The sinks still fed."""
        return list(self._sinks)

    def __call__(self, record: Mapping[str, Any]) -> None:
        for name, sink in list(self._sinks.items()):
            try:
                sink.write(record)
            except Exception as exc:  # noqa: BLE001 - NOTE [a sink never hurts the job]
                self._drop(name, f"{name} stopped: {_reason(exc)}; the run goes on without it")

    def close(self, name: str | None = None) -> None:
        """Close one sink (``name``) or all of them; a failure to close is noted."""
        for n in [name] if name is not None else list(self._sinks):
            sink = self._sinks.pop(n, None)
            if sink is None:
                continue
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001 - NOTE [a sink never hurts the job]
                self.note(f"{n} could not be closed cleanly: {_reason(exc)}")

    def _drop(self, name: str, message: str) -> None:
        sink = self._sinks.pop(name, None)
        self.note(message)
        if sink is not None:
            with contextlib.suppress(Exception):
                sink.close()

    def note(self, message: str) -> None:
        """Record ``message`` in the notes and warn with it."""
        self.notes.append(message)
        with contextlib.suppress(Exception):
            self.warn(message)


def number(value: Any) -> float | None:
    """A record's figure as a float; None for what is not a number (a bool, a string,
    null), which a sink leaves out."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc) or type(exc).__name__
