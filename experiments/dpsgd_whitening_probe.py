"""Probe (issue 26): does a preconditioner of the ScatterNet features help DP-SGD's linear head, and can one be had
without spending privacy? Evaluation on the cached features; one JSON line per setting.

DP-SGD here is the `--config scatternet` recipe written out for a linear softmax head (its per-example gradient is
(softmax - onehot) ⊗ [z, 1], so clipping and noise need no Opacus; about 7 s a setting instead of a minute):
Poisson batches at rate B / n, each example's gradient clipped to C, N(0, σ²C²) added, SGD with momentum 0.9,
zero initialisation. σ is calibrated on dp-accounting's replace-one PLD ε of everything the setting releases
(the DP-SGD steps, and a DP second-moment matrix where one is used), as `privdistill dpsgd` does.

Features z (each example's GroupNorm'd scattering vector x, scaled to unit norm u = x / ||x||):
- "raw": x itself (the packaged recipe);
- "pca-exact": u projected onto the top-k eigenvectors of the training set's own second moment Σ u uᵀ (optionally
  whitened): reads the private data WITHOUT noise, so not a release; the ceiling of such a preconditioner;
- "pca-dp": the same from Σ u uᵀ + symmetric Gaussian noise (Dwork et al. 2014, "Analyze Gauss": replace-one
  Frobenius sensitivity √2 for unit-norm rows), noise multiplier zA, composed with the DP-SGD steps;
- "standardize": per-feature mean and standard deviation of the training set (exact, not a release);
- "prior": whitening fitted to images of a random process ("dead-leaves", "dead-leaves-textured", "spectrum",
  "mix" (half dead leaves, half spectrum), "noise", "smooth-noise"), no data read; "dead-leaves" with k = 800 is
  models/random_prior.py's, what `--config scatternet-prior` releases; "shrink" s whitens only partly (each
  direction scaled by 1 / sqrt(λ + s · mean λ)); "dead_leaves" passes the process's parameters (max_radius, shapes);
- "prior-dp": the prior's k directions, then whitening by a DP second moment of the private data in those k
  dimensions (Analyze Gauss with multiplier zA, composed into the ε), shrunk by "alpha" · mean eigenvalue;
- "prior-dpdiag": the prior's k directions, each rescaled by its variance on the private data (k sums of squared
  coordinates of unit rows, one Gaussian release with multiplier zA, composed into the ε) plus "alpha" · mean.
- "hybrid": the private data's top-j directions of Σ u uᵀ (exact, or with Analyze Gauss's noise when zA is given),
  each at unit variance times "top_weight", beside the prior's projection of what they leave (a ceiling when exact).
"prior-dp" with "block" r re-whitens only the prior's first r directions (an r x r release), the other k - r at the
mean private variance they are left; zA = 0 is the exact (non-private) re-whitening, a ceiling.
Every projected z is rescaled so that its median norm on the images it was fitted to is sqrt(d), the norm of x.

    python experiments/dpsgd_whitening_probe.py fashion-mnist \
        '[{"features": "raw", "lr": 4}, {"features": "prior", "prior": "dead-leaves", "k": 800, "lr": 1}]'

A third argument `--fine` reads both scattering scales (J = 2 and J = 1 at twice the resolution, models/scatternet.py's
`fine`, as model scatter-multiscale-prior-linear) for the features and the prior.

Keys: features (above), k, whiten (pca-*: scale each direction to unit variance), zA (pca-dp), prior, m (prior
images, 30000), prior_seed (the dead-leaves draw, models/random_prior.PRIOR_SEED), eps (strict
target, 1; calibration floors σ at 0.3, so a large eps is a nearly noiseless run), B (1024), E (5), lr, C (0.1),
seed (0), nonprivate (Adam, 6 epochs, best epoch: capacity, no release), rf (append that many random ReLU features
of the projected z, a fixed public map: `random_features`), rf_seed (7), rf_weight (1), schedule ("linear": the
rate decays linearly to 0), ema (evaluate an exponential average of the iterates with this decay), opt ("adam": Adam
on the noised gradients, post-processing; with bc, DP-AdamBC's removal of the noise variance from the second moment,
floored at gamma), renorm (each projected row scaled to the median norm), loss ("ce", "ce-tau" with tau, "hinge"
with margin: `residual`); the dead-leaves processes also take "mirror" and "envelope" in "dead_leaves" (objects
centred and symmetric: `object_like`); init ("zero", the default, or "uniform": PyTorch's
nn.Linear initialisation); power (each coefficient of the private and the prior's features to sign(x) |x|^power
before the projection: `signed_power`). A further argument `--coarse` adds a J = 3 scattering beside the scales
the features and the prior are read at (`features_of`). `--flip` reads every image's features symmetrised under a
left-right flip, (f(x) + f(flip x)) / 2, for the private data and the prior alike (a fixed public map; `flipped`).
bands (amplified banded matrix factorisation, `banded_sqrt`: correlated noise, the examples in that many fixed groups;
1, the default, is DP-SGD). The settings were compared on the test set, as in the sweep of docs/research-log.md; that
selection is priced by no ε.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings

import dp_accounting
import torch
import torch.nn.functional as F
from dp_accounting.pld import pld_privacy_accountant

from privdistill.data import load_data
from privdistill.data.dataset import to_float
from privdistill.engine.cache import StageCache
from privdistill.engine.context import Env
from privdistill.engine.run import RunDir
from privdistill.engine.stages import Stages
from privdistill.models.random_prior import PRIOR_SEED, dead_leaves, whitening_projection
from privdistill.models.scatternet import PRIORS, ScatterNet, make_scattering


def banded_sqrt(bands: int) -> torch.Tensor:
    """The first `bands` coefficients of the square root of the prefix-sum matrix's generating function,
    (1 - x)^(-1/2) = sum_k binom(2k, k) / 4^k x^k, scaled so that every column of the banded Toeplitz matrix has
    norm <= 1 (Kalinin & Lampert 2024, "banded square root" factorisation; bands = 1 is DP-SGD)."""
    c = torch.tensor([math.comb(2 * j, j) / 4 ** j for j in range(bands)], dtype=torch.float64)
    return c / c.norm()


def total_epsilon(sigma: float, q: float, steps: int, analyze_gauss: float = 0.0, delta: float = 1e-5) -> float:
    acc = pld_privacy_accountant.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    if analyze_gauss:  # one release at q = 1; dp-accounting's replace-one unit is sensitivity 2
        acc.compose(dp_accounting.PoissonSampledDpEvent(1.0, dp_accounting.GaussianDpEvent(analyze_gauss)), 1)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def calibrate(target: float, q: float, steps: int, analyze_gauss: float) -> float:
    lo, hi = 0.3, 100.0
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if total_epsilon(mid, q, steps, analyze_gauss) > target else (lo, mid)
    return hi


def prior_images(kind: str, m: int, seed: int, like, shape_args: tuple = ()) -> torch.Tensor:
    if kind in ("dead-leaves", "dead-leaves-textured"):  # the models' processes, flat or textured (models.scatternet)
        args = dict(shape_args)
        mirror, envelope = args.pop("mirror", 0.0), args.pop("envelope", 0.0)
        images = dead_leaves(m, channels=like.channels, size=like.image_size, seed=seed, texture=PRIORS[kind], **args)
        return object_like(images, mirror, envelope, seed)
    if kind == "spectrum":  # random fields whose power falls as 1 / f^a, a in [1, 3] per image (Baradad's "spectrum")
        return spectrum_images(m, like, seed)
    if kind == "mix":  # half dead leaves, half spectrum
        half = m // 2
        return torch.cat([dead_leaves(half, channels=like.channels, size=like.image_size, seed=seed),
                          spectrum_images(m - half, like, seed + 1)])
    g = torch.Generator().manual_seed(5)
    if kind == "noise":
        return torch.rand(m, like.channels, *like.image_size, generator=g) * 2 - 1
    smooth = F.avg_pool2d(F.pad(torch.randn(m, like.channels, *like.image_size, generator=g), (2,) * 4,
                                mode="reflect"), 5, 1)
    return smooth / smooth.abs().amax((1, 2, 3), keepdim=True)


def object_like(images: torch.Tensor, mirror: float, envelope: float, seed: int) -> torch.Tensor:
    """Dead leaves shaped like the centred objects of MNIST and Fashion-MNIST (a public fact of both datasets, no
    data read): a share `mirror` of the images made left-right symmetric (the left half reflected onto the right),
    and with `envelope` > 0 everything outside a centred ellipse of half-axes uniform in [envelope, 14] pixels set
    to the background. Both 0: the images unchanged."""
    m, _, h, w = images.shape
    g = torch.Generator().manual_seed(seed + 7)
    if mirror:
        symmetric_images = torch.cat([images[..., : w // 2], images[..., : w // 2].flip(-1)], -1)
        images = torch.where((torch.rand(m, generator=g) < mirror)[:, None, None, None], symmetric_images, images)
    if envelope:
        yy, xx = torch.meshgrid(torch.arange(h) - (h - 1) / 2, torch.arange(w) - (w - 1) / 2, indexing="ij")
        ry, rx = (envelope + torch.rand(m, generator=g) * (14 - envelope) for _ in range(2))
        inside = (yy[None] / ry[:, None, None]) ** 2 + (xx[None] / rx[:, None, None]) ** 2 <= 1
        images = torch.where(inside[:, None], images, torch.full_like(images, -1.0))
    return images


def spectrum_images(m: int, like, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    h, w = like.image_size
    fy, fx = torch.fft.fftfreq(h)[:, None], torch.fft.rfftfreq(w)[None, :]
    f = (fy ** 2 + fx ** 2).sqrt().clamp_min(1.0 / max(h, w))
    a = 1 + 2 * torch.rand(m, 1, 1, generator=g)
    spec = torch.complex(torch.randn(m, h, w // 2 + 1, generator=g), torch.randn(m, h, w // 2 + 1, generator=g))
    x = torch.fft.irfft2(spec / f[None] ** a, s=(h, w))
    x = x - x.amin((1, 2), keepdim=True)
    return (2 * x / x.amax((1, 2), keepdim=True).clamp_min(1e-12) - 1)[:, None].repeat(1, like.channels, 1, 1)


PRIOR_FEATURES: dict[tuple[str, int, int], torch.Tensor] = {}
DP_STATISTICS = ("pca-dp", "prior-dp", "prior-dpdiag", "hybrid")  # the features that release a statistic (zA, in the ε)


def release_noise(c: dict, *shape: int) -> torch.Tensor:
    """The Gaussian noise of a released statistic of unit rows (Analyze Gauss's; replace-one sensitivity sqrt(2),
    multiplier c["zA"]), float64, from its own stream (seed + 99)."""
    g = torch.Generator().manual_seed(c.get("seed", 0) + 99)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * c["zA"] * math.sqrt(2) / 2


def symmetric(noise: torch.Tensor) -> torch.Tensor:
    return torch.triu(noise) + torch.triu(noise, 1).T


def eigen(moment: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, vectors = torch.linalg.eigh(moment)
    return values.flip(0)[:k], vectors.flip(1)[:, :k]


def project(c: dict, u: torch.Tensor, ut: torch.Tensor, model, data) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = u.shape
    kind, k = c["features"], c.get("k", d)
    if kind == "prior":
        shape_args = tuple(sorted((name, tuple(v) if isinstance(v, list) else v)
                                  for name, v in c.get("dead_leaves", {}).items()))
        key = (c["prior"], c.get("m", 30000), c.get("prior_seed", PRIOR_SEED), shape_args)
        if key not in PRIOR_FEATURES:  # the random-process images' features, once per process
            with torch.no_grad():
                images = prior_images(*key[:3], data.train, shape_args)
                PRIOR_FEATURES[key] = torch.cat([features_of(model, images[i:i + 1000])
                                                 for i in range(0, len(images), 1000)])
        p = whitening_projection(signed_power(PRIOR_FEATURES[key], c.get("power", 1.0)), k, shrink=c.get("shrink", 0.0))
        return u @ p, ut @ p
    if kind == "prior-dp":  # the prior's projection, then a DP second moment of the private data in its k dimensions
        z, zt = project({**c, "features": "prior"}, u, ut, model, data)
        w, wt = z / z.norm(dim=1, keepdim=True), zt / zt.norm(dim=1, keepdim=True)
        r = c.get("block", k)  # re-whiten only the prior's first r directions (a smaller release: less noise)
        values, vectors = torch.linalg.eigh(w[:, :r].T.double() @ w[:, :r].double() + symmetric(release_noise(c, r, r)))
        values = values.clamp_min(0) / n
        # shrunk towards the prior's own whitening: alpha * mean is the floor under every direction's variance; the
        # mean variance of a unit row's k coordinates is 1 / k, public
        floor = c.get("alpha", 1.0) / k
        p = torch.eye(k, dtype=torch.float64)
        p[:r, :r] = (vectors / (values + floor).sqrt()) @ vectors.T
        if r < k:  # the other directions at the variance the block leaves them on average (from the noisy trace)
            p[r:, r:] /= math.sqrt(max(1 - float(values.sum()), 1e-3) / (k - r) + floor)
        p = p.float()
        scale = math.sqrt(d) / (w @ p).norm(dim=1).median()  # (the median of private norms: not priced; a probe)
        return w @ p * scale, wt @ p * scale
    if kind == "prior-dpdiag":  # the prior's k directions, then each one's private variance under DP (k numbers)
        z, zt = project({**c, "features": "prior"}, u, ut, model, data)
        w, wt = z / z.norm(dim=1, keepdim=True), zt / zt.norm(dim=1, keepdim=True)
        # a unit row's squared coordinates have L2 norm <= 1: replace-one sensitivity sqrt(2), as Analyze Gauss's
        sums = w.double().pow(2).sum(0) + release_noise(c, k)
        variances = sums.clamp_min(0) / n
        p = (1 / (variances + c.get("alpha", 0.1) * variances.mean()).sqrt()).float()
        scale = math.sqrt(d) / (w * p).norm(dim=1).median()  # (the median of private norms: not priced; a probe)
        return w * p * scale, wt * p * scale
    if kind == "hybrid":  # the private data's own top-j directions (exact, or DP with zA), the prior for the rest
        j = c["j"]
        moment = u.T.double() @ u.double()
        if c.get("zA"):
            moment = moment + symmetric(release_noise(c, d, d))
        values, vectors = eigen(moment, j)
        v = vectors.float()
        top = v / (values.clamp_min(1e-12) / n).sqrt().float()  # each of the j directions to unit variance
        rest, rest_t = project({**c, "features": "prior"}, u - (u @ v) @ v.T, ut - (ut @ v) @ v.T, model, data)
        # a top coordinate (unit variance) at the rms of a prior coordinate, times top_weight
        scale = rest.norm(dim=1).median() / math.sqrt(rest.shape[1]) * c.get("top_weight", 1.0)
        f, ft = torch.cat([u @ top * scale, rest], 1), torch.cat([ut @ top * scale, rest_t], 1)
        norm = math.sqrt(d) / f.norm(dim=1).median()  # (the median of private norms: not priced; a probe)
        return f * norm, ft * norm
    if kind == "standardize":
        mean, std = u.mean(0), u.std(0)
        z, zt = (u - mean) / std, (ut - mean) / std
        return z, zt  # per coordinate unit variance: norm about sqrt(d)
    moment = u.T.double() @ u.double()
    if kind == "pca-dp":
        moment = moment + symmetric(release_noise(c, d, d))
    values, vectors = eigen(moment, k)
    p = vectors / (values.clamp_min(1e-12) / n).sqrt() if c.get("whiten") else vectors
    p = p.float()
    z = u @ p
    p = p * (math.sqrt(d) / z.norm(dim=1).median())  # (on the private data: part of what this ceiling reads)
    return u @ p, ut @ p


def signed_power(x: torch.Tensor, power: float) -> torch.Tensor:
    """sign(x) |x|^power, coefficient by coefficient (a fixed public map; power 1 leaves x as it is): with power < 1
    the heavy tails of the normalised scattering coefficients are compressed, as power normalisation does for
    Fisher vectors (Perronnin et al. 2010)."""
    return x if power == 1 else x.sign() * x.abs().pow(power)


def random_features(c: dict, z: torch.Tensor, zt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append c["rf"] random ReLU features of the projected z (a fixed public map, no data read): each z is scaled
    to norm sqrt(k), multiplied by a Gaussian matrix N(0, 1/k) drawn from c["rf_seed"], rectified and centred by
    the public constant E[relu(N(0, 1))]; the blocks are weighted 1 : c["rf_weight"] and the whole rescaled to the
    median norm sqrt(d) of the features before (the median read on the private data: a probe)."""
    k, m = z.shape[1], c["rf"]
    g = torch.Generator().manual_seed(c.get("rf_seed", 7))
    r = torch.randn(k, m, generator=g) / math.sqrt(k)
    target = z.norm(dim=1).median()

    def expand(v: torch.Tensor) -> torch.Tensor:
        w = v / v.norm(dim=1, keepdim=True) * math.sqrt(k)
        h = (w @ r).relu() - 1 / math.sqrt(2 * math.pi)
        return torch.cat([w, h * c.get("rf_weight", 1.0)], 1)

    f, ft = expand(z), expand(zt)
    scale = target / f.norm(dim=1).median()
    return f * scale, ft * scale


def residual(c: dict, logits: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """The per-example gradient of the loss with respect to the logits (the head's gradient is its outer product
    with [z, 1]). "ce": softmax minus one-hot (the recipe); "ce-tau": the same, zero where the head already gives
    the true class more than "tau" (clipped examples then spend no step on easy ones); "hinge": Crammer-Singer's
    multi-class hinge with margin "margin" (1), the most violating other class against the true one."""
    loss = c.get("loss", "ce")
    p = logits.softmax(1)
    if loss == "ce":
        return p - onehot
    if loss == "ce-tau":
        return (p - onehot) * ((p * onehot).sum(1, keepdim=True) < c["tau"]).float()
    others = logits.masked_fill(onehot.bool(), float("-inf"))
    violated = c.get("margin", 1.0) + others.amax(1) - (logits * onehot).sum(1) > 0
    return (F.one_hot(others.argmax(1), onehot.shape[1]).float() - onehot) * violated[:, None].float()


def dpsgd(c: dict, z, zt, y, yt) -> dict:
    n, k = z.shape
    B, E, lr, C = c.get("B", 1024), c.get("E", 5), c["lr"], c.get("C", 0.1)
    q = B / n
    per_epoch = round(1 / q)
    steps = per_epoch * E
    analyze_gauss = c.get("zA", 0.0) if c["features"] in DP_STATISTICS else 0.0  # a released statistic's multiplier
    # "bands": amplified banded matrix factorisation (Choquette-Choo et al. 2023): the examples are split into
    # `bands` fixed groups (a public permutation), step s samples group s mod bands at rate bands * q, and the noise
    # is C^-1 z for a banded lower-triangular Toeplitz C with column norms <= 1. An example's participations are
    # >= bands steps apart, so they touch disjoint row blocks of C: the same PLD as DP-SGD at rate bands * q for
    # ceil(steps / bands) steps (their Thm 4; replace-one through dp-accounting's REPLACE pair, as for DP-SGD).
    bands = c.get("bands", 1)
    coef = banded_sqrt(bands).float()
    groups = torch.randperm(n, generator=torch.Generator().manual_seed(12345)) % bands
    q_band, rounds = min(1.0, q * bands), -(-steps // bands)
    sigma = calibrate(c.get("eps", 1.0), q_band, rounds, analyze_gauss)
    history: list = []  # the last bands - 1 correlated noises (W, b)
    g = torch.Generator().manual_seed(c.get("seed", 0))
    W, b = torch.zeros(10, k), torch.zeros(10)
    if c.get("init") == "uniform":  # PyTorch's nn.Linear default, U(-1/sqrt(k), 1/sqrt(k)) (the CLI's before head_init)
        gi = torch.Generator().manual_seed(c.get("seed", 0) + 31)
        W, b = ((torch.rand(*shape, generator=gi) * 2 - 1) / math.sqrt(k) for shape in ((10, k), (10,)))
    mW, mb = torch.zeros_like(W), torch.zeros_like(b)
    aW, ab = W, b  # the average of the iterates ("ema"), restarted at the first step
    adam_state = (torch.zeros_like(W), torch.zeros_like(b))
    onehot, curve = F.one_hot(y, 10).float(), []
    for s in range(steps):
        idx = torch.nonzero((torch.rand(n, generator=g) < q_band) & (groups == s % bands)).squeeze(1)
        r = residual(c, z[idx] @ W.T + b, onehot[idx])
        scale = (C / (r.norm(dim=1) * (z[idx].pow(2).sum(1) + 1).sqrt()).clamp_min(1e-12)).clamp(max=1.0)
        zW, zb = torch.randn(10, k, generator=g) * sigma * C, torch.randn(10, generator=g) * sigma * C
        for j, (hW, hb) in enumerate(reversed(history)):  # forward substitution: (C n)_s = z_s
            zW, zb = zW - coef[j + 1] * hW, zb - coef[j + 1] * hb
        nW, nb = zW / coef[0], zb / coef[0]
        history = (history + [(nW, nb)])[-(bands - 1):] if bands > 1 else []
        gW = ((r * scale[:, None]).T @ z[idx] + nW) / B
        gb = ((r * scale[:, None]).sum(0) + nb) / B
        rate = lr * (1 - s / steps) if c.get("schedule") == "linear" else lr  # (the CLI's lr_schedule=linear)
        if c.get("opt") == "adam":  # Adam on the noised gradient (post-processing, no privacy cost)
            vW, vb = adam_state
            mW, mb = 0.9 * mW + 0.1 * gW, 0.9 * mb + 0.1 * gb
            vW, vb = 0.999 * vW + 0.001 * gW ** 2, 0.999 * vb + 0.001 * gb ** 2
            adam_state = (vW, vb)
            # DP-AdamBC (Tang et al. 2024): the noise's own variance (sigma C / B)^2 taken out of the second moment
            floor = (sigma * C / B) ** 2 if c.get("bc") else 0.0
            c1, c2 = 1 - 0.9 ** (s + 1), 1 - 0.999 ** (s + 1)
            den_W = ((vW / c2 - floor).clamp_min(c.get("gamma", 1e-12))).sqrt()
            den_b = ((vb / c2 - floor).clamp_min(c.get("gamma", 1e-12))).sqrt()
            W, b = W - rate * (mW / c1) / den_W, b - rate * (mb / c1) / den_b
        else:
            mW, mb = 0.9 * mW + gW, 0.9 * mb + gb
            W, b = W - rate * mW, b - rate * mb
        if c.get("ema"):  # an average of the iterates (post-processing), with TensorFlow's warm-up of the decay
            d = min(c["ema"], (1 + s) / (10 + s))
            aW, ab = (W, b) if s == 0 else (d * aW + (1 - d) * W, d * ab + (1 - d) * b)
        if (s + 1) % per_epoch == 0:
            hW, hb = (aW, ab) if c.get("ema") else (W, b)
            curve.append(round(float(((zt @ hW.T + hb).argmax(1) == yt).float().mean()), 4))
    eps = total_epsilon(sigma, q_band, rounds, analyze_gauss)
    return {"sigma": round(sigma, 4), "epsilon_strict": round(eps, 4), "accuracy": curve[-1], "curve": curve}


def nonprivate(z, zt, y, yt, epochs: int = 6) -> dict:
    torch.manual_seed(0)
    head = torch.nn.Linear(z.shape[1], 10)
    opt, best = torch.optim.Adam(head.parameters(), 1e-3), 0.0
    for _ in range(epochs):
        perm = torch.randperm(len(z))
        for i in range(0, len(z), 128):
            batch = perm[i:i + 128]
            opt.zero_grad()
            F.cross_entropy(head(z[batch]), y[batch]).backward()
            opt.step()
        with torch.no_grad():
            best = max(best, float((head(zt).argmax(1) == yt).float().mean()))
    return {"accuracy": round(best, 4)}


def scattering_features(dataset: str, fine: bool):
    """The dataset, its ScatterNet (with `fine`, both scattering scales: J = 2 and J = 1, models/scatternet.py's
    `fine`, for the prior and the head) and the cached features of its training and test sets, flattened."""
    data = load_data(dataset)
    model = ScatterNet(data.channels, data.num_classes, data.image_size[0], fine=fine)
    stages = Stages(StageCache(), Env.cpu(), data, RunDir("/tmp/privdistill-whitening-probe"))
    x, xt = (f.flatten(1).float() for f in stages.features(model))
    return data, model, x, xt


COARSE: list = []  # with --coarse: a J = 3 scattering beside the model's scales (`features_of`)
FLIP: list = []  # with --flip: features symmetrised under a left-right flip (`features_of`)


def features_of(model, images: torch.Tensor, mirror: bool | None = None) -> torch.Tensor:
    """The model's normalised scattering of float images, flattened; with --coarse, beside it a J = 3 scattering
    ([217 C, H/8, W/8] for L = 8, kymatio pads sides that 8 does not divide) normalised per example as one group;
    with --flip (or `mirror`), the mean of the images' features and their left-right mirror images'."""
    mirror = bool(FLIP) if mirror is None else mirror
    f = model.scatter(images).flatten(1)
    f = torch.cat([f, coarse_block(images)], 1) if COARSE else f
    return (f + features_of(model, images.flip(-1), mirror=False)) / 2 if mirror else f


def flipped(dataset: str, data, model) -> tuple[torch.Tensor, torch.Tensor]:
    """The features of the left-right flipped training and test images (cached in /tmp: minutes of CPU)."""
    return cached_in_tmp(
        f"privdistill-whitening-probe-flip-{dataset}-{model.transform_id}{'-coarse' if COARSE else ''}",
        lambda: tuple(torch.cat([features_of(model, to_float(split.images[i:i + 1000]).flip(-1), mirror=False)
                                 for i in range(0, len(split), 1000)]) for split in (data.train, data.test)))


def cached_in_tmp(name: str, build) -> tuple[torch.Tensor, torch.Tensor]:
    """`build()`'s training and test features, saved as /tmp/NAME.pt the first time and read from there after."""
    path = f"/tmp/{name}.pt"
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        pass
    saved = build()
    torch.save(saved, path)
    return saved


def coarse_features(dataset: str, data) -> tuple[torch.Tensor, torch.Tensor]:
    """The J = 3 block of the training and test images (cached in /tmp: minutes of CPU)."""
    return cached_in_tmp(f"privdistill-whitening-probe-coarse-{dataset}",
                         lambda: tuple(torch.cat([coarse_block(split.images[i:i + 1000])
                                                  for i in range(0, len(split), 1000)])
                                       for split in (data.train, data.test)))


def coarse_block(images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        coarse = COARSE[0](to_float(images)).flatten(1)
    return (coarse - coarse.mean(1, keepdim=True)) / coarse.std(1, keepdim=True).clamp_min(1e-5)


def main() -> None:
    warnings.simplefilter("ignore")
    dataset, settings = sys.argv[1], json.loads(sys.argv[2])
    data, model, x, xt = scattering_features(dataset, fine="--fine" in sys.argv[3:])
    if "--coarse" in sys.argv[3:]:
        COARSE.append(make_scattering(data.image_size, J=3))
        c, ct = coarse_features(dataset, data)
        x, xt = torch.cat([x, c], 1), torch.cat([xt, ct], 1)
    if "--flip" in sys.argv[3:]:
        f, ft = flipped(dataset, data, model)
        x, xt = (x + f) / 2, (xt + ft) / 2
        FLIP.append(True)
    for c in settings:
        started = time.time()
        xp, xpt = (signed_power(f, c.get("power", 1.0)) for f in (x, xt))
        u, ut = xp / xp.norm(dim=1, keepdim=True), xpt / xpt.norm(dim=1, keepdim=True)
        z, zt = (xp, xpt) if c["features"] == "raw" else project(c, u, ut, model, data)
        if c.get("rf"):
            z, zt = random_features(c, z, zt)
        if c.get("renorm"):  # every projected row to one norm (their median on the private rows: a probe, unpriced)
            norm = z.norm(dim=1).median()
            z, zt = (f / f.norm(dim=1, keepdim=True) * norm for f in (z, zt))
        row = nonprivate(z, zt, data.train.labels, data.test.labels) if c.get("nonprivate") else \
            dpsgd(c, z, zt, data.train.labels, data.test.labels)
        print(json.dumps({"dataset": dataset, **c, **row, "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
