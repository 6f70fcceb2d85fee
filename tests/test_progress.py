"""Progress bars show the metrics they are given and leave out those not measured yet (None)."""

import io

from rich.console import Console
from rich.progress import Progress, TextColumn

from privdistill.engine.progress import _Bar


def test_advance_shows_measured_metrics_and_skips_none():
    progress = Progress(TextColumn("{task.fields[info]}"), console=Console(file=io.StringIO()))
    task = progress.add_task("t", total=3, info="")
    bar = _Bar(progress, task)
    bar.advance(1, loss=0.5, acc=None)
    assert progress.tasks[0].fields["info"] == "loss 0.5" and progress.tasks[0].completed == 1
    bar.advance(1, loss=0.25, acc=0.9)
    assert progress.tasks[0].fields["info"] == "loss 0.25  acc 0.9"
    _Bar(None, None).advance(1, acc=None)  # a disabled bar ignores everything
