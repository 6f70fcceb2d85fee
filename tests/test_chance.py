"""Issue 64, part 2: no release at chance without a word. A model whose held-out accuracy is within a few points of
the largest class's share, or that answers one class for most inputs, is said to be at chance in the first line of
its summary, reports and model card, and `export` refuses it unless told (methods/chance.py)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from typer.testing import CliRunner

from privdistill.cli import get_app
from privdistill.errors import RunError
from privdistill.methods.chance import RULE, ChanceWarning, chance_check
from privdistill.methods.common import RunRequest
from privdistill.release import export_run

# 10 epochs at lr 0.5 on the tiny data: 100 % in 10 of 10 secure-noise draws (4 epochs: 43-96 %, a CI failure)
DPSGD = ["run.recipe=paper", "dpsgd.epochs=10", "dpsgd.batch_size=100", "dpsgd.model=small-cnn", "dpsgd.lr=0.5",
         "run.progress=false", "run.precision=fp32", "budget.epsilon=8", "run.device=cpu"]


def _labels(counts: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((n,), k) for k, n in enumerate(counts)])


def test_the_guard_fires_on_a_constant_predictor_and_not_on_a_good_one():
    labels = _labels([30] * 10)  # 300 test images, 10 balanced classes
    constant = chance_check(torch.zeros(300, dtype=torch.long), labels, 10)
    assert constant["at_chance"] and "answers class 0 for 100%" in constant["warning"]
    assert constant["warning"].startswith("AT CHANCE") and constant["rule"] == RULE
    good = labels.clone()
    good[::10] = (good[::10] + 1) % 10  # 90 % right, every class answered
    assert not chance_check(good, labels, 10)["at_chance"] and chance_check(good, labels, 10)["warning"] is None
    # a random guesser: accuracy near 10 %, below the largest share (10 %) + max(3 points, 2 standard errors)
    guess = torch.randint(0, 10, (300,), generator=torch.Generator().manual_seed(0))
    random = chance_check(guess, labels, 10)
    assert random["at_chance"] and "below" in random["warning"] and "answers class" not in random["warning"]
    assert random["threshold"] == pytest.approx(0.1 + max(0.03, 2 * (0.1 * 0.9 / 300) ** 0.5), abs=1e-4)


def test_an_imbalanced_test_set_is_judged_against_its_largest_class():
    labels = _labels([85, 5, 5, 5])  # 85 % class 0
    majority = chance_check(torch.zeros(100, dtype=torch.long), labels, 4)
    assert majority["at_chance"] and majority["accuracy"] == 0.85, "85 % by always answering the largest class"
    good = labels.clone()
    good[:3] = 1  # 97 % right: it answers class 0 for 82 % of inputs, as often as class 0 occurs
    assert not chance_check(good, labels, 4)["at_chance"]


@pytest.fixture
def chance_run(tiny_npz, tmp_path, monkeypatch):
    """A real DP-SGD run whose released model is made a constant predictor (its last layer zeroed after training:
    every logit 0, every answer class 0)."""
    from privdistill.methods.dpsgd import DPSGDMethod, run_dpsgd

    real = DPSGDMethod.train

    def train_then_forget(self, ctx, plan, ledger):
        trained = real(self, ctx, plan, ledger)
        last = [m for m in trained.student.modules() if isinstance(m, torch.nn.Linear)][-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.zero_()
        return trained

    monkeypatch.setattr(DPSGDMethod, "train", train_then_forget)
    run_dir = tmp_path / "chance"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = run_dpsgd(RunRequest(dataset=f"npz:{tiny_npz}", overrides=DPSGD, run_dir=str(run_dir))).summary
    assert any(issubclass(w.category, ChanceWarning) for w in caught), "said as it happens, as a warning"
    return run_dir, summary


def test_a_run_at_chance_says_so_first_and_export_refuses_it_unless_told(chance_run, tmp_path, capsys):
    from privdistill.bench.run_report import render
    from privdistill.cli.display import show_summary
    from privdistill.privacy.report import render_text, run_report

    run_dir, summary = chance_run
    assert summary["at_chance"] is True and summary["chance_check"]["top_answer_share"] == 1.0
    assert next(iter(summary)) == "warning" and summary["warning"].startswith("AT CHANCE")
    assert (run_dir / "summary.json").read_text().splitlines()[1].lstrip().startswith('"warning": "AT CHANCE')
    assert render_text(run_report(run_dir)).startswith("WARNING: AT CHANCE")
    assert render(run_dir).read_text().startswith("**WARNING: AT CHANCE")
    show_summary(summary)
    assert capsys.readouterr().out.startswith("warning: AT CHANCE")

    with pytest.raises(RunError, match="AT CHANCE.*--allow-chance"):
        export_run(run_dir, tmp_path / "refused")
    refused = CliRunner().invoke(get_app(), ["export", str(run_dir), str(tmp_path / "refused")])
    assert refused.exit_code != 0 and "--allow-chance" in str(refused.exception)
    assert not (tmp_path / "refused").exists()
    out = export_run(run_dir, tmp_path / "forced", allow_chance=True)
    body = (out / "README.md").read_text().split("---\n", 2)[2].lstrip()
    assert body.splitlines()[0].endswith("AT CHANCE)") and body.split("\n\n")[1].startswith("**AT CHANCE")
    import privdistill

    assert privdistill.load(out).card["at_chance"] is True


def test_a_model_above_chance_is_exported_without_a_word(tiny_npz, tmp_path):
    from privdistill.methods.dpsgd import run_dpsgd

    summary = run_dpsgd(RunRequest(dataset=f"npz:{tiny_npz}", overrides=DPSGD, run_dir=str(tmp_path / "r"))).summary
    assert summary["at_chance"] is False and "warning" not in summary and summary["test_accuracy"] > 0.5
    card = (export_run(tmp_path / "r", tmp_path / "out") / "README.md").read_text()
    assert "AT CHANCE" not in card and json.loads((tmp_path / "out" / "privacy.json").read_text())


def test_a_class_the_model_never_learned_is_named_without_calling_the_model_at_chance():
    labels = _labels([30] * 10)
    blind = labels.clone()
    blind[labels == 1] = 7  # every '1' read as a '7' (DPDFD's failure: a class its generator never showed)
    check = chance_check(blind, labels, 10, [str(c) for c in range(10)])
    assert not check["at_chance"] and check["missed_classes"] == [1] and check["class_recall"][1] == 0.0
    assert check["warning"].startswith("MISSED CLASS: this model recognises class '1' in 0.0% of its 30 test images, "
                                       "against 100.0% for the median class")
    good = labels.clone()
    good[::10] = (good[::10] + 1) % 10
    assert chance_check(good, labels, 10)["missed_classes"] == []
    # a class with too few test records is not judged (its recall is too noisy to call)
    few = _labels([30] * 9 + [5])
    assert chance_check(few.clamp(max=8), few, 10)["class_recall"][9] is None
    assert chance_check(few.clamp(max=8), few, 10)["missed_classes"] == []
    # at chance, the model is at chance: no class-by-class finding on top
    constant = chance_check(torch.zeros(300, dtype=torch.long), labels, 10)
    assert constant["at_chance"] and constant["missed_classes"] == []


def test_a_run_that_misses_a_class_says_so_first_and_its_card_names_the_class(tmp_path, monkeypatch):
    from fabricate import write_npz
    from privdistill.methods.chance import MissedClassWarning
    from privdistill.methods.dpsgd import DPSGDMethod, run_dpsgd

    real = DPSGDMethod.train

    def train_then_blind(self, ctx, plan, ledger):  # the trained model made never to answer class 3
        trained = real(self, ctx, plan, ledger)
        with torch.no_grad():
            [m for m in trained.student.modules() if isinstance(m, torch.nn.Linear)][-1].bias[3] = -1e4
        return trained

    monkeypatch.setattr(DPSGDMethod, "train", train_then_blind)
    data = write_npz(tmp_path / "thirty.npz", n=900)  # about 30 test images per class: every class judged
    with pytest.warns(MissedClassWarning, match="MISSED CLASS"):
        summary = run_dpsgd(RunRequest(dataset=f"npz:{data}", overrides=DPSGD, run_dir=str(tmp_path / "r"))).summary
    assert summary["at_chance"] is False and summary["chance_check"]["missed_classes"] == [3]
    assert next(iter(summary)) == "warning" and summary["warning"].startswith("MISSED CLASS: this model recognises "
                                                                              "class '3' in 0.0% of its")
    card = (export_run(tmp_path / "r", tmp_path / "out") / "README.md").read_text()  # exported: it answers the rest
    assert "**MISSED CLASS: this model recognises class '3'" in card and "AT CHANCE" not in card
