"""The full-screen live view on a terminal, refreshed with each interval record.

NOTE [live view and the job's terminal]: the view draws on one stream (by
default stderr, as ``iolens run`` wants; ``iolens top`` passes stdout) and
only when that stream is a terminal. It uses the terminal's alternate screen,
so the user's scrollback is left as it was and comes back when the view
stops. Under ``iolens run`` the job shares that terminal: whatever the job
prints while the view is up lands on the alternate screen and is drawn over
at the next refresh, so it is not in the scrollback afterwards. The job's
output is never redirected or captured (its stdout and stderr stay its own);
a user who needs to read it live runs with ``--no-live``, or sends it to a
file. The view redraws only when a record arrives (no refresh thread, and
at most every MIN_REDRAW_S), and stdout and stderr are not redirected, so
iolens' own prints go straight to the terminal too.

NOTE [never hurt the job]: :meth:`LiveView.update` never raises. A failure
while drawing stops the view, restores the terminal and keeps the reason in
:attr:`LiveView.error`; the caller carries on without a view.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from iolens.live.history import DEFAULT_LENGTH, Header, History, Record

if TYPE_CHECKING:
    from rich.live import Live

MIN_REDRAW_S = 0.15
"""Records closer together than this (short intervals) are kept but not each drawn:
a refresh costs a few milliseconds of CPU, and nobody reads faster."""

# Leave the alternate screen and show the cursor: written directly when rich
# itself failed to restore the terminal.
_RESTORE = "\x1b[?1049l\x1b[?25h"


def is_terminal(stream: TextIO) -> bool:
    """True if ``stream`` is an interactive terminal (False for files, pipes, closed streams)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class LiveView:
    """Draws the view of :mod:`iolens.live.render` full screen, one refresh per record.

    ``watch`` (device -> why) and ``header`` are read at each refresh, so a
    caller may pass the recorder's own dict and notes list and the view
    follows them as they grow.
    """

    def __init__(self, watch: Mapping[str, str], header: Header | None = None, *,
                 file: TextIO | None = None, length: int = DEFAULT_LENGTH) -> None:
        self.watch = watch
        self.header = header
        self.file = file if file is not None else sys.stderr
        self.history = History(length)
        self.error: str | None = None
        """Why the view is not drawing (could not start, or a refresh failed), else None."""
        self._live: Live | None = None
        self._drawn_at = -MIN_REDRAW_S

    @property
    def active(self) -> bool:
        """True while the view is on screen."""
        return self._live is not None

    def start(self) -> bool:
        """Enter the alternate screen and draw; returns False (and sets :attr:`error`) if not."""
        if self._live is not None:
            return True
        if self.error is not None:
            return False
        try:
            from rich.console import Console  # noqa: PLC0415 - rich only when a view is drawn
            from rich.live import Live  # noqa: PLC0415

            console = Console(file=self.file)
            if not console.is_terminal or console.is_dumb_terminal:
                self.error = "not a terminal"
                return False
            live = Live(console=console, screen=True, auto_refresh=False,
                        redirect_stdout=False, redirect_stderr=False, transient=False)
            self._live = live
            live.update(self._render())
            self._drawn_at = time.monotonic()
            live.start(refresh=True)
        except Exception as exc:  # noqa: BLE001 - NOTE [never hurt the job]
            self._fail(exc)
            return False
        return True

    def update(self, record: Record) -> None:
        """Add ``record`` to the history and redraw; never raises (NOTE [never hurt the job])."""
        try:
            self.history.add(record)
            now = time.monotonic()
            if self._live is not None and now - self._drawn_at >= MIN_REDRAW_S:
                self._drawn_at = now
                self._live.update(self._render(), refresh=True)
        except Exception as exc:  # noqa: BLE001 - NOTE [never hurt the job]
            self._fail(exc)

    def stop(self) -> None:
        """Leave the alternate screen and show the cursor again; safe to call twice."""
        live, self._live = self._live, None
        if live is None:
            return
        try:
            live.stop()
        except Exception as exc:  # noqa: BLE001 - NOTE [never hurt the job]
            if self.error is None:
                self.error = f"could not stop the live view cleanly: {exc!r}"
            with contextlib.suppress(Exception):
                self.file.write(_RESTORE)
                self.file.flush()

    def _render(self) -> Any:
        from iolens.live.render import render  # noqa: PLC0415 - imports rich

        height: int | None = None
        if self._live is not None:
            console = self._live.console
            # Follow the size of the terminal drawn on (rich alone asks stdin,
            # stdout and stderr, which need not be that terminal), resizes included.
            with contextlib.suppress(OSError, ValueError, AttributeError):
                size = os.get_terminal_size(self.file.fileno())
                if size.columns > 0 and size.lines > 0:  # a new pty may say 0 x 0
                    console.size = size
            height = console.size.height
        return render(self.history, self.watch, self.header or Header(), height=height)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = f"live view stopped: {exc!r}"
        self.stop()
