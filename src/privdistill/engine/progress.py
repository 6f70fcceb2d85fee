"""Progress bars (rich) with rate and ETA; silent when disabled or when stderr is not a terminal."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


class _Bar:
    def __init__(self, progress: Progress | None, task):
        self._progress, self._task = progress, task

    def advance(self, n: int = 1, **metrics) -> None:
        """Advance by n and show the metrics; a metric that is None (not measured yet) is left out."""
        if self._progress is None:
            return
        info = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in metrics.items() if v is not None)
        self._progress.update(self._task, advance=n, info=info)


class _RateColumn(TextColumn):
    def __init__(self):
        super().__init__("")

    def render(self, task):
        speed = task.finished_speed or task.speed
        from rich.text import Text

        return Text(f"{speed:.1f} it/s" if speed else "- it/s", style="progress.data.speed")


def progress_enabled(enabled: bool = True) -> bool:
    return enabled and not os.environ.get("PRIVDISTILL_NO_PROGRESS") and sys.stderr.isatty()


@contextmanager
def progress_bar(total: int, description: str, *, enabled: bool = True, completed: int = 0):
    if not progress_enabled(enabled):
        yield _Bar(None, None)
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
               _RateColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
               TextColumn("{task.fields[info]}")]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total, completed=completed, info="")
        yield _Bar(progress, task)
