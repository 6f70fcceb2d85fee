"""The plan judge (methods/plan_judge.py): every method's plan is refused, before anything trains, when what its
budget buys cannot teach anything, and warned when it buys little; each verdict states its rule."""

from __future__ import annotations

import re
import warnings

import pytest

from privdistill.methods.common import RunRequest
from privdistill.methods.dgd import run_dgd
from privdistill.methods.dpdfd import run_dpdfd
from privdistill.methods.dpsgd import run_dpsgd
from privdistill.methods.pate import run_pate
from privdistill.methods.plan_judge import (
    R_REFUSE_DPDFD,
    REFUSE_PER_CLASS,
    WEAK_PER_CLASS,
    PlanRefused,
    WeakPlanWarning,
    _labels_verdict,
    _ratio_verdict,
    _signal,
)
from privdistill.methods.runner import DryRunPlan
from privdistill.methods.srr import run_srr

RUNS = {"dgd": run_dgd, "pate": run_pate, "srr": run_srr, "dpsgd": run_dpsgd, "dpdfd": run_dpdfd}
# (method, extra overrides, ε refused, ε weak) on the 300-record fabricated dataset, paper recipes; the strict
# accounting unless said (SRR: 300 labels asked for, the weak case at ε 2 per label; DPDFD: σ grows with the strict
# ε's composition)
CASES = [("dgd", [], 5, 10), ("pate", [], 50, 1000),
         ("srr", ["budget.accounting=paper", "srr.num_samples=300"], 0.5, 2), ("dpsgd", [], 2, 10),
         ("dpdfd", ["dpdfd.batch_size=32"], 10, 100)]


def test_the_rules():
    assert _signal(0.1, 10) == 0 and _signal(1.0, 10) == 1
    assert _labels_verdict(REFUSE_PER_CLASS * 10 - 1, 10, "x").level == "refuse"
    assert _labels_verdict(REFUSE_PER_CLASS * 10, 10, "x").level == "weak"
    assert _labels_verdict(WEAK_PER_CLASS * 10, 10, "x").level == "ok"
    assert _ratio_verdict(3.1, "x").level == "refuse" and _ratio_verdict(1.0, "x").level == "weak"
    assert _ratio_verdict(0.01, "x").level == "ok"
    assert _ratio_verdict(1.01, "x", refuse=R_REFUSE_DPDFD).level == "refuse"
    assert f"refused below {REFUSE_PER_CLASS * 10} informative labels" in _labels_verdict(50, 10, "x").rule


def _dry(method, tiny_npz, tmp_path, epsilon, extra):
    request = RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / f"{method}-{epsilon}"), dry_run=True,
                         overrides=["run.recipe=paper", f"budget.epsilon={epsilon}", *extra])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DryRunPlan) as plan:
            RUNS[method](request)
    return plan.value.info, [w for w in caught if issubclass(w.category, WeakPlanWarning)]


@pytest.mark.parametrize("method,extra,refused,weak", CASES, ids=[c[0] for c in CASES])
def test_each_method_refuses_a_plan_that_cannot_teach_and_warns_of_a_weak_one(tiny_npz, tmp_path, method, extra,
                                                                               refused, weak):
    request = RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / "refused"), dry_run=True,
                         overrides=["run.recipe=paper", f"budget.epsilon={refused}", *extra])
    with pytest.raises(PlanRefused, match="cannot teach anything") as err:
        RUNS[method](request)
    assert "Nearest plans that would pass" in str(err.value) and "refused" in str(err.value)
    assert not (tmp_path / "refused" / "ledger.jsonl").exists(), "refused before anything was spent"
    info, weak_warnings = _dry(method, tiny_npz, tmp_path, weak, extra)
    assert weak_warnings, "a weak plan says so"
    assert any(n.startswith("plan judged weak") for n in info["notes"])


@pytest.mark.parametrize("method,recipe,epsilon", [("dgd", "default", 1), ("dpdfd", "paper", 10)])
def test_the_nearest_epsilon_named_is_the_smallest_doubling_whose_own_plan_passes(tiny_npz, tmp_path, method,
                                                                                    recipe, epsilon):
    """The suggested ε is judged with the plan `-e ε` makes (DGD's default recipe changes its values at ε <= 2),
    so that running it passes and half of it (when above the target) is still refused."""
    def attempt(eps, name):
        request = RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / name), dry_run=True,
                             overrides=[f"run.recipe={recipe}", f"budget.epsilon={eps}"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            RUNS[method](request)

    with pytest.raises(PlanRefused) as err:
        attempt(epsilon, "target")
    found = re.search(r"ε = ([0-9.]+) with this method and recipe", str(err.value))
    assert found, str(err.value)
    nearest = float(found.group(1))
    with pytest.raises(DryRunPlan):
        attempt(nearest, "nearest")
    if nearest / 2 > epsilon:
        with pytest.raises(PlanRefused):
            attempt(nearest / 2, "half")


def test_dgd_refusal_advises_cluster_votes_or_end_to_end_not_fewer_teachers(tiny_npz, tmp_path):
    """DGD's vote noise falls with the teacher count, so fewer teachers buy fewer answers: the advice is cluster
    votes (when the run does not already vote on clusters) and the end-to-end recipe."""
    def refusal(recipe, epsilon):
        request = RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / f"{recipe}-{epsilon}"), dry_run=True,
                             overrides=[f"run.recipe={recipe}", f"budget.epsilon={epsilon}"])
        with pytest.raises(PlanRefused) as err:
            run_dgd(request)
        return str(err.value)

    per_sample = refusal("paper", 5)
    assert "dgd.query_selection=clusters" in per_sample and "-r end-to-end" in per_sample
    assert "fewer teachers" not in per_sample
    clustered = refusal("default", 1)  # the default recipe already votes on clusters at ε <= 2
    assert "dgd.query_selection=clusters" not in clustered and "-r end-to-end" in clustered


def test_a_refusal_never_advises_the_accounting_the_run_already_uses(tiny_npz, tmp_path):
    """DPDFD refused under its paper's accounting was told to try "the paper's accounting": each other plan is
    offered only where the run is not already it."""
    def refusal(accounting, epsilon):
        request = RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / f"{accounting}-{epsilon}"),
                             dry_run=True, overrides=["run.recipe=paper", "dpdfd.batch_size=32",
                                                      f"budget.accounting={accounting}", f"budget.epsilon={epsilon}"])
        with pytest.raises(PlanRefused) as err:
            run_dpdfd(request)
        return str(err.value)

    assert "--accounting paper" in refusal("strict", 10)
    assert "--accounting paper" not in refusal("paper", 0.001)
