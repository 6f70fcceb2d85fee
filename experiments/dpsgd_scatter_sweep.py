"""Hyper-parameter sweep for DP-SGD on ScatterNet features (issue 26), on the cached features, several settings
in one process. It is how the `--config scatternet` recipe was chosen; every recorded cell is then re-run through
the CLI (`privdistill dpsgd --config scatternet`), which is what results/ holds.

Each setting: the head is trained with Opacus (Poisson batches, per-example clipping, SGD with momentum), σ
calibrated on the strict replace-one PLD ε exactly as `methods/dpsgd.py` does, test accuracy after every epoch.
The settings were compared on the test set, as in Tramèr & Boneh's own search; that selection is not priced by
any ε (see docs/research-log.md).

    python experiments/dpsgd_scatter_sweep.py mnist \
        '[{"B": 1024, "E": 5, "eps": 1, "lr": 4, "C": 0.1}, {"B": 1024, "E": 10, "eps": 3, "lr": 4, "C": 0.1}]'

Keys: B expected batch, E epochs, eps strict target, lr, C clip norm; optional model (scatter-linear), mom (0.9),
sched ("cos" for cosine decay), ema (a decay: also report an exponential moving average of the weights), seed;
copies (with augment, default shift): augmentation multiplicity, as `dpsgd.augment_copies`; bn_sigma: instead of
GroupNorm, normalise each scattering channel by a mean and variance estimated under DP (Tramèr & Boneh's MNIST
models): per-example channel means and mean squares, each vector clipped to norm 1 (every image in [-1, 1] meets
it on MNIST: the largest norms are 0.96 and 0.91, so nothing is clipped), summed, plus Gaussian noise of
bn_sigma x 2 (replace-one sensitivity). Its cost is not composed here: give eps the DP-SGD share (with
bn_sigma = 100 the two sums are zCDP rho = 4e-4, under 2 % of a total ε of 1 at δ = 1e-5); groups (27): GroupNorm's
groups over the 81 channels; power: a data-independent power of the coefficients before GroupNorm (0.5: square
root, compressing their heavy tail); L: the scattering's angles (8; 1 + 2 L + L^2 channels at J = 2, so give
groups that divide them); input01: true, the features of the images mapped to [0, 1] (as Tramer &
Boneh's); nonprivate: true trains the head without clipping or noise (Adam, E epochs;
B, eps, lr, C are ignored): the capacity a private run can approach, not a release; with it, head: a bigger head
than the packaged ones (cnn64-tanh, cnn128-tanh, cnn64-relu-pool, cnn128-relu-pool, mlpN with N hidden units,
conv1x1-N-linear, pw-N-linear: the same as Linear layers); a private setting takes a head too (with copies, only
mlpN and pw-N-linear).
tta: K, test-time averaging: the head's softmax averaged over the test image and K - 1 copies augmented with
tta_augment (default the setting's augment, else shift; fixed public seeds), reported as accuracy_tta beside the
plain accuracy: the released classifier is then the head applied to K views, post-processing of the DP head.
One JSON line per setting on stdout.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.data import load_data
from privdistill.data.dataset import to_float
from privdistill.engine.cache import StageCache
from privdistill.engine.context import Env
from privdistill.engine.run import RunDir
from privdistill.engine.stages import Stages, fixed_features
from privdistill.engine.trainer import accuracy
from privdistill.methods.dpsgd import epsilons, steps_per_epoch
from privdistill.models import create_model
from privdistill.models.scatternet import make_scattering
from privdistill.privacy.accounting import strict_noise_multiplier


def capacity_head(name: str, channels: int, side: int, classes: int) -> nn.Module:
    """Heads bigger than the packaged ones (key "head") on [B, channels, side, side] features: their non-private
    capacity, and (run_setting) the same heads trained privately."""
    flat, w = channels * side * side, int(name.split("-")[0][3:]) if name.startswith("cnn") else 0
    if name in ("cnn64-relu-pool", "cnn128-relu-pool"):
        return nn.Sequential(nn.Conv2d(channels, w, 3, padding=1), nn.ReLU(), nn.Conv2d(w, w, 3, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * w, classes))
    if name in ("cnn64-tanh", "cnn128-tanh"):
        return nn.Sequential(nn.Conv2d(channels, w, 3, padding=1), nn.Tanh(), nn.Conv2d(w, w, 3, stride=2, padding=1),
                             nn.Tanh(), nn.Flatten(), nn.Linear(w * ((side + 1) // 2) ** 2, classes))
    if name.startswith("mlp"):  # mlpN: N hidden units; flattening the last three dims keeps [B, copies, ...] intact,
        # so a private run with copies clips each example's mean gradient (Opacus's Linear sums the extra dims)
        width = int(name[3:])
        return nn.Sequential(nn.Flatten(-3), nn.Linear(flat, width), nn.ReLU(), nn.Linear(width, classes))
    if name.startswith("conv1x1-") and name.endswith("-linear"):  # conv1x1-N-linear: N 1x1 filters, ReLU, linear;
        # a narrow N has fewer parameters than the linear head on all 81 channels (DP-SGD's noise grows with them)
        width = int(name.split("-")[1])
        return nn.Sequential(nn.Conv2d(channels, width, 1), nn.ReLU(), nn.Flatten(),
                             nn.Linear(width * side * side, classes))
    if name.startswith("pw-") and name.endswith("-linear"):  # pw-N-linear: conv1x1-N-linear written with Linear
        # layers on channels-last positions, so a private run with copies clips each example's mean gradient
        width = int(name.split("-")[1])
        return nn.Sequential(ChannelsLast(), nn.Linear(channels, width), nn.ReLU(), nn.Flatten(-2),
                             nn.Linear(width * side * side, classes))
    raise SystemExit(f"unknown head {name!r}")


def default_head(c: dict, data, x_train: torch.Tensor) -> nn.Module:
    """The packaged model's head; with "L" (another number of scattering channels), a linear head of that size."""
    if "L" in c:
        return nn.Sequential(nn.Flatten(start_dim=-3), nn.Linear(x_train[0].shape[-3:].numel(), data.num_classes))
    return create_model(c.get("model", "scatter-linear"), in_channels=data.channels, num_classes=data.num_classes,
                        image_size=data.image_size[0]).head


class ChannelsLast(nn.Module):
    """[..., C, H, W] -> [..., H W, C]: a 1x1 convolution becomes a Linear layer over the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.movedim(-3, -1).flatten(-3, -2)


def nonprivate_capacity(c: dict, data, features: tuple[torch.Tensor, torch.Tensor], env: Env) -> dict:
    """The head trained without any noise or clipping (Adam 1e-3, batch 256, E epochs): the most a private run of
    the same head on the same features can approach. Not DP: a reference, never a release."""
    (x_train, x_test), (y_train, y_test) = features, (data.train.labels, data.test.labels)
    torch.manual_seed(c.get("seed", 0))
    if c.get("head"):
        head = capacity_head(c["head"], x_train.shape[-3], x_train.shape[-1], data.num_classes)
    else:
        head = default_head(c, data, x_train)
    optimizer = torch.optim.Adam(head.parameters(), 1e-3)
    started, curve = time.time(), []
    for _ in range(c["E"]):
        head.train()
        for batch in torch.randperm(len(x_train)).split(256):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(head(x_train[batch]), y_train[batch]).backward()
            optimizer.step()
        curve.append(round(accuracy(head, x_test, y_test, env), 4))
    return {**c, "epsilon_strict": None, "params": sum(p.numel() for p in head.parameters()), "accuracy": curve[-1],
            "best": max(curve), "curve": curve, "seconds": round(time.time() - started)}


def tta_accuracy(head: nn.Module, views: torch.Tensor, labels: torch.Tensor) -> float:
    """Accuracy of the softmax averaged over each test image's views ([N, K, ...] features)."""
    head.eval()
    with torch.no_grad():
        probs = torch.cat([head(views[i:i + 1000]).softmax(-1).mean(1) for i in range(0, len(views), 1000)])
    head.train()
    return float((probs.argmax(1) == labels).float().mean())


def run_setting(c: dict, data, features: tuple[torch.Tensor, torch.Tensor], env: Env,
                tta_views: torch.Tensor | None = None) -> dict:
    from opacus import PrivacyEngine

    if c.get("nonprivate"):
        return nonprivate_capacity(c, data, features, env)

    (x_train, x_test), (y_train, y_test) = features, (data.train.labels, data.test.labels)
    torch.manual_seed(c.get("seed", 0))
    if c.get("head"):  # a bigger private head; with copies only an MLP (see capacity_head)
        if x_train.dim() == 5 and not c["head"].startswith(("mlp", "pw-")):
            raise SystemExit(f"head {c['head']!r} takes no copies: a convolution would clip each copy on its own")
        head = capacity_head(c["head"], x_train.shape[-3], x_train.shape[-1], data.num_classes)
    else:
        head = default_head(c, data, x_train)
    per_epoch = steps_per_epoch(len(x_train), c["B"])
    total = per_epoch * c["E"]
    sigma = strict_noise_multiplier(target_epsilon=c["eps"], delta=1e-5, sample_rate=1 / per_epoch, steps=total)
    optimizer = torch.optim.SGD(head.parameters(), lr=c["lr"], momentum=c.get("mom", 0.9))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=c["B"])
    dp_head, optimizer, loader = PrivacyEngine(accountant="rdp").make_private(
        module=head, optimizer=optimizer, data_loader=loader, max_grad_norm=c["C"], noise_multiplier=sigma,
        poisson_sampling=True)
    ema = copy.deepcopy(head) if c.get("ema") else None
    started, curve, step = time.time(), [], 0
    for _ in range(c["E"]):
        for x, y in loader:
            if c.get("sched") == "cos":
                for group in optimizer.param_groups:
                    group["lr"] = c["lr"] * 0.5 * (1 + math.cos(math.pi * step / total))
            optimizer.zero_grad(set_to_none=True)
            if len(x):  # [B, classes], or [B, copies, classes] with copies: the loss averages each example's copies
                out = dp_head(x)
                F.cross_entropy(out.flatten(0, -2), y.repeat_interleave(out[0].numel() // out.shape[-1])).backward()
            optimizer.step()
            step += 1
            if ema is not None:  # post-processing of the released iterates: no privacy cost
                with torch.no_grad():
                    for avg, p in zip(ema.parameters(), head.parameters()):
                        avg.mul_(c["ema"]).add_(p.detach(), alpha=1 - c["ema"])
        curve.append([round(accuracy(m, x_test, y_test, env), 4) if m is not None else None for m in (head, ema)])
    eps = epsilons(sigma, 1 / per_epoch, total, 1e-5)
    if tta_views is not None:
        c = {**c, "accuracy_tta": [round(tta_accuracy(m, tta_views, y_test), 4) for m in (head, ema) if m is not None]}
    return {**c, "sigma": round(sigma, 4), "epsilon_strict": round(eps["replace_one"], 4),
            "epsilon_opacus_rdp": round(eps["rdp"], 4), "accuracy": curve[-1][0], "curve": curve,
            "seconds": round(time.time() - started)}


def private_channel_norm(raw: tuple[torch.Tensor, torch.Tensor], sigma: float, seed: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, test) raw scattering [N, K, H, W] normalised per channel by DP estimates of the training set's
    channel mean and variance (see bn_sigma above)."""
    train = raw[0]
    g = torch.Generator().manual_seed(seed + 1000)

    def dp_mean(per_example: torch.Tensor) -> torch.Tensor:  # clipped to norm 1; replace-one sensitivity 2
        clipped = per_example * torch.clamp(1.0 / per_example.norm(dim=1, keepdim=True), max=1.0)
        return (clipped.sum(0) + torch.randn(clipped.shape[1], generator=g) * sigma * 2) / len(per_example)

    mean, mean_sq = dp_mean(train.mean((2, 3))), dp_mean((train ** 2).mean((2, 3)))
    std = torch.sqrt(torch.clamp(mean_sq - mean ** 2, min=1e-6) + 1e-5)[None, :, None, None]
    return tuple((x - mean[None, :, None, None]) / std for x in raw)


def main() -> None:
    warnings.simplefilter("ignore")  # Opacus's hook and secure-RNG warnings
    dataset, settings = sys.argv[1], json.loads(sys.argv[2])
    data = load_data(dataset)
    model = create_model(settings[0].get("model", "scatter-linear"), in_channels=data.channels,
                         num_classes=data.num_classes, image_size=data.image_size[0])
    env = Env.cpu()
    stages = Stages(StageCache(), env, data, RunDir("/tmp/privdistill-scatter-sweep"))
    features, raws, test_views = stages.features(model), {}, {}
    for c in settings:
        use = features
        if c.get("copies", 1) > 1:  # augmentation multiplicity: the library's cached copies (methods/dpsgd.py)
            use = stages.features(model, c.get("augment", "shift"), c["copies"])
        if c.get("bn_sigma") or "groups" in c or "power" in c or c.get("input01") or "L" in c:
            if c.get("copies", 1) > 1:  # the raw coefficients below are of the images as they are, one copy
                raise SystemExit("copies take the packaged features: no bn_sigma, groups, power, input01 or L")
            angles = c.get("L", 8)
            if angles not in raws:  # the scattering coefficients before GroupNorm (about a minute for MNIST)
                scattering = make_scattering(data.image_size, L=angles)
                with torch.no_grad():
                    raws[angles] = tuple(torch.cat([scattering(to_float(split.images[i:i + 1000])).flatten(1, 2)
                                                    for i in range(0, len(split), 1000)])
                                         for split in (data.train, data.test))
            raw = raws[angles]
            # input01: as if the images were in [0, 1] (Tramer & Boneh's ToTensor) instead of [-1, 1]. The wavelets
            # have zero mean, so x -> (x + 1) / 2 halves every coefficient and adds 1/2 to the order-0 (low-pass, unit
            # mass) channel only; the scale cancels in GroupNorm, the offset of channel 0 does not
            coeffs = tuple(torch.cat([x[:, :1] + 1.0, x[:, 1:]], 1) for x in raw) if c.get("input01") else raw
            if c.get("bn_sigma"):
                use = private_channel_norm(coeffs, c["bn_sigma"], c.get("seed", 0))
            else:  # the order-0 (low-pass) channel can be negative on [-1, 1] images: keep its sign under the power
                use = tuple(F.group_norm(x.sign() * x.abs() ** c.get("power", 1.0), c.get("groups", 27))
                            for x in coeffs)
        views = None
        if c.get("tta", 1) > 1:  # the test images' K views (copy 0 as it is), through the fixed transform
            kind = c.get("tta_augment", c.get("augment", "shift"))
            for k in range(1, c["tta"]):  # each augmented view computed once for every setting that asks for it
                if (kind, k) not in test_views:
                    test_views[kind, k] = fixed_features(model, data.test.images, env, augment=kind, stream=k)
            views = torch.stack([use[1]] + [test_views[kind, k] for k in range(1, c["tta"])], 1)
        print(json.dumps({"dataset": dataset, **run_setting(c, data, use, env, views)}), flush=True)


if __name__ == "__main__":
    main()
