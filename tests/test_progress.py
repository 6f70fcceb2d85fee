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


def test_plain_lines_when_stderr_is_not_a_terminal(capsys):
    """Issue 64: on a file or a pipe a stage says it starts, its first step, one line every `every` seconds and its
    last step, as plain lines."""
    from privdistill.engine.progress import _PlainBar

    bar = _PlainBar(5, "student", every=3600)
    for _ in range(5):
        bar.advance(1, loss=0.5, acc=None)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "student: 5 to run"
    assert [line.split(",")[0] for line in lines[1:]] == ["student: 1/5 (20 %)", "student: 5/5 (100 %)"]
    assert "loss 0.5" in lines[-1] and "acc" not in lines[-1] and "elapsed" in lines[-1]
    every = _PlainBar(3, "teachers", completed=1, every=0)
    every.advance(1)
    every.advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["teachers: 3 to run", "teachers: 2/3 (67 %)",
                                                      "teachers: 3/3 (100 %)"]
    assert lines[0] == "teachers: 3 to run, resumed at 1"


def test_plan_and_progress_reach_a_pipe_as_they_happen(tiny_npz, tmp_path):
    """Issue 64: under a redirect a 5.5-minute DP-SGD run wrote nothing before it was killed. Read through a pipe,
    the plan line and the first epoch's line arrive while the run is still training (then it is killed)."""
    import os
    import subprocess
    import sys
    import time

    args = [sys.executable, "-m", "privdistill", "dpsgd", "-d", f"npz:{tiny_npz}", "-e", "8", "--recipe", "paper",
            "--run-dir", str(tmp_path / "run"), "--device", "cpu", "--precision", "fp32"]
    for item in ("dpsgd.epochs=30", "dpsgd.batch_size=100", "dpsgd.model=small-cnn", "dpsgd.lr=0.5"):
        args += ["--set", item]
    env = {k: v for k, v in os.environ.items() if k != "PRIVDISTILL_NO_PROGRESS"}
    env["PRIVDISTILL_PROGRESS_EVERY"] = "0"
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line.rstrip("\n"))
            if line.startswith("DP-SGD epochs: 1/30"):
                break
        running = proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    text = "\n".join(seen)
    assert running, f"the lines came only as the run ended:\n{text}"
    assert any(s.startswith("plan: dpsgd on npz:") for s in seen) and "  will spend: DP-SGD (Opacus)" in text
    assert any(s.startswith("  budget: target epsilon 8 under strict accounting") for s in seen)
    assert seen[-1].startswith("DP-SGD epochs: 1/30 (3 %)"), text
    assert seen.index("DP-SGD epochs: 30 to run") > max(i for i, s in enumerate(seen) if s.startswith("plan:"))
