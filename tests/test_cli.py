import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fabricate import write_cifar10
from privdistill.cli import get_app

runner = CliRunner()


def test_help_lists_the_commands():
    result = runner.invoke(get_app(), ["--help"])
    assert result.exit_code == 0
    for command in ("data", "train", "eval", "models"):
        assert command in result.output


def test_help_starts_without_torch_or_the_accountant():
    # Imported on every command line, they took most of `privdistill --help`'s 9 s on a shared 2-core CPU (now 2 s).
    code = ("import sys\nfrom privdistill.cli import main\nsys.argv = ['privdistill', '--help']\ntry:\n    main()\n"
            "except SystemExit:\n    pass\nprint(sorted(m for m in ('torch', 'dp_accounting', 'scipy.stats') if m in "
            "sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "dgd" in proc.stdout, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[]", proc.stderr


def test_data_lists_where_each_dataset_is(data_root):
    write_cifar10(data_root)
    result = runner.invoke(get_app(), ["data", "--data-root", str(data_root), "--no-verify"])
    assert result.exit_code == 0, result.output
    assert "cifar10" in result.output and "ready" in result.output and "missing" in result.output


def test_train_record_and_eval(tiny_npz, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = ["train", "baseline", "--dataset", f"npz:{tiny_npz}", "--set", "baseline.model=small-cnn",
             "--set", "baseline.epochs=3", "--set", "baseline.batch_size=32", "--precision", "fp32"]
    result = runner.invoke(get_app(), [*train, "--run-dir", "run", "--record"])
    assert result.exit_code == 0, result.output
    assert "Reused the cached baseline stage" not in result.output
    again = runner.invoke(get_app(), [*train, "--run-dir", "run-again"])  # same stage key: the cache answers
    assert again.exit_code == 0, again.output
    notice = " ".join(again.output.split())  # rich wraps lines at the terminal width
    assert "Reused the cached baseline stage" in notice and "no training ran now" in notice
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["method"] == "baseline" and summary["epsilon_strict"] is None and summary["delta"] is None
    assert summary["test_accuracy"] > 0.5
    recorded = tmp_path / "results" / "quick" / "baseline-npz-tiny.json"
    assert json.loads(recorded.read_text())["test_accuracy"] == summary["test_accuracy"]
    result = runner.invoke(get_app(), ["eval", "run", "--device", "cpu"])
    assert result.exit_code == 0 and f"accuracy {summary['test_accuracy']:.4f}" in result.output
    from fabricate import write_npz

    result = runner.invoke(get_app(), ["eval", "run", "--weights", "nosuch"])
    assert "no nosuch.safetensors; weights in it: model" in str(result.exception)
    tiny = dict(np.load(tiny_npz))  # the same images, every test label moved to the next class: the model is wrong
    np.savez(tmp_path / "shifted.npz", **{**tiny, "y_test": (tiny["y_test"] + 1) % 10})
    result = runner.invoke(get_app(), ["eval", "run", "--device", "cpu", "--dataset", f"npz:{tmp_path}/shifted.npz"])
    assert result.exit_code == 0 and "warning:" in result.output and "chance" in " ".join(result.output.split())
    rgb = write_npz(tmp_path / "rgb.npz", n=40, num_classes=4, channels=3)
    result = runner.invoke(get_app(), ["eval", "run", "--device", "cpu", "--dataset", f"npz:{rgb}"])
    assert "built for other data" in str(result.exception) and "in_channels 1 (data: 3)" in str(result.exception)


def test_user_errors_print_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """Each user error is one line on stderr and exit status 2, never a traceback. The cases run in this process
    through the entry point's `main()` (a new interpreter costs seconds of imports each); the first also runs as
    `python -m privdistill`, the way a user meets it."""
    from privdistill.cli import main

    cases = ((["train", "baseline", "--dataset", "imagenet"], "unknown dataset"),
             (["train", "baseline", "--dataset", "mnist", "--set", "baseline.lr=0"], "lr must be > 0"),
             (["eval", str(tmp_path)], "not a run directory"),
             (["bench", "report", "--results", str(tmp_path / "none")], "no results directory"),
             (["train", "baseline", "--dataset", "mnist", "--run-dir", str(tmp_path / "typo"), "--resume"],
              "--resume needs the --run-dir of an earlier run"),
             (["train", "baseline", "--dataset", "mnist", "--device", "mps"], "not supported"),
             (["teachers", "train", "-n", "0"], "Invalid value for '--num-teachers'"),
             (["teachers", "train", "--laplace-scale", "-1"], "--laplace-scale must be > 0"))
    args, message = cases[0]
    proc = subprocess.run([sys.executable, "-m", "privdistill", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

    monkeypatch.setenv("PRIVDISTILL_KEEP_FREED_MEMORY", "0")  # main() would tune this test process's malloc
    for args, message in cases:
        monkeypatch.setattr(sys, "argv", ["privdistill", *args])
        with pytest.raises(SystemExit) as exit_:
            main()
        stderr = capsys.readouterr().err
        assert exit_.value.code == 2, (args, stderr)
        assert message in stderr and "Traceback" not in stderr, (args, stderr)


def test_error_text_in_brackets_and_long_dataset_names_print_as_written(tmp_path, monkeypatch, capsys):
    """Issue 64: "'value_range' ([lo, hi], ..." lost its brackets to rich's markup, and a dataset name wrapped in a
    table title read as another range ("?range=0,1" / "6: ...")."""
    import numpy as np

    from privdistill.cli import main

    monkeypatch.setenv("PRIVDISTILL_KEEP_FREED_MEMORY", "0")
    monkeypatch.setattr(sys, "argv", ["privdistill", "data", "inspect", f"npz:{tmp_path / 'none.npz'}"])
    with pytest.raises(SystemExit):
        main()
    assert "'value_range' ([lo, hi], for pixels" in capsys.readouterr().err
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "digits.npz", x=rng.integers(0, 17, (40, 8, 8)), y=np.arange(40) % 4)
    result = runner.invoke(get_app(), ["data", "inspect", f"npz:{tmp_path / 'digits.npz'}?range=0,16"])
    assert result.exit_code == 0, result.output
    assert "npz:" + str(tmp_path / "digits.npz") + "?range=0,16: 36 training" in result.output


def test_dry_run_prices_the_plan_and_trains_nothing(tiny_npz, tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    cmd = [sys.executable, "-m", "privdistill", "pate", "-d", f"npz:{tiny_npz}", "-e", "10", "--dry-run",
           "--recipe", "paper", "--set", "run.plan_check=warn", "--set", "teachers.num_teachers=5",
           "--set", "teachers.batch_size=16",
           "--set", "pate.holdout=80"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stderr
    assert "Dry run of pate" in text and "would spend: Gaussian queries (GNMax)" in text and "strict" in text
    assert "vote noise" in text and "5 teachers" in text, "what the noise leaves of the vote, before training"
    assert not (tmp_path / "runs").exists(), "no run directory, nothing trained"


def test_budget_options_show_their_defaults():
    """Issue 27: `[default: strict]` was written in the help text but read by rich as markup and dropped."""
    result = runner.invoke(get_app(), ["dgd", "--help"], env={"COLUMNS": "200"})
    assert "[default: strict]" in result.output and "[default: method]" in result.output
