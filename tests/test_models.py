import pytest
import torch

from privdistill.errors import ModelError
from privdistill.models import create_model, list_models

CLASSIFIERS = [e.name for e in list_models("classifier")]


@pytest.mark.parametrize("name", CLASSIFIERS)
@pytest.mark.parametrize("channels,size,classes", [(1, 28, 10), (3, 32, 7)])
def test_every_classifier_trains_a_step(name, channels, size, classes, monkeypatch):
    from privdistill.models import scatternet

    monkeypatch.setattr(scatternet, "PRIOR_IMAGES", 200)  # a prior fitted on few images: the same code, quicker
    torch.manual_seed(0)
    model = create_model(name, in_channels=channels, num_classes=classes, image_size=size)
    if getattr(model, "prior", "none") != "none":  # a data-independent projection, fitted before use
        model.fit_prior()
    x = torch.randn(4, channels, size, size)
    logits = model(x)
    assert logits.shape == (4, classes) and torch.isfinite(logits).all()
    feats = model.features(x)
    assert feats.shape == (4, model.feature_dim)
    assert torch.allclose(model.classifier(feats), logits, atol=1e-5), "forward = classifier(features)"
    torch.nn.functional.cross_entropy(logits, torch.arange(4) % classes).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"parameters without a finite gradient: {missing}"


def test_paper_cnn_matches_the_papers_description():
    model = create_model("paper-cnn", in_channels=1, num_classes=10, image_size=28)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [64, 128]
    assert all(c.kernel_size == (3, 3) and c.stride == (1, 1) and c.padding == (1, 1) for c in convs)
    assert model.classifier.in_features == 128 * 7 * 7
    svhn = create_model("paper-cnn-svhn", in_channels=3, num_classes=10, image_size=32)
    assert [m.out_features for m in svhn.modules() if isinstance(m, torch.nn.Linear)] == [384, 192, 10]


@pytest.mark.parametrize("channels,size", [(1, 28), (3, 32), (1, 30)])
def test_generator_and_vae_shapes(channels, size):
    g = create_model("dafl-generator", out_channels=channels, image_size=size)
    x = g(g.sample_latent(5))
    assert x.shape == (5, channels, size, size) and x.min() >= -1 and x.max() <= 1
    vae = create_model("conv-vae", in_channels=channels, image_size=size, latent_dim=32)
    recon, mu, logvar = vae(x.detach())
    assert recon.shape == x.shape and mu.shape == (5, 32) and logvar.shape == (5, 32)
    assert vae.decode(mu).shape == x.shape


def test_generator_output_norm_standardises_a_fresh_generator():
    """DAFL's final BatchNorm: a fresh tanh-last generator emits near-constant grey images (the DPDFD
    Fashion-MNIST collapse); with output_norm the batch has unit spread. The default build records no
    output_norm kwarg, so generator stages cached before the option existed keep their keys and metadata."""
    torch.manual_seed(0)
    plain = create_model("dafl-generator", out_channels=1, image_size=28, width=16)
    torch.manual_seed(0)
    normed = create_model("dafl-generator", out_channels=1, image_size=28, width=16, output_norm=True)
    z = torch.randn(64, 100)
    with torch.no_grad():
        a, b = plain(z), normed(z)
    assert a.std() < 0.3
    assert abs(float(b.std()) - 1.0) < 0.05 and abs(float(b.mean())) < 0.05
    assert "output_norm" not in plain.registry_kwargs and normed.registry_kwargs["output_norm"] is True


def test_unknown_model_name_lists_the_choices():
    with pytest.raises(ModelError, match="unknown classifier model 'vgg'.*paper-cnn"):
        create_model("vgg", kind="classifier")
    with pytest.raises(ModelError, match="unknown generator model 'paper-cnn'"):
        create_model("paper-cnn", kind="generator")
