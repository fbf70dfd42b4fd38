"""Progress of long work: data downloads and conversions, image builds, cluster creation.

Work that takes minutes must show that it moves, in a form that suits where it is read. On a
terminal, one line is redrawn in place: click's progress bar (percent, time left, and the
amount and rate beside it) when the total is known, the latest status line otherwise. Anywhere
else (a log file, CI, a worker's log, a pipe) a redrawn line would pile up as control
characters, so a plain line is printed every :data:`INTERVAL_S` seconds instead. Everything goes
to stderr: stdout stays for results (``-o json``). Work that ends within :data:`DELAY_S` shows
nothing, so quick steps stay quiet.

:class:`Progress` counts bytes or lines towards a total; :class:`StatusLines` shows the status
messages of work that has no total (a cluster being created, an image being built) and is the
``progress(message, transient=False)`` callback that :mod:`mlbench.cloud` reports to.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO
from collections.abc import Callable

import click

#: Seconds between progress lines when stderr is not a terminal.
INTERVAL_S = 5.0
#: Work that ends sooner than this shows no progress at all.
DELAY_S = 1.0


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def fmt_amount(value: float, unit: str) -> str:
    """'45.2 MB' for bytes (decimal units, as download sizes are quoted), '1,234 lines' else."""
    if unit == "B":
        for name in ("B", "kB", "MB", "GB"):
            if abs(value) < 1000:
                return f"{value:.0f} {name}" if name == "B" else f"{value:.1f} {name}"
            value /= 1000
        return f"{value:.1f} TB"
    return f"{value:,.0f} {unit}"


def fmt_seconds(seconds: float) -> str:
    """'0:01:05' (h:mm:ss), the form of time left and time taken."""
    minutes, sec = divmod(round(max(0.0, seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}"


class Progress:
    """Progress of counted work: ``update(done)`` with the amount done so far (bytes or lines).

    ``rates`` False leaves out the rate and the time left, for steps of very unequal length (an
    image build). Use as a context manager; leaving it prints the final line (once anything was
    shown).
    """

    def __init__(self, label: str, total: float | None = None, unit: str = "B",
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 rates: bool = True):
        self.label = label
        self.total = total if total and total > 0 else None
        self.unit = unit
        self.rates = rates
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _is_terminal(self.stream)
        self.clock = clock
        self.started = clock()
        self.done = 0.0
        self.note = ""
        self.shown = False
        self._last_line = self.started
        self._bar: Any = None
        self._bar_pos = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(ok=exc_type is None)

    def rate(self) -> float | None:
        """Amount per second since the start (None before anything was done, or without rates)."""
        elapsed = self.clock() - self.started
        if not self.rates:
            return None
        return self.done / elapsed if elapsed > 0 and self.done > 0 else None

    def describe(self) -> str:
        """'45.2 MB of 170.5 MB (26%), 5.1 MB/s, 0:00:24 left' (what is known of it)."""
        parts = [fmt_amount(self.done, self.unit)]
        if self.total:
            parts[0] += f" of {fmt_amount(self.total, self.unit)} ({100 * self.done / self.total:.0f}%)"
        rate = self.rate()
        if rate:
            parts.append(f"{fmt_amount(rate, self.unit)}/s")
            if self.total and self.done < self.total:
                parts.append(f"{fmt_seconds((self.total - self.done) / rate)} left")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)

    def advance(self, amount: float, note: str | None = None) -> None:
        self.update(self.done + amount, note)

    def update(self, done: float, note: str | None = None) -> None:
        """``done`` of the total is done now; ``note`` (e.g. a line count) is shown beside it."""
        self.done = done
        if note is not None:
            self.note = note
        now = self.clock()
        if now - self.started < DELAY_S:
            return
        if self.tty:
            self._draw()
        elif now - self._last_line >= INTERVAL_S:
            self._line(f"{self.label}: {self.describe()}")
            self._last_line = now

    def _draw(self) -> None:
        if self.total is None:  # no bar without a total: redraw the status line itself
            click.echo(f"\r\033[K{self.label}: {self.describe()}", nl=False, file=self.stream)
            self.shown = True
            return
        if self._bar is None:
            self._bar = click.progressbar(length=int(self.total), label=self.label, file=self.stream,
                                          show_percent=True, show_eta=self.rates, show_pos=False,
                                          item_show_func=self._detail)
            self._bar.__enter__()
            self.shown = True
        step = int(min(self.done, self.total)) - self._bar_pos
        self._bar.update(step, current_item=self.note)
        self._bar_pos += step

    def _detail(self, _item: Any) -> str:
        rate = self.rate()
        amount = f"{fmt_amount(self.done, self.unit)} of {fmt_amount(self.total or 0, self.unit)}"
        return ", ".join(p for p in (amount, rate and f"{fmt_amount(rate, self.unit)}/s", self.note) if p)

    def _line(self, text: str) -> None:
        click.echo(text, file=self.stream)
        self.shown = True

    def close(self, ok: bool = True) -> None:
        """End the bar; say how long the work took if progress was shown."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
        elif self.tty and self.shown:
            click.echo("", file=self.stream)
        if self.shown and ok:
            elapsed = self.clock() - self.started
            rate = self.rate()
            speed = f" ({fmt_amount(rate, self.unit)}/s)" if rate else ""
            note = f", {self.note}" if self.note else ""
            self._line(f"{self.label}: {fmt_amount(self.done, self.unit)}{note} in "
                       f"{fmt_seconds(elapsed)}{speed}")


class StatusLines:
    """Status messages of work without a total: ``progress(message, transient=False)``.

    A message is a line of its own. A transient one (a poll tick: "cluster: PROVISIONING
    (2m10s)", the latest output line of a build) is redrawn in place on a terminal; elsewhere it
    is printed when its status changes or every :data:`INTERVAL_S` seconds.
    """

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _is_terminal(self.stream)
        self.clock = clock
        self.last_status = ""
        self.last_time = float("-inf")
        self.open_line = False

    def __call__(self, message: str, transient: bool = False) -> None:
        if not transient:
            self.done()
            click.echo(message, file=self.stream)
        elif self.tty:
            click.echo(f"\r\033[K{message}", nl=False, file=self.stream)
            self.open_line = True
        else:
            status = message.rsplit(" (", 1)[0]  # without the elapsed time
            if status != self.last_status or self.clock() - self.last_time >= INTERVAL_S:
                click.echo(message, file=self.stream)
                self.last_status, self.last_time = status, self.clock()

    def done(self) -> None:
        """End a redrawn line, so that what follows starts on a line of its own."""
        if self.open_line:
            click.echo("", file=self.stream)
            self.open_line = False
