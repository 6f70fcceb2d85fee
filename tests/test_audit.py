"""Audits: ROC metrics, the member/non-member split, LiRA on fabricated shadow scores, a memorising model
vs one that never saw the members, model inversion, and `audit_run` end to end on a tiny run."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from privdistill.audits.inversion import InversionConfig, correlation, invert
from privdistill.audits.membership import AuditConfig, audit_split, lira_scores, logit_confidence, model_outputs
from privdistill.audits.metrics import attack_metrics, auc, roc_curve, tpr_at_fpr
from privdistill.engine import Env


def test_roc_metrics_on_known_cases():
    labels = np.r_[np.ones(100), np.zeros(100)]
    assert auc(np.r_[np.arange(100) + 100, np.arange(100)], labels) == 1.0
    assert auc(np.zeros(200), labels) == 0.5, "all ties: chance"
    assert auc(np.r_[np.arange(100), np.arange(100) + 100], labels) == 0.0
    rng = np.random.default_rng(0)
    assert abs(auc(rng.normal(size=20000), np.r_[np.ones(10000), np.zeros(10000)]) - 0.5) < 0.02
    # TPR at a fixed FPR: 2 of 100 non-members score above every member but 10 of them
    scores = np.r_[np.r_[np.full(10, 10.0), np.zeros(90)], np.r_[np.full(2, 20.0), np.full(98, 5.0)]]
    assert tpr_at_fpr(scores, labels, 0.01) == 0.0 and tpr_at_fpr(scores, labels, 0.02) == 0.1
    fpr, tpr = roc_curve(scores, labels)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1 and np.all(np.diff(fpr) >= 0)
    m = attack_metrics(rng.normal(size=400) + np.r_[np.ones(200), np.zeros(200)], np.r_[np.ones(200), np.zeros(200)],
                       bootstrap=50)
    assert m["auc_ci95"][0] < m["auc"] < m["auc_ci95"][1] and 0.65 < m["auc"] < 0.85


def test_logit_confidence_is_the_log_odds_of_the_true_class():
    logits = torch.randn(6, 4)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    p = F.softmax(logits, 1).gather(1, y[:, None]).squeeze(1)
    assert torch.allclose(logit_confidence(logits, y), torch.log(p / (1 - p)), atol=1e-5)
    # stable where p_y rounds to 1 in float32
    assert torch.isfinite(logit_confidence(torch.tensor([[80.0, 0.0]]), torch.tensor([0]))).all()


def test_split_is_seeded_equal_sized_and_avoids_the_public_slice(tiny_npz):
    from privdistill.data import load_data
    from privdistill.engine.holdout import public_indices

    data = load_data(f"npz:{tiny_npz}")
    cfg = AuditConfig(members=50, nonmembers=50, holdout=100, shadows=2)
    a, b = audit_split(data, cfg), audit_split(data, cfg)
    assert torch.equal(a.members, b.members) and torch.equal(a.nonmembers, b.nonmembers)
    assert len(a.members) == len(a.nonmembers) == 50
    assert not set(a.members.tolist()) & set(public_indices(len(data.train), 100, 0).tolist())
    assert a.is_member().sum() == 50


def test_lira_separates_members_when_shadows_say_how_in_and_out_differ():
    rng = np.random.default_rng(0)
    n, s = 400, 16
    mu_out, mu_in = rng.normal(0, 2, n), None
    mu_in = mu_out + 1.5  # training on an example raises its confidence
    in_mask = np.zeros((s, n), bool)
    for j in range(n):
        in_mask[rng.permutation(s)[: s // 2], j] = True
    shadow = np.where(in_mask, mu_in, mu_out) + rng.normal(0, 0.5, (s, n))
    member = np.r_[np.ones(n // 2, bool), np.zeros(n // 2, bool)]
    target = np.where(member, mu_in, mu_out) + rng.normal(0, 0.5, n)
    scores = lira_scores(target, shadow, in_mask)
    assert auc(scores["online"], member) > 0.9 and auc(scores["offline"], member) > 0.85
    # the raw confidence alone is a much weaker test (per-example difficulty is not calibrated away)
    assert auc(target, member) < auc(scores["online"], member) - 0.1
    # a target that never saw anything: chance
    blind = mu_out + rng.normal(0, 0.5, n)
    assert abs(auc(lira_scores(blind, shadow, in_mask)["online"], member) - 0.5) < 0.1


def _memorise(images, labels, steps=100, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(images[0].numel(), 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x = images.float() / 127.5 - 1
    for _ in range(steps):
        loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_loss_attack_finds_memorised_members_and_not_unseen_ones():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (400, 1, 12, 12), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (400,), generator=g)  # random labels: only memorisation fits them
    member = np.r_[np.ones(200, bool), np.zeros(200, bool)]
    memoriser = _memorise(images[:200], labels[:200])
    out = model_outputs(memoriser, images, labels)
    assert auc(-out["loss"], member) > 0.95
    outsider = _memorise(torch.randint(0, 256, (200, 1, 12, 12), generator=g, dtype=torch.uint8),
                         torch.randint(0, 10, (200,), generator=g))
    out = model_outputs(outsider, images, labels)
    assert abs(auc(-out["loss"], member) - 0.5) < 0.1


def test_inversion_raises_the_target_class_confidence():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    cfg = InversionConfig(steps=60, lr=0.1, restarts=2)
    before = F.softmax(model(torch.zeros(1, 1, 8, 8)), 1).max()
    images, conf = invert(model, num_classes=3, shape=(1, 8, 8), cfg=cfg, env=Env.cpu())
    assert images.shape == (2, 3, 1, 8, 8) and images.abs().max() <= 1
    assert conf.min() > before and conf.min() > 0.9
    assert correlation(images[0, 0], images[0, 0]) == pytest.approx(1.0, abs=1e-5)


def test_audit_run_end_to_end_records_the_numbers(tiny_npz, tmp_path, monkeypatch):
    from privdistill.audits.audit import audit_run
    from privdistill.methods.baseline import train_baseline
    from privdistill.methods.common import RunRequest

    monkeypatch.chdir(tmp_path)
    base = ["baseline.model=small-cnn", "baseline.epochs=2", "baseline.batch_size=32", "run.precision=fp32",
            "run.progress=false"]
    train_baseline(RunRequest(dataset=f"npz:{tiny_npz}", overrides=base, run_dir="runs/base", record=True))
    audit = ["audit.members=60", "audit.nonmembers=60", "audit.holdout=0", "audit.shadows=2", "audit.bootstrap=20",
             "shadow.model=small-cnn", "shadow.epochs=1", "shadow.batch_size=32", "inversion.steps=5",
             "inversion.restarts=1", "run.precision=fp32", "run.progress=false"]
    r = audit_run("runs/base", overrides=audit, record=True)
    summary = json.loads((tmp_path / "runs/base/summary.json").read_text())
    assert summary["mia_attack"] == "lira-online" and 0 <= summary["mia_auc"] <= 1
    assert 0 <= summary["mia_tpr_at_1pct_fpr"] <= 1
    assert set(summary["audit"]["mia"]["attacks"]) == {"loss", "lira-online", "lira-offline"}
    for f in ("mia.json", "mia_scores.npz", "mia_roc.png", "inversion.png"):
        assert (tmp_path / "runs/base/audit" / f).is_file()
    recorded = json.loads((tmp_path / "results/quick/baseline-npz-tiny.json").read_text())
    assert recorded["mia_auc"] == summary["mia_auc"]
    assert r["mia"]["shadow_stage"]["reused"] is False
    again = audit_run("runs/base", overrides=audit + ["audit.inversion=false"])
    assert again["mia"]["shadow_stage"]["reused"] is True, "shadows are a cached stage"
    assert again["mia_auc"] == r["mia_auc"], "same split, same shadows, same model: same numbers"


def test_positive_control_memorises_exactly_the_audit_members(tiny_npz, tmp_path, monkeypatch):
    from privdistill.audits.audit import audit_run
    from privdistill.audits.control import train_audit_control
    from privdistill.methods.common import RunRequest

    monkeypatch.chdir(tmp_path)
    audit = ["audit.members=60", "audit.nonmembers=20", "audit.holdout=0", "audit.shadows=0", "audit.bootstrap=20",
             "audit.inversion=false", "run.precision=fp32", "run.progress=false"]
    s = train_audit_control(RunRequest(dataset=f"npz:{tiny_npz}", run_dir="runs/control", overrides=audit + [
        "audit_control.model=small-cnn", "audit_control.epochs=30", "audit_control.batch_size=20"]))
    assert s["method"] == "audit-control" and s["train_size"] == 60 and s["train_accuracy"] == 1.0
    assert s["epsilon_strict"] is None and "positive control" in s["privacy"]
    r = audit_run("runs/control", overrides=audit)
    assert r["split"] == s["audit_split"], "trained on the very members the audit tests"
    assert r["mia"]["accuracy_members"] == 1.0
