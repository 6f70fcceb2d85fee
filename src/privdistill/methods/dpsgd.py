"""DP-SGD baseline (Abadi et al. 2016) through Opacus: the paper CNN trained directly on the private data
with per-sample gradient clipping and Gaussian noise, Poisson sampling, at a target (ε, δ).

    noise multiplier σ   calibrated in the plan to the target ε: `strict` (default) on dp-accounting's replace-one
                         PLD ε; `paper` by Opacus's search under `dpsgd.accountant` ("rdp" or "prv")
    per step             Poisson batch (rate q = 1 / steps per epoch), clip each example's gradient to C,
                         add N(0, σ²C²), optimiser step
    reported             `epsilon_paper`: the calibration accountant's (Opacus, add/remove-one, what DP-SGD papers
                         report); `epsilon_strict`: replace-one PLD ε of the same noise, comparable with the other
                         methods' strict ε

Every pathway from the private data to the model goes through the clipped, noised gradients: the released model is
covered. Opacus's accountant history, saved with each checkpoint, is the record (not the ledger); the sampling and
noise generators are re-seeded from (seed, epoch), so a resumed run equals an uninterrupted one.

DP-SGD always runs in fp32: under bf16 autocast Opacus clips in bf16, so a clipped gradient can exceed C by about
0.4 % and the sensitivity the accountant assumes would not hold.
"""

from __future__ import annotations

import secrets
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import check, check_augment
from privdistill.data.dataset import to_float
from privdistill.engine import streams
from privdistill.engine.augment import augment_batch
from privdistill.engine.loop import TrainingLoop
from privdistill.engine.optim import SCHEDULES, lr_factor, make_optimizer
from privdistill.engine.run import RunDir
from privdistill.engine.trainer import accuracy
from privdistill.errors import BudgetExceededError, ConfigError, RunError
from privdistill.methods.common import MethodAPI, RunRequest
from privdistill.methods.dpsgd_plan import (  # noqa: F401
    OPACUS_ACCOUNTANTS,
    accountant_epsilon,
    epsilons,
    plan_dpsgd,
    steps_per_epoch,
)
from privdistill.methods.runner import Context, Method, Plan, Report, RunResult, Trained
from privdistill.models import create_model
from privdistill.models.scatternet import LINEAR_SCATTERNETS, ScatterNet
from privdistill.privacy.ledger import LedgerView
from privdistill.privacy.report import PRIVATE, Pathway
from privdistill.privacy.secure import use_secure_noise


@dataclass
class DPSGDConfig:
    """Config section `dpsgd`."""

    accountant: str = "rdp"  # Opacus accountant: calibrates σ under budget.accounting=paper (the headline)
    model: str = "paper-cnn"  # no BatchNorm: per-sample gradients need per-sample independent layers;
    # scatter-linear / -prior-linear / -multiscale-prior-linear: Tramèr & Boneh's ScatterNet, fixed features computed
    # once (scatternet.py)
    epochs: int = 5
    batch_size: int = 256  # expected batch size (Poisson sampling)
    max_grad_norm: float = 1.0  # C
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.1
    momentum: float = 0.9
    lr_schedule: str = "constant"  # constant | linear | cosine (public schedule: no privacy cost)
    augment: str = "none"  # one of config.AUGMENTATIONS (per-example preprocessing: no privacy cost)
    # scatter-linear: each example's gradient is the mean over this many copies (the first unaugmented, the others
    # with `augment`, features computed once) before clipping: augmentation multiplicity (De et al. 2022)
    augment_copies: int = 1
    grad_sample_mode: str = "hooks"
    secure_mode: Optional[bool] = None  # secure noise and OS-entropy batches; None: run.noise decides (common.py)
    variant: Optional[str] = None  # the label --record adds to the result's name

    def validate(self) -> None:
        check(self.accountant in OPACUS_ACCOUNTANTS,
              f"dpsgd.accountant must be one of {OPACUS_ACCOUNTANTS}, got {self.accountant!r}")
        check(not (self.epochs < 1 or self.batch_size < 1 or self.max_grad_norm <= 0 or self.lr <= 0),
              "dpsgd epochs, batch_size must be >= 1; max_grad_norm and lr > 0")
        check(self.optimizer in ("sgd", "adam"), "dpsgd.optimizer must be sgd or adam")
        check(self.lr_schedule in SCHEDULES, "dpsgd.lr_schedule must be constant, linear or cosine")
        check_augment(self.augment, "dpsgd.augment")
        copies = self.augment_copies > 1
        if (copies and (self.model not in LINEAR_SCATTERNETS or self.augment == "none")) or self.augment_copies < 1 or (
                self.model.startswith("scatter-") and self.augment != "none" and not copies):
            raise ConfigError("dpsgd.augment_copies > 1 needs a linear ScatterNet model and an augment; a ScatterNet's "
                              "features are computed once, so its augment applies only to those copies")


def dpsgd_pathways() -> dict[str, list[Pathway]]:
    return {"model": [Pathway(PRIVATE, "per-example gradients clipped to C + N(0, sigma^2 C^2), Poisson-sampled "
                              "batches (DP-SGD)", "model weights", True,
                              "every access to the private data goes through the noisy clipped gradients")]}


@dataclass
class _Private:
    """The Opacus-wrapped model, optimiser and loader of a run, and its generators."""

    model: nn.Module  # the released model (for a ScatterNet: the fixed transform and the trained head)
    dp_model: nn.Module  # what Opacus trains: the model, or a ScatterNet's head
    optimizer: Any
    loader: Any
    engine: Any
    sigma: float
    sample_gen: torch.Generator
    noise_gen: torch.Generator
    test_inputs: torch.Tensor  # what dp_model reads for the test set (images, or scattering features)
    criterion: Any = None  # grad_sample_mode "ghost": Opacus's loss that clips per example without per-example grads


class DPSGDMethod(Method):
    name = "dpsgd"
    sections = {"dpsgd": DPSGDConfig}
    uses_ledger = False  # Opacus's accountant (its history of (σ, q, steps)) is the record, saved in checkpoints
    weights_name = "model"

    def check_end_to_end(self, ctx: Context) -> None:
        """Every access to the private data is a clipped, noised gradient: end to end as it stands."""

    def plan(self, ctx: Context, recorded: LedgerView) -> Plan:
        cfg: DPSGDConfig = ctx.section("dpsgd")
        if ctx.budget.epsilon is None:
            raise ConfigError("DP-SGD needs a target ε: --epsilon (budget.epsilon)")
        if ctx.budget.limit is not None and ctx.budget.epsilon > ctx.budget.limit:  # σ is calibrated to the target
            raise BudgetExceededError(f"the target ε {ctx.budget.epsilon:g} exceeds --max-epsilon "
                                      f"{ctx.budget.limit:g}: nothing was trained")
        return plan_dpsgd(cfg, ctx.budget, len(ctx.data.train))  # σ, T and the ε of the run (dpsgd_plan.py)

    def train(self, ctx: Context, plan: Plan, ledger: None) -> Trained:
        cfg: DPSGDConfig = ctx.section("dpsgd")
        private = _make_private(ctx, cfg, plan)
        wall, history = _train_epochs(ctx, cfg, plan, private)
        private.model.eval()
        # the accountant and σ are for the report (they are not summary fields: report() takes them out)
        return Trained(student=private.model, wall_seconds=wall,
                       fields={"history": history, "_accountant": private.engine.accountant, "_sigma": private.sigma})

    def pathways(self, ctx: Context, plan: Plan) -> dict[str, list[Pathway]]:
        return dpsgd_pathways()

    def report(self, ctx: Context, plan: Plan, trained: Trained, ledger: None) -> Report:
        cfg, budget = ctx.section("dpsgd"), ctx.budget
        accountant, sigma = trained.fields.pop("_accountant"), trained.fields.pop("_sigma")
        history = trained.fields.pop("history")
        steps_taken = sum(s for _, _, s in accountant.history)
        planned = steps_taken == plan.details["total"] and sigma == plan.details["sigma"]
        # the plan priced these very steps (what its dry run printed); otherwise the steps Opacus recorded
        eps = plan.details["epsilons"] if planned else epsilons(sigma, plan.details["sample_rate"], steps_taken,
                                                                 budget.delta)
        accounting = {
            "noise_multiplier": round(sigma, 6), "sample_rate": plan.details["sample_rate"], "steps": steps_taken,
            "accountant": cfg.accountant, "max_grad_norm": cfg.max_grad_norm, "expected_batch_size": cfg.batch_size,
            "epsilon_opacus_rdp": round(eps["rdp"], 4), "epsilon_opacus_prv": round(eps["prv"], 4),
            "epsilon_replace_one_pld": round(eps["replace_one"], 4),
            "headline": (f"Opacus {cfg.accountant.upper()} accountant (add/remove-one), calibrated by "
                         "make_private_with_epsilon" if budget.accounting == "paper"
                         else "dp-accounting PLD, replace-one (σ calibrated on it)"),
            "relations": "epsilon_opacus_*: add/remove-one (Opacus); epsilon_replace_one_pld and epsilon_strict: "
                         "replace-one, the relation of every other method here",
        }
        return Report(
            pathways=self.pathways(ctx, plan), secure_noise=cfg.secure_mode, noise_option="dpsgd.secure_mode",
            extra={"dpsgd_accounting": accounting, "delta": budget.delta},
            # epsilon_paper: Opacus's own figure, whichever accountant σ was calibrated on
            epsilon={"paper": eps[cfg.accountant], "strict": eps["replace_one"]},
            fields={"epsilon_covers": "the whole model: every access to the private data is a clipped, noised "
                                      "gradient",
                    "privacy": f"DP-SGD (Opacus): {accounting['headline']}", "accountant": cfg.accountant,
                    "dpsgd_accounting": accounting, "model": cfg.model, "epochs": cfg.epochs, "variant": cfg.variant,
                    # the training loss is a statistic of the private batches, not covered by ε: it stays in the
                    # run's own log (metrics.jsonl, private) and is left out of the summary, which results/ publishes
                    "history": [{k: v for k, v in h.items() if k != "train_loss"} for h in history[-3:]]})


class DPSGD(MethodAPI):
    """`DPSGD(epsilon=1, recipe="scatternet").fit("mnist")` -> RunResult(student, None, summary, privacy): the
    budget keywords go to the `budget` section, others to `dpsgd` (`epochs=10`, `secure_mode=True`, ...)."""

    section, method = "dpsgd", DPSGDMethod


def run_dpsgd(request: RunRequest) -> RunResult:
    """Train the DP-SGD model of `request` (resumable with request.resume)."""
    return DPSGDMethod().run(request)


def _make_private(ctx: Context, cfg: DPSGDConfig, plan: Plan) -> _Private:
    """The model, made private by Opacus with the plan's σ, calibrated to the target under the budget's accounting
    (`noise_multiplier`: paper, Opacus's search under `dpsgd.accountant`; strict, the replace-one PLD ε)."""
    try:
        from opacus import PrivacyEngine
        from opacus.validators import ModuleValidator
    except ImportError as err:  # pragma: no cover - opacus is an optional extra
        raise ConfigError("DP-SGD needs Opacus: pip install 'privdistill[dpsgd]'") from err
    env, data = ctx.env, ctx.data
    torch.manual_seed(env.generator(streams.DPSGD_INIT).initial_seed())
    model = create_model(cfg.model, kind="classifier", in_channels=data.channels, num_classes=data.num_classes,
                         image_size=data.image_size[0]).to(env.device)  # trained in fp32: no autocast
    for module in model.modules():  # Opacus's backward hooks refuse in-place ops on hooked outputs
        if isinstance(module, nn.ReLU):
            module.inplace = False
    trainable, train_inputs, test_inputs = model, data.train.images, data.test.images
    if isinstance(model, ScatterNet):  # the fixed transform once, then DP-SGD on the head alone
        trainable = model.head
        train_inputs, test_inputs = ctx.stages.features(model, cfg.augment, cfg.augment_copies)
    errors = ModuleValidator.validate(trainable, strict=False)
    if errors:
        raise ConfigError(f"model {cfg.model!r} is not DP-SGD compatible (e.g. BatchNorm): {errors[0]}")
    optimizer = make_optimizer(trainable.parameters(), cfg.optimizer, lr=cfg.lr, momentum=cfg.momentum)
    # Poisson sampling runs in the CPU loader; Opacus draws the noise on the parameters' device, so the noise
    # generator lives there.
    sample_gen, noise_gen = torch.Generator(), torch.Generator(device=env.device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_inputs, data.train.labels),
                                         batch_size=cfg.batch_size, generator=sample_gen)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        # Opacus's own secure_mode needs torchcsprng, which has no build for current torch: secure noise is
        # OpenDP's instead (use_secure_noise), and the Poisson batches are drawn from OS-seeded generators.
        engine = PrivacyEngine(accountant=cfg.accountant, secure_mode=False)
    common = dict(module=trainable, optimizer=optimizer, data_loader=loader, max_grad_norm=cfg.max_grad_norm,
                  poisson_sampling=True, noise_generator=noise_gen, grad_sample_mode=cfg.grad_sample_mode)
    if cfg.grad_sample_mode == "ghost":
        # ghost clipping (Opacus's fast gradient clipping): the per-example norms from two backward passes, never
        # the [B, parameters] per-example gradients; the loss must then be per example, so not over augmented copies
        if cfg.augment_copies > 1:
            raise ConfigError("dpsgd.grad_sample_mode=ghost clips each example's loss: it cannot average augmented "
                              "copies (dpsgd.augment_copies > 1); use hooks")
        common["criterion"] = nn.CrossEntropyLoss()
    # σ as planned (and printed by a dry run): calibrated on the run's T steps under the budget's accounting
    made = engine.make_private(**common, noise_multiplier=plan.details["sigma"])
    criterion = made[2] if len(made) == 4 else None  # ghost clipping: (model, optimizer, criterion, loader)
    dp_model, dp_optimizer, dp_loader = made[0], made[1], made[-1]
    dp_loader.batch_sampler.generator = sample_gen  # the generator re-seeded at every epoch below
    dp_optimizer.generator = noise_gen
    if cfg.secure_mode:
        use_secure_noise(dp_optimizer)
    return _Private(model=model, dp_model=dp_model, optimizer=dp_optimizer, loader=dp_loader, engine=engine,
                    sigma=float(dp_optimizer.noise_multiplier), sample_gen=sample_gen, noise_gen=noise_gen,
                    test_inputs=test_inputs, criterion=criterion)


def refuse_lost_record(run: RunDir, start: int, epochs: int) -> None:
    """DP-SGD's record of what it spent is Opacus's accountant in dpsgd-checkpoint.pt (no ledger). A run that trained
    past that checkpoint (its model saved, or epochs logged beyond the one a crash before the checkpoint leaves) has
    lost it: resuming would train, and spend, again while the accountant forgets. Refused before anything trains."""
    if start >= epochs:
        return
    logged = max((int(m.get("epoch") or 0) for m in run.metrics() if m.get("stage") == "dpsgd"), default=0)
    if run.has_weights("model") or logged > start + 1:
        where = run.checkpoint_path("dpsgd-checkpoint")
        held = f"holds {start} epoch(s)" if where.is_file() else "is missing"
        done = "saved its model" if run.has_weights("model") else f"logged {logged} epoch(s) in metrics.jsonl"
        raise RunError(f"{where} {held}, but the run {done}: DP-SGD's record of its spend (Opacus's accountant, "
                       "kept in that checkpoint) is gone or older than the training, and resuming would train, and "
                       "spend, again. Nothing was changed: restore the checkpoint from a backup, or start a new "
                       "--run-dir (what this run spent stays spent)")


def _train_epochs(ctx: Context, cfg: DPSGDConfig, plan: Plan, p: _Private) -> tuple[float, list[dict]]:
    """The DP-SGD epochs on the one training loop (a loop step is an epoch, checkpointed with Opacus's
    accountant after each), so a resumed run continues after the last finished epoch; returns (wall seconds,
    history)."""
    env, budget = ctx.env, ctx.budget
    per_epoch, total = plan.details["per_epoch"], plan.details["total"]
    # the schedule's base rates, read before a checkpoint's (already decayed) rates are loaded
    base_lrs = [g["lr"] for g in p.optimizer.param_groups]

    def evaluate_epoch() -> dict:  # on what dp_model reads (scattering features are not recomputed every epoch)
        eps_now = accountant_epsilon(p.engine.accountant, budget.delta)
        return {"test_accuracy": accuracy(p.dp_model._module, p.test_inputs, ctx.data.test.labels, env),
                f"epsilon_{cfg.accountant}": round(eps_now, 4)}

    loop = TrainingLoop(steps=cfg.epochs, env=env, run=ctx.run, checkpoint="dpsgd-checkpoint", title="DP-SGD epochs",
                        log_stage="dpsgd", modules={"model": p.model},
                        optimizers={"optimizer": p.optimizer.original_optimizer}, eval_every=1, checkpoint_every=1,
                        evaluate=evaluate_epoch, entry_fields=lambda done: {"epoch": done}, mean_parts=False)
    refuse_lost_record(ctx.run, loop.start, cfg.epochs)
    if loop.start:
        p.engine.accountant.load_state_dict(loop.extra["accountant"])
        if abs(loop.extra["noise_multiplier"] - p.sigma) > 1e-12:
            raise ConfigError("the checkpoint's noise multiplier differs from this run's: cannot resume")
    p.model.train()
    with warnings.catch_warnings():
        # Opacus's hooks on a model whose inputs need no gradient warn at every backward pass: nothing to act on
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for epoch in loop:
            if cfg.secure_mode:  # batches nobody can re-derive (the noise does not use noise_gen at all)
                p.sample_gen.manual_seed(secrets.randbits(63))
            else:
                p.sample_gen.manual_seed(env.generator(streams.DPSGD_SAMPLE, env.seed, epoch).initial_seed())
                p.noise_gen.manual_seed(env.generator(streams.DPSGD_NOISE, env.seed, epoch).initial_seed())
            running, seen = 0.0, 0
            for i, (x, y) in enumerate(p.loader):
                step = epoch * per_epoch + i
                for g, lr in zip(p.optimizer.param_groups, base_lrs):
                    g["lr"] = lr * lr_factor(cfg.lr_schedule, step, total)
                if not isinstance(p.model, ScatterNet):  # (a ScatterNet's copies are augmented in its features)
                    x = augment_batch(to_float(x), cfg.augment, env.generator(streams.DPSGD_AUGMENT, epoch, i))
                x, y = x.to(env.device), y.to(env.device)
                p.optimizer.zero_grad(set_to_none=True)
                if len(x):
                    out = p.dp_model(x)  # [B, classes], or [B, copies, classes]: the loss averages the copies
                    if p.criterion is not None:  # ghost clipping: Opacus's loss runs both backward passes
                        loss = p.criterion(out, y)
                    else:
                        loss = F.cross_entropy(out.flatten(0, -2),
                                               y.repeat_interleave(out[0].numel() // out.shape[-1]))
                    loss.backward()
                    running += float(loss.item()) * len(x)
                    seen += len(x)
                p.optimizer.step()
            loop.extra.update(accountant=p.engine.accountant.state_dict(), noise_multiplier=p.sigma)
            loop.record({"train_loss": round(running / max(1, seen), 4)})  # evaluation, log, checkpoint
    result = loop.finish()
    return result.wall_seconds, result.history
