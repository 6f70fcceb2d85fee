"""ScatterNet classifiers (Tramèr & Boneh, "Differentially private learning needs better features (or much more
data)", ICLR 2021): a fixed scattering transform, a data-independent normalisation, and a small trainable head.

    image [C, H, W] -> scattering, J = 2, L = 8 (kymatio; no parameters)  -> [81 C, H/4, W/4]
                    -> GroupNorm without affine parameters (per example: needs no statistics of the data)
                    -> optionally (`fine=True`, model scatter-multiscale-prior-linear) beside it a J = 1
                       scattering, [9 C, H/2, W/2], each channel GroupNorm'd alone; both scales flattened together
                    -> optionally (`prior="dead-leaves"`, model scatter-prior-linear, or "dead-leaves-textured",
                       scatter-textured-prior-linear and the multiscale model): a fixed projection onto
                       `prior_dims` directions whitened on images of a random process, fitted from a public seed
                       without any data (models/random_prior.py) -> [prior_dims, 1, 1]
                    -> head: "linear" (one linear layer) or "cnn" (their small CNN on ScatterNet features: 3x3
                       convolutions of 16 (stride 2) and 32 channels, a hidden layer of 32, tanh throughout)

Only the head has parameters, so DP-SGD (methods/dpsgd.py) trains the head on the scattering features computed
once: the transform is a fixed function of each image (no privacy cost, and the released model contains it).

Reading chosen where the paper leaves room: Tramèr & Boneh's best MNIST/Fashion-MNIST models normalise with
per-channel statistics estimated under DP (a small share of the budget); this module uses GroupNorm instead,
which they also report and which needs no privacy budget at all. The scattering transform is held outside the
module tree (it is rebuilt from (J, L, image size), not saved): a saved model is only its head.

kymatio note: `import kymatio.torch` fails with SciPy >= 1.15 (it imports scipy.special.sph_harm for the 3-D
transform); the 2-D frontend is imported directly.
"""

from __future__ import annotations

import torch
from torch import nn

from privdistill.errors import ModelError
from privdistill.models.random_prior import PRIOR_TEXTURE, dead_leaves, unit_rows, whitening_projection
from privdistill.models.registry import register_model

SCATTER_ORDERS = 81  # 1 + J L + L^2 J (J - 1) / 2 coefficients per input channel at J = 2, L = 8
FINE_ORDERS = 9  # the same at J = 1: 1 + L
#: scatter-prior-linear's projection: its whitened dimensions (on Fashion-MNIST at strict ε = 1, 600, 800 and 1,000
#: within 0.2 points) and the dead-leaves images it is fitted on (with 30,000 the draw moved the cell by 0.3 points;
#: 100,000 estimate the process's moments more closely, a one-off 2 minutes on 2 cores; docs/research-log.md)
PRIOR_DIMS, PRIOR_IMAGES = 800, 100_000
#: the random processes a prior projection is fitted on -> their texture amplitude (models/random_prior.py)
PRIORS = {"none": 0.0, "dead-leaves": 0.0, "dead-leaves-textured": PRIOR_TEXTURE}
#: the registered ScatterNets with a linear head: the ones whose features take augmented copies (methods/dpsgd.py)
LINEAR_SCATTERNETS = ("scatter-linear", "scatter-prior-linear", "scatter-textured-prior-linear",
                      "scatter-multiscale-prior-linear")


def make_scattering(image_size: tuple[int, int], *, J: int = 2, L: int = 8) -> nn.Module:
    try:
        from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D
    except ImportError as err:
        raise ModelError("ScatterNet models need kymatio: pip install 'privdistill[dpsgd]' (or pip install kymatio)"
                         ) from err
    return ScatteringTorch2D(J=J, shape=tuple(image_size), L=L)


class ScatterNet(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int | tuple[int, int] = 28,
                 head: str = "linear", groups: int = 27, width: int = 32, prior: str = "none",
                 prior_dims: int = PRIOR_DIMS, prior_images: int = PRIOR_IMAGES, fine: bool = False):
        super().__init__()
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
        if h % 4 or w % 4:
            raise ModelError(f"ScatterNet (J = 2) needs image sides divisible by 4, got {h}x{w}")
        channels = SCATTER_ORDERS * in_channels
        if channels % groups:
            raise ModelError(f"GroupNorm groups ({groups}) must divide the {channels} scattering channels")
        # not a submodule: a fixed function, rebuilt rather than saved (see _apply for device moves)
        object.__setattr__(self, "_scattering", make_scattering((h, w)))
        self.norm = nn.GroupNorm(groups, channels, affine=False)
        self.fine = fine
        scattered = channels * (h // 4) * (w // 4)
        if fine:  # J = 1 beside J = 2: the first order at twice the spatial resolution, each channel normalised alone
            if head != "linear":
                raise ModelError("the fine (J = 1) scattering feeds a linear head only")
            object.__setattr__(self, "_fine_scattering", make_scattering((h, w), J=1))
            fine_channels = FINE_ORDERS * in_channels
            self.fine_norm = nn.GroupNorm(fine_channels, fine_channels, affine=False)
            scattered += fine_channels * (h // 2) * (w // 2)
        if head == "linear":
            self.feature_dim = scattered
            # flattens the last three dims: [B, K, C, h, w] features (K augmented copies, methods/dpsgd.py) give
            # [B, K, classes]; the state dict is the same as with nn.Flatten()
            self.head = nn.Sequential(nn.Flatten(start_dim=-3), nn.Linear(self.feature_dim, num_classes))
        elif head == "cnn":  # Tramèr & Boneh's small CNN on scattering features (their MNIST model's shape)
            side = lambda n: (n + 1) // 2  # noqa: E731 - the stride-2 convolution's output side
            self.head = nn.Sequential(
                nn.Conv2d(channels, width // 2, 3, stride=2, padding=1), nn.Tanh(),
                nn.Conv2d(width // 2, width, 3, padding=1), nn.Tanh(), nn.Flatten(),
                nn.Linear(width * side(h // 4) * side(w // 4), width), nn.Tanh(), nn.Linear(width, num_classes))
            self.feature_dim = width
        else:
            raise ModelError(f"ScatterNet head must be 'linear' or 'cnn', got {head!r}")
        if prior not in PRIORS:
            raise ModelError(f"ScatterNet prior must be one of {sorted(PRIORS)}, got {prior!r}")
        self.prior, self.prior_images, self.image_shape = prior, prior_images, (in_channels, h, w)
        self.in_channels = in_channels
        # what the fixed features depend on (the head does not): the key of their cached stage
        self.transform_id = f"scattering-J2-L8-{in_channels}x{h}x{w}-groupnorm{groups}" + ("-fineJ1" if fine else "")
        if prior != "none":
            if head != "linear":
                raise ModelError("a ScatterNet prior projection feeds a linear head only")
            # buffers, saved with the weights: a released model carries its projection. Zero until fit_prior()
            # (or loading saved weights) fills them; scatter() refuses to run before that.
            prior_dims = min(prior_dims, scattered, prior_images)  # (small images have fewer coefficients)
            self.register_buffer("prior_projection", torch.zeros(scattered, prior_dims))
            self.register_buffer("prior_fitted", torch.zeros((), dtype=torch.bool))
            self.feature_dim = prior_dims
            self.head = nn.Sequential(nn.Flatten(start_dim=-3), nn.Linear(prior_dims, num_classes))
            self.transform_id += f"-{prior}-{prior_images}-whitened{prior_dims}"

    def _apply(self, fn, recurse=True):  # .to(device) / .float() reach the (unregistered) scattering too
        self._scattering._apply(fn, recurse)
        if self.fine:
            self._fine_scattering._apply(fn, recurse)
        return super()._apply(fn, recurse)

    def normalised_scattering(self, x: torch.Tensor) -> torch.Tensor:
        """The scattering coefficients, normalised per example: [B, 81 C, H/4, W/4], or with the fine scale both
        scales flattened side by side, [B, D, 1, 1] (the head's Flatten(-3) reads either)."""
        s = self.norm(self._scattering(x.float()).flatten(1, 2))  # [B, 81 C, H/4, W/4]
        if not self.fine:
            return s
        f = self.fine_norm(self._fine_scattering(x.float()).flatten(1, 2))  # [B, 9 C, H/2, W/2]
        return torch.cat([s.flatten(1), f.flatten(1)], 1)[:, :, None, None]

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """The fixed features the head reads: scattering coefficients, normalised per example (and, with a prior,
        projected onto its whitened directions: [B, prior_dims, 1, 1], so the head's Flatten(-3) reads both)."""
        return self.project(self.normalised_scattering(x))

    def project(self, s: torch.Tensor) -> torch.Tensor:
        """Normalised scattering coefficients -> the features the head reads (the prior's whitened projection, or
        the coefficients themselves without a prior)."""
        if self.prior == "none":
            return s
        if not bool(self.prior_fitted):
            raise ModelError("this ScatterNet's prior projection is not fitted: call fit_prior() or load its weights")
        return (unit_rows(s.flatten(1)) @ self.prior_projection)[:, :, None, None]

    def scattering_only(self) -> "ScatterNet":
        """A linear ScatterNet with this one's scattering and normalisation but no prior: its `scatter` is this
        model's `normalised_scattering` (whose cached features stage it names)."""
        return ScatterNet(self.in_channels, self.head[-1].out_features, self.image_shape[1:],
                          groups=self.norm.num_groups, fine=self.fine)

    def fit_prior(self, batch_size: int = 1000) -> None:
        """Fit the prior projection on `prior_images` dead-leaves images (a fixed public seed; no data is read).
        About 2 minutes for 100,000 images of 28 x 28 on 2 CPU cores; the `scatter_prior` stage caches it."""
        channels, h, w = self.image_shape
        images = dead_leaves(self.prior_images, channels=channels, size=(h, w), texture=PRIORS[self.prior])
        device = self.prior_projection.device
        with torch.no_grad():
            features = torch.cat([self.normalised_scattering(images[i:i + batch_size].to(device)).flatten(1).cpu()
                                  for i in range(0, len(images), batch_size)])
        self.prior_projection.copy_(whitening_projection(features, self.prior_projection.shape[1]))
        self.prior_fitted.fill_(True)

    # the classifier contract of every model here (models/cnn.py): forward = classifier(features)
    @property
    def classifier(self) -> nn.Module:
        return self.head[-1]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.head[:-1](self.scatter(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scatter(x))


@register_model("scatter-linear", kind="classifier",
                description="ScatterNet (kymatio, J=2, L=8) + GroupNorm + linear (Tramer & Boneh 2021), for DP-SGD")
def scatter_linear(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> ScatterNet:
    return ScatterNet(in_channels, num_classes, image_size, head="linear")


@register_model("scatter-prior-linear", kind="classifier",
                description="ScatterNet + GroupNorm + a projection whitened on dead-leaves images (no data) + linear")
def scatter_prior_linear(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> ScatterNet:
    return ScatterNet(in_channels, num_classes, image_size, head="linear", prior="dead-leaves", prior_dims=PRIOR_DIMS,
                      prior_images=PRIOR_IMAGES)


@register_model("scatter-textured-prior-linear", kind="classifier",
                description="ScatterNet + GroupNorm + a projection whitened on textured dead-leaves images + linear")
def scatter_textured_prior_linear(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> ScatterNet:
    return ScatterNet(in_channels, num_classes, image_size, head="linear", prior="dead-leaves-textured",
                      prior_dims=PRIOR_DIMS, prior_images=PRIOR_IMAGES)


@register_model("scatter-multiscale-prior-linear", kind="classifier",
                description="ScatterNet at J=2 and J=1 + GroupNorm + the textured dead-leaves projection + linear")
def scatter_multiscale_prior_linear(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> ScatterNet:
    return ScatterNet(in_channels, num_classes, image_size, head="linear", prior="dead-leaves-textured",
                      prior_dims=PRIOR_DIMS, prior_images=PRIOR_IMAGES, fine=True)


@register_model("scatter-cnn", kind="classifier",
                description="ScatterNet (kymatio, J=2, L=8) + GroupNorm + a small tanh CNN (Tramer & Boneh 2021)")
def scatter_cnn(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> ScatterNet:
    return ScatterNet(in_channels, num_classes, image_size, head="cnn")
