"""Progress with rate and ETA, and the run's plan lines, on stderr as they happen: a rich bar on a terminal; on a
file or a pipe (`> log 2>&1`, nohup, a notebook) plain flushed lines, one when a stage starts, one at its first step,
then one every PRIVDISTILL_PROGRESS_EVERY seconds (10 by default) and one at its last. Silent with run.progress=false
or PRIVDISTILL_NO_PROGRESS."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

import rich.progress as rp
from rich.console import Console
from rich.text import Text

console = Console(stderr=True)


class _Bar:
    def __init__(self, progress: rp.Progress | None, task):
        self._progress, self._task = progress, task

    def advance(self, n: int = 1, **metrics) -> None:
        """Advance by n and show the metrics; a metric that is None (not measured yet) is left out."""
        if self._progress is None:
            return
        info = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in metrics.items() if v is not None)
        self._progress.update(self._task, advance=n, info=info)


class _RateColumn(rp.TextColumn):
    def __init__(self):
        super().__init__("")

    def render(self, task):
        speed = task.finished_speed or task.speed
        return Text(f"{speed:.1f} it/s" if speed else "- it/s", style="progress.data.speed")


def progress_enabled(enabled: bool = True) -> bool:
    return enabled and not os.environ.get("PRIVDISTILL_NO_PROGRESS")


def _interactive() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


#: seconds between two plain progress lines of one stage (PRIVDISTILL_PROGRESS_EVERY overrides it)
PLAIN_EVERY_S = 10.0


def _plain_every() -> float:
    try:
        return max(0.0, float(os.environ.get("PRIVDISTILL_PROGRESS_EVERY", PLAIN_EVERY_S)))
    except ValueError:
        return PLAIN_EVERY_S


def say(line: str, *, enabled: bool = True) -> None:
    """One line on stderr as it happens (the run's plan, a stage starting): plain and flushed on a file or a pipe."""
    if not progress_enabled(enabled):
        return
    if _interactive():
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    else:
        print(line, file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _PlainBar:
    """A progress bar as plain lines (stderr is not a terminal): the stage's start, its first step, then one line
    every `every` seconds and one at its last step, each flushed."""

    def __init__(self, total: int, description: str, completed: int = 0, every: float = PLAIN_EVERY_S):
        self.total, self.description, self.done, self.every = total, description, completed, every
        self._first, self._t0, self._last = completed, time.monotonic(), None
        resumed = f", resumed at {completed}" if completed else ""
        print(f"{description}: {total} to run{resumed}", file=sys.stderr, flush=True)

    def advance(self, n: int = 1, **metrics) -> None:
        self.done += n
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every and self.done < self.total:
            return
        self._last = now
        elapsed = now - self._t0
        rate = (self.done - self._first) / elapsed if elapsed > 0 else 0.0
        eta = f", eta {_clock((self.total - self.done) / rate)}" if rate > 0 and self.done < self.total else ""
        info = "".join(f", {k} {v:.4g}" if isinstance(v, float) else f", {k} {v}"
                       for k, v in metrics.items() if v is not None)
        pct = 100 * self.done / self.total if self.total else 100.0
        print(f"{self.description}: {self.done}/{self.total} ({pct:.0f} %), {rate:.3g}/s, {_clock(elapsed)} "
              f"elapsed{eta}{info}", file=sys.stderr, flush=True)


@contextmanager
def progress_bar(total: int, description: str, *, enabled: bool = True, completed: int = 0):
    if not progress_enabled(enabled):
        yield _Bar(None, None)
        return
    if not _interactive():
        yield _PlainBar(total, description, completed, every=_plain_every())
        return
    columns = [rp.TextColumn("[bold]{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
               rp.TaskProgressColumn(), _RateColumn(), rp.TimeElapsedColumn(), rp.TextColumn("eta"),
               rp.TimeRemainingColumn(), rp.TextColumn("{task.fields[info]}")]
    with rp.Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total, completed=completed, info="")
        yield _Bar(progress, task)
