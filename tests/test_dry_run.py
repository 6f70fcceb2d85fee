"""Issue 62, part 4: a dry run states what its run will spend and report (σ / noise scale, counts, ε under both
accountings, what ε covers) and refuses beyond --max-epsilon as the run does, for every method."""

import re
import sys

import pytest

import test_dgd
import test_dpdfd
import test_dpsgd
import test_pate
import test_srr
from privdistill.errors import BudgetExceededError
from privdistill.methods.common import RunRequest
from privdistill.methods.dgd import DGDMethod
from privdistill.methods.dpdfd import DPDFDMethod
from privdistill.methods.dpsgd import DPSGDMethod
from privdistill.methods.pate import PATEMethod
from privdistill.methods.runner import DryRunPlan
from privdistill.methods.srr import SRRMethod
from privdistill.privacy.accounting import merge_events
from privdistill.privacy.ledger import LedgerView

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# the existing tests' tiny configurations, each asking for a spend the run makes in full
CASES = {
    "dgd": (DGDMethod, test_dgd.TINY + ["dgd.queries=40", "run.threads=1"]),
    "dpdfd": (DPDFDMethod, test_dpdfd.TINY + ["budget.epsilon=null", "dpdfd.steps=8", "dpdfd.sigma=1"]),
    "srr": (SRRMethod, test_srr.TINY + ["budget.epsilon=2"]),
    # issue 62: printed "strict 4.0000" (four stages, each priced alone) where the run reports 1.0
    "srr-label-dp": (SRRMethod, test_srr.TINY + ["budget.epsilon=1", "srr.setting=label-dp"]),
    "srr-end-to-end": (SRRMethod, test_srr.TINY + test_srr.E2E),
    "pate": (PATEMethod, test_pate.TINY + ["budget.epsilon=10", "run.threads=1"]),
    # issue 62: printed no σ and no ε (Opacus calibrated σ only once training started)
    "dpsgd": (DPSGDMethod, test_dpsgd.TINY + ["run.threads=1"]),  # paper accounting (Opacus RDP)
    "dpsgd-strict": (DPSGDMethod, test_dpsgd.TINY + ["budget.accounting=strict", "budget.epsilon=3", "run.threads=1"]),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One stage cache for the module: each tiny teacher / generator is trained once."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PRIVDISTILL_CACHE", str(tmp_path_factory.mktemp("dry-run-cache")))
    yield
    mp.undo()


def dry_run(method, tiny_npz, run_dir, overrides) -> dict:
    with pytest.raises(DryRunPlan) as plan:
        method().run(RunRequest(dataset=f"npz:{tiny_npz}", overrides=overrides, run_dir=str(run_dir), dry_run=True))
    return plan.value.info


def summary_counts(name: str, s: dict) -> dict:
    """The counts and noise the run's summary states, by what the dry run calls them."""
    if name.startswith("dpsgd"):
        a = s["dpsgd_accounting"]
        return {"steps": a["steps"], "noise_multiplier": a["noise_multiplier"], "sample_rate": a["sample_rate"]}
    return {"dgd": lambda: {"count": s["queries"]},
            "pate": lambda: {"count": s["queries"], "sigma": s["event"]["sigma"]},
            "dpdfd": lambda: {"steps": s["steps"], "sigma": s["sigma"], "clip_norm": s["clip_norm"]},
            "srr": lambda: {"count": s["num_labels"], "epsilon": s["epsilon_per_label"]},
            "srr-label-dp": lambda: {"count": s["num_labels"], "epsilon": s["epsilon_per_label"]},
            "srr-end-to-end": lambda: {}}[name]()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_dry_run_states_what_the_run_spends_and_reports(name, tiny_npz, tmp_path, cache):
    method, overrides = CASES[name]
    info = dry_run(method, tiny_npz, tmp_path / "dry", overrides)
    assert not (tmp_path / "dry" / "student.safetensors").exists() and not (tmp_path / "dry" / "summary.json").exists()
    s = method().run(RunRequest(dataset=f"npz:{tiny_npz}", overrides=overrides, run_dir=str(tmp_path / "run"))).summary
    # ε under both accountings, rounded as the summary rounds it
    assert info["epsilon"] == {"strict": s["epsilon_strict"], "paper": s["epsilon_paper"]}, (info["epsilon"], s)
    assert info["not_covered"] == s["not_covered"], "what the ε covers: the run's own pathways"
    assert info["covers"] and info["events"] and len(info["events"]) == len(info["spend"])
    # counts and noise: the planned spend IS what the run recorded (the ledger), and what its summary states
    first = info["spend"][0]
    if method.uses_ledger:
        recorded = [e.to_dict() for e in merge_events(LedgerView.read(tmp_path / "run").events())]
        assert info["spend"] == recorded
    for key, value in summary_counts(name, s).items():
        assert first[key] == pytest.approx(value, rel=1e-6), (key, first, s)


def refusal(exc: BaseException, run_dir) -> str:
    return re.sub(r"\s*\(?\S*ledger\.jsonl\)?", "", str(exc).replace(str(run_dir), "RUN"))


@pytest.mark.parametrize("name", list(CASES))
def test_dry_run_refuses_beyond_max_epsilon_as_the_run_does(name, tiny_npz, tmp_path, cache):
    method, overrides = CASES[name]
    eps = dry_run(method, tiny_npz, tmp_path / "priced", overrides)["epsilon"]
    accounting = "paper" if "budget.accounting=paper" in overrides and "budget.accounting=strict" not in overrides \
        else "strict"
    over = overrides + [f"budget.max_epsilon={0.9 * eps[accounting]:.6g}"]
    with pytest.raises(BudgetExceededError) as dry:
        method().run(RunRequest(dataset=f"npz:{tiny_npz}", overrides=over, run_dir=str(tmp_path / "dry"),
                                dry_run=True))
    with pytest.raises(BudgetExceededError) as run:  # refused before anything trains
        method().run(RunRequest(dataset=f"npz:{tiny_npz}", overrides=over, run_dir=str(tmp_path / "run")))
    assert refusal(dry.value, tmp_path / "dry") == refusal(run.value, tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_cli_prints_the_runs_label_dp_epsilon(tiny_npz, tmp_path, monkeypatch, capsys, cache):
    """The issue's case: SRR label-DP at --epsilon 1 --max-epsilon 1 prints strict 1 (not 4) and goes ahead, as the
    run does; --max-epsilon 0.5 is refused with the run's message."""
    from privdistill.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["privdistill", "srr", "-d", f"npz:{tiny_npz}", "--setting", "label-dp", "--epsilon", "1", "--dry-run",
            "--set", "srr.stages=4", "--set", "srr.num_samples=160", "--set", "run.plan_check=warn"]
    monkeypatch.setattr(sys, "argv", args + ["--max-epsilon", "1"])
    main()
    out = " ".join(capsys.readouterr().out.split())
    assert "would spend: Randomized response with a prior (SRR, label-dp): 160 labels, epsilon 1.00001 per label" in out
    assert "strict 1.0000, paper 1.0000" in out and "covers: label-DP only" in out, out
    monkeypatch.setattr(sys, "argv", args + ["--max-epsilon", "0.5"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2 and "above --max-epsilon 0.5" in capsys.readouterr().err
