"""Teachers as closed-form ridge heads on a fixed ScatterNet transform (`teachers.fit=ridge`)."""

import pytest
import torch

from privdistill.data import load_data
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import Env
from privdistill.engine.ensemble import (
    TeacherEnsemble,
    TeacherTraining,
    ensemble_accuracy,
    make_partitions,
    plan_teachers,
    train_teachers,
)
from privdistill.errors import ConfigError

RIDGE = dict(num_teachers=3, model="scatter-linear", fit="ridge", ridge=0.01, batch_size=8)


def test_ridge_teachers_learn_their_partitions_and_vote_as_their_modules(tiny_npz, tmp_path):
    """Each head is the ridge solution on its own partition: it minimises its objective (the gradient vanishes),
    the ensemble reads the pattern data well, and the shared-transform fast path gives each rebuilt member's own
    logits, also after a save and load."""
    data = load_data(f"npz:{tiny_npz}")
    env = Env.cpu(seed=0)
    ensemble, stats = train_teachers(data.train, TeacherTraining(**RIDGE), env)
    assert stats["trainer"] == "ridge" and ensemble.shares_features
    assert ensemble_accuracy(ensemble, data.test, env)["ensemble_accuracy"] > 0.9

    x = to_float(data.test.images[:16])
    fast = ensemble.logits(x)
    for i in range(3):
        assert torch.allclose(fast[i], ensemble.member(i).eval()(x), atol=1e-4)
    ensemble.save(tmp_path / "t.safetensors")
    assert torch.allclose(TeacherEnsemble.load(tmp_path / "t.safetensors").logits(x), fast, atol=1e-6)

    # optimality of teacher 0: d/dw [(1/n) ||Xw - Y||^2 + λ ||w||^2] = 0 at its (weight, bias)
    part = make_partitions(data.train, TeacherTraining(**RIDGE))[0]
    member = ensemble.member(0)
    feats = torch.cat([member.scatter(to_float(data.train.images[part])).flatten(1), torch.ones(len(part), 1)], 1)
    w = torch.cat([member.head[1].weight.T, member.head[1].bias[None]], 0).detach()
    y = torch.nn.functional.one_hot(data.train.labels[part], data.num_classes).float()
    grad = 2 / len(part) * feats.T @ (feats @ w - y) + 2 * 0.01 * w
    assert grad.abs().max() < 1e-3 * (2 / len(part) * feats.T @ y).abs().max()


def test_one_replaced_record_changes_one_ridge_teacher(tiny_npz):
    """The votes' analysis assumes that replacing one private record changes one teacher: the transform reads no
    data and normalises each example alone, so only the head of the record's partition moves."""
    data = load_data(f"npz:{tiny_npz}")
    env = Env.cpu(seed=0)
    before, _ = train_teachers(data.train, TeacherTraining(**RIDGE), env)
    images, labels = data.train.images.clone(), data.train.labels.clone()
    record = int(make_partitions(data.train, TeacherTraining(**RIDGE))[1][0])
    images[record] = 255 - images[record]
    labels[record] = (labels[record] + 1) % data.num_classes
    after, _ = train_teachers(ImageDataset(images, labels, data.num_classes, name="replaced"),
                              TeacherTraining(**RIDGE), env)
    moved = [not torch.equal(before.stacked()[0]["head.1.weight"][t], after.stacked()[0]["head.1.weight"][t])
             for t in range(3)]
    assert moved == [False, True, False]


def test_ridge_fit_refuses_what_it_cannot_do():
    with pytest.raises(ConfigError, match="augment"):
        TeacherTraining(**{**RIDGE, "augment": "shift"}).validate()
    with pytest.raises(ConfigError, match="fit"):
        TeacherTraining(fit="lbfgs").validate()
    with pytest.raises(ConfigError, match="ridge"):
        TeacherTraining(**{**RIDGE, "ridge": 0.0}).validate()


def test_ridge_fit_needs_a_fixed_transform_and_a_linear_head(tiny_npz):
    data = load_data(f"npz:{tiny_npz}")
    wrong = TeacherTraining(**{**RIDGE, "model": "paper-cnn"})
    with pytest.raises(ConfigError, match="paper-cnn"):  # in a method's plan, before any stage trains
        plan_teachers(data.train, wrong, distribution="gaussian", scale=1.0, option="dgd noise")
    with pytest.raises(ConfigError, match="paper-cnn"):
        train_teachers(data.train, wrong, Env.cpu(seed=0))
    plan_teachers(data.train, TeacherTraining(**RIDGE), distribution="gaussian", scale=1.0, option="dgd noise")


def test_ridge_fit_is_refused_on_ray_rather_than_silently_trained_by_sgd(tiny_npz):
    from privdistill.engine.distributed import ClientEnsemble, train_teachers_ray

    data = load_data(f"npz:{tiny_npz}")
    with pytest.raises(ConfigError, match="does not run on Ray"):
        train_teachers_ray(data.train, TeacherTraining(**RIDGE), Env.cpu(seed=0))
    with pytest.raises(ConfigError, match="does not run on Ray"):
        ClientEnsemble.launch("npz", data.train, TeacherTraining(**RIDGE), Env.cpu(seed=0))
