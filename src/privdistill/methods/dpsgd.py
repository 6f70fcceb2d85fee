"""DP-SGD baseline (Abadi et al. 2016) through Opacus: the paper CNN trained directly on the private data
with per-sample gradient clipping and Gaussian noise, Poisson sampling, at a target (ε, δ).

    noise multiplier σ   Opacus `PrivacyEngine.make_private_with_epsilon(target_epsilon, target_delta, epochs)`
                         under the `dpsgd.accountant` ("rdp" by default, or "prv"): the headline accountant
    per step             Poisson batch (rate q = 1 / steps per epoch), clip each example's gradient to C,
                         add N(0, σ²C²), optimiser step
    reported             ε of the same (σ, q, T) under Opacus's RDP and PRV accountants (add/remove-one, the
                         relation DP-SGD is usually stated under), and under dp-accounting's PLD accountant
                         with the REPLACE-ONE relation every other method of this project uses ("strict")

Which ε is which (written into summary.json and privacy.json):
- `epsilon_paper`  = the calibration accountant's ε (Opacus, add/remove-one): what DP-SGD papers report;
- `epsilon_strict` = replace-one ε of the same noise (dp-accounting PLD), comparable with the strict ε of
  DGD/DPDFD/SRR/PATE. It is slightly above the target at ε = 1 (e.g. 1.10 for a 1.0 RDP target) and below
  it at ε = 10 (RDP's conversion is loose there). `dpsgd.calibration=strict` calibrates σ on it instead.

Every pathway from the private data to the model goes through the clipped, noised gradients: the
released model is covered (unlike the data-free methods' students). The noise is not recorded in the
privacy ledger step by step: Opacus's accountant (its history of (σ, q, steps)) is the record, saved
with each checkpoint. Resume: checkpoints at epoch boundaries; the sampling and noise generators are
re-seeded from (seed, epoch), so a resumed run equals an uninterrupted one.

Precision: DP-SGD always runs in fp32 (whatever --precision says). Under bf16 autocast Opacus computes the
per-sample gradients, their norms and the clipping in bf16, so a clipped gradient can exceed C by about
0.4 % (bf16 has 8 significant bits): the sensitivity the accountant assumes would not hold.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import ClassifierTraining
from privdistill.data.dataset import to_float
from privdistill.engine import evaluate
from privdistill.engine.augment import augment_batch
from privdistill.engine.optim import lr_factor, make_optimizer
from privdistill.engine.progress import progress_bar
from privdistill.errors import ConfigError, PrivacyError
from privdistill.methods.common import RunRequest, finish_run, prepare_run
from privdistill.models import create_model
from privdistill.privacy.report import PRIVATE, Pathway, noise_source, write_privacy_json

_INIT_STREAM, _SAMPLE_STREAM, _NOISE_STREAM, _AUGMENT_STREAM = 61, 62, 63, 64
OPACUS_ACCOUNTANTS = ("rdp", "prv")


@dataclass
class DPSGDConfig:
    """Config section `dpsgd`."""

    epsilon: float = 10.0  # target ε
    delta: float = 1e-5
    accountant: str = "rdp"  # Opacus accountant used to calibrate σ (the headline): rdp | prv
    calibration: str = "opacus"  # opacus: make_private_with_epsilon under `accountant`; strict: σ for replace-one ε
    model: str = "paper-cnn"  # no BatchNorm: per-sample gradients need per-sample independent layers
    epochs: int = 5
    batch_size: int = 256  # expected batch size (Poisson sampling)
    max_grad_norm: float = 1.0  # C
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.1
    momentum: float = 0.9
    lr_schedule: str = "constant"  # constant | linear | cosine (public schedule: no privacy cost)
    augment: str = "none"  # none | shift | flip-shift (per-example preprocessing: no privacy cost)
    grad_sample_mode: str = "hooks"
    noise_seed: int | None = None  # seed of the sampling and noise generators (default: the run seed)
    secure_mode: bool = False  # Opacus secure RNG (needs torchcsprng)

    def validate(self) -> None:
        if not self.epsilon > 0:
            raise ConfigError(f"dpsgd.epsilon must be > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"dpsgd.delta must lie in (0, 1), got {self.delta}")
        if self.accountant not in OPACUS_ACCOUNTANTS:
            raise ConfigError(f"dpsgd.accountant must be one of {OPACUS_ACCOUNTANTS}, got {self.accountant!r}")
        if self.calibration not in ("opacus", "strict"):
            raise ConfigError("dpsgd.calibration must be opacus or strict")
        if self.epochs < 1 or self.batch_size < 1 or self.max_grad_norm <= 0 or self.lr <= 0:
            raise ConfigError("dpsgd epochs, batch_size must be >= 1; max_grad_norm and lr > 0")
        if self.optimizer not in ("sgd", "adam"):
            raise ConfigError("dpsgd.optimizer must be sgd or adam")
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise ConfigError("dpsgd.lr_schedule must be constant, linear or cosine")
        if self.augment not in ("none", "shift", "flip-shift"):
            raise ConfigError("dpsgd.augment must be none, shift or flip-shift")


SECTIONS = {"baseline": ClassifierTraining, "dpsgd": DPSGDConfig}


# ----------------------------------------------------------------------------------------- accounting
def steps_per_epoch(n: int, batch_size: int) -> int:
    """Opacus's convention: sample rate q = 1 / len(data_loader) = 1 / ceil(n / batch_size)."""
    return max(1, math.ceil(n / batch_size))


def epsilons(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> dict[str, float]:
    """ε of `steps` Poisson-sampled Gaussian steps under Opacus's RDP and PRV accountants (add/remove-one)
    and dp-accounting's PLD with the replace-one relation (the project's strict relation)."""
    from opacus.accountants import create_accountant

    from privdistill.privacy.accounting import _pld_poisson_gaussian_replace_one

    out: dict[str, float] = {}
    if steps == 0:
        return {"rdp": 0.0, "prv": 0.0, "replace_one": 0.0}
    for name in OPACUS_ACCOUNTANTS:
        acc = create_accountant(name)
        acc.history = [(noise_multiplier, sample_rate, steps)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "optimal order is the largest alpha" at tiny ε
            out[name] = float(acc.get_epsilon(delta=delta))
    out["replace_one"] = _pld_poisson_gaussian_replace_one(float(noise_multiplier), float(sample_rate), int(steps),
                                                           float(delta))
    return out


def strict_noise_multiplier(*, target_epsilon: float, delta: float, sample_rate: float, steps: int,
                            tolerance: float = 0.005) -> float:
    """Least σ (to `tolerance` in ε, on the safe side) whose replace-one PLD ε is <= target."""
    from privdistill.privacy.accounting import _pld_poisson_gaussian_replace_one

    def eps(sigma: float) -> float:
        return _pld_poisson_gaussian_replace_one(float(sigma), float(sample_rate), int(steps), float(delta))

    lo, hi = 0.0, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise PrivacyError(f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta}")
    while True:
        mid = (lo + hi) / 2
        e = eps(mid)
        if e <= target_epsilon:
            hi = mid
            if target_epsilon - e <= tolerance:
                return hi
        else:
            lo = mid
        if hi - lo < 1e-4:
            return hi


def dpsgd_pathways() -> dict[str, list[Pathway]]:
    return {"model": [Pathway(PRIVATE, "per-example gradients clipped to C + N(0, sigma^2 C^2), Poisson-sampled "
                              "batches (DP-SGD)", "model weights", True,
                              "every access to the private data goes through the noisy clipped gradients")]}


# --------------------------------------------------------------------------------------------- method
def run_dpsgd(request: RunRequest, *, variant: str | None = None) -> dict[str, Any]:
    """Train the DP-SGD model of `request` (resumable with request.resume); returns the summary."""
    try:
        from opacus import PrivacyEngine
    except ImportError as err:  # pragma: no cover - opacus is an optional extra
        raise ConfigError("DP-SGD needs Opacus: pip install 'privdistill[dpsgd]'") from err

    prep = prepare_run("dpsgd", request, SECTIONS)
    cfg: DPSGDConfig = prep.sections["dpsgd"]
    env, run, data = prep.env, prep.run, prep.data
    train = data.train
    n = len(train)
    per_epoch = steps_per_epoch(n, cfg.batch_size)
    total = per_epoch * cfg.epochs
    sample_rate = 1.0 / per_epoch
    seed = env.seed if cfg.noise_seed is None else cfg.noise_seed

    torch.manual_seed(env.generator(_INIT_STREAM).initial_seed())
    model = create_model(cfg.model, kind="classifier", in_channels=data.channels, num_classes=data.num_classes,
                         image_size=data.image_size[0]).to(env.device)  # trained in fp32: no autocast
    for module in model.modules():  # Opacus's backward hooks refuse in-place ops on hooked outputs
        if isinstance(module, nn.ReLU):
            module.inplace = False
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ConfigError(f"model {cfg.model!r} is not DP-SGD compatible (e.g. BatchNorm): {errors[0]}")
    optimizer = make_optimizer(model.parameters(), cfg.optimizer, lr=cfg.lr, momentum=cfg.momentum)
    # Poisson sampling runs in the CPU loader; Opacus draws the noise on the parameters' device, so the noise
    # generator lives there.
    sample_gen, noise_gen = torch.Generator(), torch.Generator(device=env.device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train.images, train.labels),
                                         batch_size=cfg.batch_size, generator=sample_gen)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        engine = PrivacyEngine(accountant=cfg.accountant, secure_mode=cfg.secure_mode)
    common = dict(module=model, optimizer=optimizer, data_loader=loader, max_grad_norm=cfg.max_grad_norm,
                  poisson_sampling=True, noise_generator=None if cfg.secure_mode else noise_gen,
                  grad_sample_mode=cfg.grad_sample_mode)
    if cfg.calibration == "opacus":
        dp_model, dp_optimizer, dp_loader = engine.make_private_with_epsilon(
            **common, target_epsilon=cfg.epsilon, target_delta=cfg.delta, epochs=cfg.epochs)
    else:
        sigma = strict_noise_multiplier(target_epsilon=cfg.epsilon, delta=cfg.delta, sample_rate=sample_rate,
                                        steps=total)
        dp_model, dp_optimizer, dp_loader = engine.make_private(**common, noise_multiplier=sigma)
    sigma = float(dp_optimizer.noise_multiplier)
    if not cfg.secure_mode:
        dp_loader.batch_sampler.generator = sample_gen  # the generator re-seeded at every epoch below
        dp_optimizer.generator = noise_gen

    # the schedule's base rates, read before a checkpoint's (already decayed) rates are loaded
    base_lrs = [g["lr"] for g in dp_optimizer.param_groups]

    # --- resume from the last finished epoch --------------------------------------------------------
    start_epoch, elapsed, history = 0, 0.0, []
    state = run.load_checkpoint("dpsgd-checkpoint")
    if state is not None:
        model.load_state_dict(state["model"])
        dp_optimizer.original_optimizer.load_state_dict(state["optimizer"])
        engine.accountant.load_state_dict(state["accountant"])
        start_epoch, elapsed, history = state["epoch"], state["elapsed"], state["history"]
        if abs(state["noise_multiplier"] - sigma) > 1e-12:
            raise ConfigError("the checkpoint's noise multiplier differs from this run's: cannot resume")

    t0 = time.perf_counter()
    model.train()
    with progress_bar(total, "DP-SGD", enabled=env.progress, completed=start_epoch * per_epoch) as bar:
        for epoch in range(start_epoch, cfg.epochs):
            if not cfg.secure_mode:
                sample_gen.manual_seed(env.generator(_SAMPLE_STREAM, seed, epoch).initial_seed())
                noise_gen.manual_seed(env.generator(_NOISE_STREAM, seed, epoch).initial_seed())
            running, seen = 0.0, 0
            for i, (x, y) in enumerate(dp_loader):
                step = epoch * per_epoch + i
                for g, lr in zip(dp_optimizer.param_groups, base_lrs):
                    g["lr"] = lr * lr_factor(cfg.lr_schedule, step, total)
                x = augment_batch(to_float(x), cfg.augment, env.generator(_AUGMENT_STREAM, epoch, i))
                x, y = x.to(env.device), y.to(env.device)
                dp_optimizer.zero_grad(set_to_none=True)
                if len(x):
                    loss = F.cross_entropy(dp_model(x), y)
                    loss.backward()
                    running += float(loss.detach()) * len(x)
                    seen += len(x)
                dp_optimizer.step()
                bar.advance(1, loss=running / max(1, seen))
            done = epoch + 1
            eps_now = float(engine.accountant.get_epsilon(delta=cfg.delta))
            entry = {"epoch": done, "train_loss": round(running / max(1, seen), 4),
                     "test_accuracy": evaluate(model, data.test, env), f"epsilon_{cfg.accountant}": round(eps_now, 4)}
            history.append(entry)
            run.log(stage="dpsgd", **entry)
            run.save_checkpoint({"model": model.state_dict(), "optimizer": dp_optimizer.original_optimizer.state_dict(),
                                 "accountant": engine.accountant.state_dict(), "epoch": done,
                                 "elapsed": elapsed + time.perf_counter() - t0, "history": history,
                                 "noise_multiplier": sigma}, "dpsgd-checkpoint")
    wall = elapsed + time.perf_counter() - t0
    model.eval()
    accuracy = evaluate(model, data.test, env)
    run.save_weights("model", model, metadata={"method": "dpsgd"})

    steps_taken = sum(s for _, _, s in engine.accountant.history)
    eps = epsilons(sigma, sample_rate, steps_taken, cfg.delta)
    accounting = {
        "noise_multiplier": round(sigma, 6), "sample_rate": sample_rate, "steps": steps_taken,
        "accountant": cfg.accountant, "max_grad_norm": cfg.max_grad_norm, "expected_batch_size": cfg.batch_size,
        "epsilon_opacus_rdp": round(eps["rdp"], 4), "epsilon_opacus_prv": round(eps["prv"], 4),
        "epsilon_replace_one_pld": round(eps["replace_one"], 4),
        "headline": (f"Opacus {cfg.accountant.upper()} accountant (add/remove-one), calibrated by "
                     "make_private_with_epsilon" if cfg.calibration == "opacus"
                     else "dp-accounting PLD, replace-one (σ calibrated on it)"),
        "relations": "epsilon_opacus_*: add/remove-one (Opacus); epsilon_replace_one_pld and epsilon_strict: "
                     "replace-one, the relation of every other method here",
    }
    noise = noise_source(cfg.secure_mode, "dpsgd.secure_mode")
    write_privacy_json(run.path, dpsgd_pathways(), method="dpsgd", noise=noise,
                       extra={"dpsgd_accounting": accounting, "delta": cfg.delta})
    return finish_run(
        prep, request, method="dpsgd", wall_seconds=wall, test_accuracy=round(accuracy, 4),
        baseline_accuracy=None, noise_secure=noise["secure"], target_epsilon=cfg.epsilon,
        epsilon_paper=round(eps[cfg.accountant], 4),  # Opacus's own figure, whichever was calibrated on
        epsilon_strict=round(eps["replace_one"], 4), delta=cfg.delta,
        epsilon_covers="the whole model: every access to the private data is a clipped, noised gradient",
        not_covered=[], privacy=f"DP-SGD (Opacus): {accounting['headline']}", accountant=cfg.accountant,
        calibration=cfg.calibration, dpsgd_accounting=accounting, model=cfg.model, epochs=cfg.epochs,
        # the training loss is a statistic of the private batches, not covered by ε: it stays in the run's
        # own log (metrics.jsonl, private) and is left out of the summary, which results/ publishes
        history=[{k: v for k, v in h.items() if k != "train_loss"} for h in history[-3:]], variant=variant)
