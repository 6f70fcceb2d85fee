"""ScatterNet + DP-SGD (Tramèr & Boneh 2021): the fixed transform, its cached features, the release."""

import pytest
import torch

from privdistill.errors import ConfigError
from privdistill.methods.common import RunRequest
from privdistill.methods.dpsgd import run_dpsgd

pytest.importorskip("kymatio")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SCATTER = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
           "dpsgd.model=scatter-linear", "dpsgd.batch_size=100", "dpsgd.max_grad_norm=0.1", "dpsgd.lr=4",
           "dpsgd.lr_schedule=constant", "dpsgd.epochs=3", "run.progress=false", "run.precision=fp32",
           "budget.epsilon=8"]


def _run(tiny_npz, tmp_path, name, extra=()):
    return run_dpsgd(RunRequest(dataset=f"npz:{tiny_npz}", overrides=SCATTER + list(extra),
                                run_dir=str(tmp_path / name))).summary


def test_scatternet_is_a_fixed_transform_with_a_trainable_head():
    from privdistill.models import create_model

    model = create_model("scatter-linear", in_channels=1, num_classes=10, image_size=28)
    assert list(model.state_dict()) == ["head.1.weight", "head.1.bias"], "only the head is saved"
    x = torch.rand(4, 1, 28, 28) * 2 - 1
    features = model.scatter(x)
    assert features.shape == (4, 81, 7, 7)
    # GroupNorm without affine parameters: every example's groups are standardised on their own
    groups = features.reshape(4, 27, -1)
    assert torch.allclose(groups.mean(-1), torch.zeros(4, 27), atol=1e-4)
    assert torch.allclose(model.scatter(x[:1]), features[:1], atol=1e-5), "per example: no batch statistics"
    assert model(x).shape == (4, 10)
    other = create_model("scatter-linear", in_channels=1, num_classes=5, image_size=28)
    assert other.transform_id == model.transform_id, "both heads read the same cached features"
    rgb = create_model("scatter-linear", in_channels=3, num_classes=5, image_size=32)
    assert rgb.transform_id != model.transform_id
    assert rgb(torch.zeros(2, 3, 32, 32)).shape == (2, 5)
    # a side that is not a multiple of 4 is padded by its edge pixels to one (10 x 10 images were refused)
    odd = create_model("scatter-linear", in_channels=1, num_classes=10, image_size=30)
    assert odd.transform_id != model.transform_id and odd.feature_dim == 81 * 8 * 8
    x30 = torch.rand(2, 1, 30, 30)
    edge = create_model("scatter-linear", in_channels=1, num_classes=10, image_size=32)
    padded = torch.nn.functional.pad(x30, (1, 1, 1, 1), mode="replicate")
    assert torch.allclose(odd.normalised_scattering(x30), edge.normalised_scattering(padded), atol=1e-5)


@pytest.mark.parametrize("J, channels, size", [(2, 1, 28), (1, 1, 28), (2, 3, 32), (1, 3, 32)])
def test_fast_scattering_equals_kymatio(J, channels, size):
    """The default transform (batched FFTs, compiled kernels) gives kymatio's coefficients, in kymatio's layout, and
    with gradients (torch operations) its values and gradients too."""
    from privdistill.models.scatternet import FastScattering2D, make_scattering

    torch.manual_seed(J * 100 + channels)
    x = torch.rand(9, channels, size, size) * 2 - 1
    kymatio = make_scattering((size, size), J=J, reference=True)
    fast = make_scattering((size, size), J=J)
    assert isinstance(fast, FastScattering2D) and not isinstance(kymatio, FastScattering2D)
    fast.chunk = 4  # several chunks, the last short; fewer maps than a block of the second order's kernel
    reference = kymatio(x)
    with torch.no_grad():
        compiled = fast(x)
    assert compiled.shape == reference.shape == (9, channels, *fast.out_shape)
    assert (compiled - reference).abs().max() < 1e-4
    weights = torch.randn_like(reference)
    grads = []
    for transform in (kymatio, fast):
        xg = x.clone().requires_grad_(True)
        out = transform(xg)
        assert (out - reference).abs().max() < 1e-4
        (out * weights).sum().backward()
        grads.append(xg.grad)
    assert (grads[0] - grads[1]).abs().max() < 1e-4


def test_scatternet_uses_the_fast_scattering():
    from privdistill.models.scatternet import FastScattering2D, ScatterNet

    model = ScatterNet(1, 10, 28, fine=True)  # the multiscale models' two scales
    assert isinstance(model._scattering, FastScattering2D) and model._scattering.J == 2
    assert isinstance(model._fine_scattering, FastScattering2D) and model._fine_scattering.J == 1


def test_scatternet_dpsgd_release_covers_the_model_and_reloads(tiny_npz, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    s = _run(tiny_npz, tmp_path, "scatter")
    assert s["not_covered"] == [] and s["epsilon_strict"] <= 8 and s["model"] == "scatter-linear"
    assert s["test_accuracy"] > 0.5, "the fabricated classes are easy for a linear model on scattering features"
    # the released file is the head; rebuilt through the registry it gives the accuracy the run reported
    from privdistill.data import load_data
    from privdistill.engine.context import Env
    from privdistill.engine.run import RunDir
    from privdistill.engine.trainer import evaluate

    model = RunDir(tmp_path / "scatter").load_weights("model")
    data = load_data(f"npz:{tiny_npz}")
    assert evaluate(model, data.test, Env.cpu()) == pytest.approx(s["test_accuracy"], abs=1e-4)
    # the features are a cached stage: a second run (another ε) reuses them
    stages = list((tmp_path / "cache").glob("features-*"))
    assert len(stages) == 1
    _run(tiny_npz, tmp_path, "scatter-again", ["budget.epsilon=3"])
    assert list((tmp_path / "cache").glob("features-*")) == stages


def test_scatternet_augments_only_with_copies(tiny_npz, tmp_path):
    """The features are computed once: augmentation means fixed copies averaged per example (multiplicity)."""
    for bad in (["dpsgd.augment=shift"], ["dpsgd.augment_copies=3"],
                ["dpsgd.augment_copies=3", "dpsgd.augment=shift", "dpsgd.model=small-cnn"]):
        with pytest.raises(ConfigError, match="augment_copies"):
            _run(tiny_npz, tmp_path, "aug", bad)


def test_augmentation_multiplicity_averages_copies_at_the_same_privacy_cost(tiny_npz, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    one = _run(tiny_npz, tmp_path, "one")
    three = _run(tiny_npz, tmp_path, "three", ["dpsgd.augment_copies=3", "dpsgd.augment=affine"])
    # one clipped gradient per example either way: the same σ, sampling rate and steps, so the same ε
    assert three["epsilon_strict"] == one["epsilon_strict"]
    assert three["dpsgd_accounting"]["noise_multiplier"] == one["dpsgd_accounting"]["noise_multiplier"]
    stages = {p.name: load_file(str(p / "features.safetensors")) for p in (tmp_path / "cache").glob("features-*")}
    plain, copies = sorted(stages.values(), key=lambda f: f["train"].dim())
    assert copies["train"].shape == (plain["train"].shape[0], 3, *plain["train"].shape[1:])
    assert torch.equal(copies["train"][:, 0], plain["train"]), "copy 0 is the image as it is"
    assert not torch.equal(copies["train"][:, 1], plain["train"]), "the others are augmented"
    assert three["test_accuracy"] > 0.5


def test_the_scatternet_recipe_sets_the_scatternet_head():
    from privdistill.config import resolve_sections
    from privdistill.methods.dpsgd import DPSGDConfig
    from privdistill.recipes import recipe_layers

    cfg = resolve_sections({"dpsgd": DPSGDConfig}, preset="quick",
                           recipe=recipe_layers("dpsgd", "scatternet", "mnist", 1))["dpsgd"]
    assert (cfg.model, cfg.max_grad_norm, cfg.augment) == ("scatter-linear", 0.1, "none")
    cfg.validate()


def test_dead_leaves_are_a_deterministic_public_process():
    from privdistill.models.random_prior import dead_leaves

    a, b = dead_leaves(40, seed=1), dead_leaves(40, seed=1)
    assert torch.equal(a, b) and a.shape == (40, 1, 28, 28)
    assert not torch.equal(a, dead_leaves(40, seed=2))
    assert a.min() >= -1 and a.max() <= 1
    background = (a == -1).float().mean()
    assert 0.05 < background < 0.95, "shapes cover part of the dark background, not all of it"
    assert len(a.unique()) > 40, "each shape has its own intensity"
    rgb = dead_leaves(5, channels=3, size=(32, 32), batch=2)  # batches of 2: the same process across batches
    assert rgb.shape == (5, 3, 32, 32) and not torch.equal(rgb[:, 0], rgb[:, 1])


def test_textured_dead_leaves_texture_the_shapes_and_leave_the_background():
    from privdistill.models.random_prior import dead_leaves

    plain, textured = dead_leaves(60, seed=4), dead_leaves(60, seed=4, texture=0.5)
    assert torch.equal(dead_leaves(60, seed=4, texture=0.0), plain), "texture 0 is the untextured process"
    assert torch.equal(textured, dead_leaves(60, seed=4, texture=0.5)), "deterministic in the seed"
    assert textured.min() >= -1 and textured.max() <= 1
    background = plain == -1
    assert torch.equal(textured[background], plain[background]), "the background is not textured"
    moved = (textured - plain).abs()[~background]
    assert 0 < moved.max() <= 0.5 + 1e-6, "shapes move by at most the amplitude"
    # a flat shape has one intensity; a textured one varies inside: more distinct values per image
    assert all(len(t.unique()) > 3 * len(p.unique()) for t, p in zip(textured[:10], plain[:10]))


def test_whitening_projection_whitens_the_leading_directions():
    from privdistill.models.random_prior import whitening_projection

    g = torch.Generator().manual_seed(0)
    d, dims = 24, 6
    mixing = torch.randn(d, d, generator=g) * torch.logspace(0, -2, d)[None, :]  # strongly unequal variances
    features = torch.randn(6000, d, generator=g) @ mixing.T
    projection = whitening_projection(features, dims)
    assert projection.shape == (d, dims)
    u = features / features.norm(dim=1, keepdim=True)
    z = u @ projection
    moment = z.T @ z / len(z)
    scale = moment.diagonal().mean()
    assert torch.allclose(moment / scale, torch.eye(dims), atol=1e-3), "unit, uncorrelated variances on the fit data"
    assert z.norm(dim=1).median() == pytest.approx(d ** 0.5, rel=1e-3), "scaled to a GroupNorm'd vector's norm"
    assert torch.equal(whitening_projection(features, dims, shrink=0.0), projection)
    partial = (u @ whitening_projection(features, dims, shrink=1.0)).pow(2).mean(0)
    assert partial[0] > 1.5 * partial[-1], "partial whitening keeps the leading direction's larger variance"
    with pytest.raises(ValueError, match="dims"):
        whitening_projection(features, d + 1)
    # fewer rows than dimensions (a small prior): the rows' SVD gives the moment's own leading directions
    few = features[:12]
    u_few = (few / few.norm(dim=1, keepdim=True)).double()
    _, reference = torch.linalg.eigh(u_few.T @ u_few)
    fitted = whitening_projection(few, dims).double()
    cosines = (fitted / fitted.norm(dim=0)).T @ reference.flip(1)[:, :dims]
    assert torch.allclose(cosines.diagonal().abs(), torch.ones(dims, dtype=torch.float64), atol=1e-5)
    z_few = u_few @ fitted
    assert torch.allclose(z_few.T @ z_few / (z_few.T @ z_few).diagonal().mean(), torch.eye(dims, dtype=torch.float64),
                          atol=1e-4), "whitened on the rows it was fitted to"


def test_scatter_prior_projection_is_fitted_without_data_and_saved_with_the_model(tmp_path):
    from privdistill.engine.run import RunDir
    from privdistill.errors import ModelError
    from privdistill.models.scatternet import ScatterNet

    model = ScatterNet(1, 10, 28, prior="dead-leaves", prior_dims=32, prior_images=300)
    x = torch.rand(4, 1, 28, 28) * 2 - 1
    with pytest.raises(ModelError, match="not fitted"):
        model(x)
    model.fit_prior()
    assert model.scatter(x).shape == (4, 32, 1, 1) and model(x).shape == (4, 10)
    again = ScatterNet(1, 10, 28, prior="dead-leaves", prior_dims=32, prior_images=300)
    again.fit_prior()
    assert torch.equal(again.prior_projection, model.prior_projection), "a public seed: the same projection"
    assert model.transform_id != ScatterNet(1, 10, 28).transform_id, "its features are cached apart"
    run = RunDir(tmp_path / "run")
    run.save_weights("model", model)
    reloaded = run.load_weights("model", ScatterNet(1, 10, 28, prior="dead-leaves", prior_dims=32, prior_images=300))
    assert torch.equal(reloaded(x), model(x)), "the released weights carry the projection"
    with pytest.raises(ModelError, match="prior must be one of"):
        ScatterNet(1, 10, 28, prior="dead leaves")
    textured = ScatterNet(1, 10, 28, prior="dead-leaves-textured", prior_dims=32, prior_images=300)
    textured.fit_prior()
    assert textured.transform_id != model.transform_id, "the textured prior's projection is cached apart"
    assert not torch.allclose(textured.prior_projection, model.prior_projection), "fitted on other images"


def test_fine_scale_sits_beside_the_coarse_one():
    from privdistill.models.scatternet import ScatterNet

    x = torch.rand(3, 1, 28, 28) * 2 - 1
    coarse, both = ScatterNet(1, 10, 28), ScatterNet(1, 10, 28, fine=True)
    features = both.scatter(x)
    assert features.shape == (3, 81 * 7 * 7 + 9 * 14 * 14, 1, 1) and both(x).shape == (3, 10)
    assert torch.allclose(features[:, :81 * 49, 0, 0], coarse.scatter(x).flatten(1)), "the coarse part unchanged"
    fine = features[:, 81 * 49:, 0, 0].reshape(3, 9, 14 * 14)
    assert torch.allclose(fine.mean(2), torch.zeros(3, 9), atol=1e-5), "each fine channel normalised alone"
    assert both.transform_id != coarse.transform_id
    prior = ScatterNet(1, 10, 28, prior="dead-leaves-textured", prior_dims=16, prior_images=100, fine=True)
    prior.fit_prior()
    assert prior.prior_projection.shape == (81 * 49 + 9 * 196, 16) and prior(x).shape == (3, 10)


def test_scatter_prior_dpsgd_release(tiny_npz, tmp_path, monkeypatch):
    from privdistill.models import scatternet

    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(scatternet, "PRIOR_DIMS", 48)
    monkeypatch.setattr(scatternet, "PRIOR_IMAGES", 400)
    s = _run(tiny_npz, tmp_path, "prior", ["dpsgd.model=scatter-prior-linear", "dpsgd.lr=1"])
    assert s["not_covered"] == [] and s["epsilon_strict"] <= 8 and s["model"] == "scatter-prior-linear"
    assert s["test_accuracy"] > 0.5
    from privdistill.data import load_data
    from privdistill.engine.context import Env
    from privdistill.engine.run import RunDir
    from privdistill.engine.trainer import evaluate

    model = RunDir(tmp_path / "prior").load_weights("model")  # rebuilt through the registry, projection included
    assert evaluate(model, load_data(f"npz:{tiny_npz}").test, Env.cpu()) == pytest.approx(s["test_accuracy"],
                                                                                         abs=1e-4)
    assert len(list((tmp_path / "cache").glob("scatter-prior-*"))) == 1, "the projection is a cached stage"


def test_feature_statistics_of_a_prior_model_are_read_before_its_projection():
    """A generator fitted to a DP prior-ScatterNet matches statistics of the normalised scattering coefficients:
    the whitened projection's coordinates have near-fixed statistics on any images (docs/research-log.md, the
    prior-teacher SRR end-to-end cell). The wrapped model answers as the model does, and its statistics layer sees
    the coefficients, whose features stage the model's `scattering_only` twin names."""
    from privdistill.engine.datafree import BatchNormStatistics, WithFeatureStatistics
    from privdistill.models.scatternet import ScatterNet

    x = torch.rand(4, 1, 28, 28) * 2 - 1
    model = ScatterNet(1, 10, 28, prior="dead-leaves-textured", prior_dims=16, prior_images=100, fine=True)
    model.fit_prior()
    coefficients = model.normalised_scattering(x).flatten(1)
    twin = model.scattering_only()
    assert twin.prior == "none" and twin.fine and torch.allclose(twin.scatter(x).flatten(1), coefficients)
    assert twin.transform_id == ScatterNet(1, 10, 28, fine=True).transform_id, "the coefficients' cached stage"
    d = coefficients.shape[1]
    wrapped = WithFeatureStatistics(model, coefficients.mean(0), coefficients.var(0, unbiased=False)).eval()
    assert torch.allclose(wrapped(x), model(x), atol=1e-5)
    bn = BatchNormStatistics(wrapped)
    wrapped(x)
    assert bn.pop().item() < 1e-3, "statistics of these very images: matched"
    wrapped(torch.zeros(4, 1, 28, 28))
    assert bn.pop().item() > 1e-2 and wrapped.statistics.running_mean.shape == (d,)
    plain = ScatterNet(1, 10, 28)
    assert torch.allclose(WithFeatureStatistics(plain, torch.zeros(81 * 49), torch.ones(81 * 49))(x), plain(x))


def test_ghost_clipping_trains_the_head_as_the_per_example_gradients_do(tiny_npz, tmp_path):
    """Opacus's fast gradient clipping (the quickstart recipe's): the same clipping without per-example gradients,
    the same accountant; it refuses augmented copies, whose loss is not per example."""
    ghost = _run(tiny_npz, tmp_path, "ghost", ["dpsgd.grad_sample_mode=ghost", "run.noise=reproducible"])
    hooks = _run(tiny_npz, tmp_path, "hooks", ["run.noise=reproducible"])
    assert ghost["epsilon_strict"] == hooks["epsilon_strict"] and ghost["noise_secure"] is False
    assert ghost["dpsgd_accounting"]["steps"] == hooks["dpsgd_accounting"]["steps"]
    assert ghost["test_accuracy"] > 0.5 and abs(ghost["test_accuracy"] - hooks["test_accuracy"]) < 0.1
    with pytest.raises(ConfigError, match="ghost"):
        _run(tiny_npz, tmp_path, "copies", ["dpsgd.grad_sample_mode=ghost", "dpsgd.augment_copies=2",
                                             "dpsgd.augment=affine"])
