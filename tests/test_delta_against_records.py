"""Issue 62: δ against the N private training records. δ ≥ 1/N is refused with the reason before any work (a
mechanism publishing each record outright with probability δ meets (ε, δ)-DP); δ above 1/(10 N) is warned."""

from __future__ import annotations

import sys
import warnings

import pytest

from privdistill.errors import PrivacyError
from privdistill.methods.common import RunRequest
from privdistill.methods.runner import DryRunPlan
from privdistill.privacy._checks import DeltaWarning, check_delta_for_records

SRR = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
       "srr.setting=label-dp", "srr.num_samples=0", "srr.stages=1", "srr.student_model=small-cnn",
       "budget.epsilon=2", "run.progress=false"]


def test_the_thresholds():
    with pytest.raises(PrivacyError, match=r"delta 0.5 is not below 1/N = 0.00334 for the N = 299 private training "
                                           r"records.*expose about 150 of them.*at most 1/\(10 N\) = 0.000334"):
        check_delta_for_records(0.5, 299)
    with pytest.raises(PrivacyError, match="not below 1/N"):
        check_delta_for_records(1e-2, 100)  # exactly 1/N
    with pytest.warns(DeltaWarning, match=r"delta 0.005 is above 1/\(10 N\) = 0.001 for the N = 100 private"):
        check_delta_for_records(5e-3, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_delta_for_records(1e-3, 100)  # 1/(10 N) itself: quiet
        check_delta_for_records(1e-5, 60000 // 6)


def test_a_run_refuses_delta_at_or_above_one_over_n_before_any_work(tiny_npz, tmp_path, monkeypatch):
    from privdistill.methods.srr import run_srr

    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    with pytest.raises(PrivacyError, match="for the N = 300 private training records"):
        run_srr(RunRequest(dataset=f"npz:{tiny_npz}", overrides=SRR + ["budget.delta=0.5"], run_dir=str(run_dir)))
    assert not run_dir.exists() and not (tmp_path / "cache").exists(), "refused before any work"
    # above 1/(10 N): warned (one line), and the plan goes ahead
    with pytest.warns(DeltaWarning, match=r"above 1/\(10 N\)") as caught, pytest.raises(DryRunPlan):
        run_srr(RunRequest(dataset=f"npz:{tiny_npz}", overrides=SRR + ["budget.delta=1e-3"], run_dir=str(run_dir),
                           dry_run=True))
    assert all("\n" not in str(w.message) for w in caught)


def test_the_cli_refuses_in_one_line(tiny_npz, tmp_path, monkeypatch, capsys):
    from privdistill.cli import main

    monkeypatch.setenv("PRIVDISTILL_KEEP_FREED_MEMORY", "0")
    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    args = ["privdistill", "srr", "-d", f"npz:{tiny_npz}", "--delta", "0.5", "--run-dir", str(tmp_path / "run")]
    for item in SRR:
        args += ["--set", item]
    monkeypatch.setattr(sys, "argv", args)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "delta 0.5 is not below 1/N" in err and not (tmp_path / "run").exists()
