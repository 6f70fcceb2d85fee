"""DP-SGD's plan (the method is methods/dpsgd.py): the noise multiplier σ its run trains with, calibrated on the run's
T steps under the budget's accounting, and the ε its report states once those steps are taken, both computed before
anything trains, so that a dry run prints the σ, the steps and the ε of the run.

Opacus keeps DP-SGD's record (no privacy ledger): the plan's ε is the runner's budget check for it, as the ledger's
pricing is for the other methods.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

from privdistill.errors import ConfigError
from privdistill.methods.runner import Budget, Plan
from privdistill.privacy.accounting import (
    MIN_NOISE_MULTIPLIER,
    pld_poisson_gaussian_replace_one,
    strict_noise_multiplier,
)

OPACUS_ACCOUNTANTS = ("rdp", "prv")


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Opacus's convention: sample rate q = 1 / len(data_loader) = 1 / ceil(n / batch_size)."""
    return max(1, math.ceil(n / batch_size))


def epsilons(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> dict[str, float]:
    """ε of `steps` Poisson-sampled Gaussian steps under Opacus's RDP and PRV accountants (add/remove-one)
    and dp-accounting's PLD with the replace-one relation (the project's strict relation)."""
    if steps == 0:
        return {"rdp": 0.0, "prv": 0.0, "replace_one": 0.0}
    out = {name: opacus_epsilon(name, float(noise_multiplier), float(sample_rate), int(steps), float(delta))
           for name in OPACUS_ACCOUNTANTS}
    out["replace_one"] = pld_poisson_gaussian_replace_one(float(noise_multiplier), float(sample_rate), int(steps),
                                                           float(delta))
    return out


def noise_multiplier(accountant: str, budget: Budget, sample_rate: float, steps: int) -> float:
    """The least σ whose ε for `steps` Poisson-sampled steps at `sample_rate` meets the target under the budget's
    accounting: strict, on the replace-one PLD ε; paper, Opacus's own search under `accountant` (the one
    make_private_with_epsilon runs, but given the steps: from the epochs it counts int(epochs / q) of them, one short
    whenever that division rounds down, and the run's ε would then exceed the target)."""
    if budget.accounting == "strict":
        return strict_noise_multiplier(target_epsilon=budget.epsilon, delta=budget.delta, sample_rate=sample_rate,
                                       steps=steps)
    return opacus_noise_multiplier(accountant, float(budget.epsilon), float(budget.delta), float(sample_rate),
                                   int(steps))


# Both Opacus searches below are memoised: a plan is made more than once in a process, and Opacus's RDP at
# fractional orders is pure Python (slow; research log, "Notes that left the code: methods/dpsgd_plan.py")
@functools.lru_cache(maxsize=256)
def opacus_epsilon(accountant: str, noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of `steps` Poisson-sampled Gaussian steps under Opacus's `accountant` (add/remove-one)."""
    from opacus.accountants import create_accountant

    acc = create_accountant(accountant)
    acc.history = [(noise_multiplier, sample_rate, steps)]
    return accountant_epsilon(acc, delta)


def accountant_epsilon(accountant: Any, delta: float) -> float:
    """What Opacus's `accountant.get_epsilon(delta)` returns, the same float; for its RDP accountant from one
    step's RDP per (σ, q) computed once (RDP composes by a sum: Opacus multiplies that step's values by the step
    count just so), so that the ε a DP-SGD run reports after each epoch costs no new RDP computation."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as analysis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "optimal order is the largest alpha" at tiny ε
        if not isinstance(accountant, RDPAccountant) or not accountant.history:
            return float(accountant.get_epsilon(delta=delta))
        rdp = sum([_rdp_one_step(float(sigma), float(rate)) * steps for sigma, rate, steps in accountant.history])
        eps, _ = analysis.get_privacy_spent(orders=accountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
        return float(eps)


@functools.lru_cache(maxsize=64)
def _rdp_one_step(noise_multiplier: float, sample_rate: float):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as analysis

    return analysis.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1,
                                orders=RDPAccountant.DEFAULT_ALPHAS)


@functools.lru_cache(maxsize=64)
def opacus_noise_multiplier(accountant: str, epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """Opacus's own σ search under `accountant`, given the steps."""
    try:
        from opacus.accountants.utils import get_noise_multiplier
    except ImportError as err:  # pragma: no cover - opacus is an optional extra
        raise ConfigError("DP-SGD needs Opacus: pip install 'privdistill[dpsgd]'") from err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "optimal order is the largest alpha" at tiny ε
        return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=accountant))


def plan_dpsgd(cfg: Any, budget: Budget, records: int) -> Plan:
    """What a DP-SGD run of `cfg` (section `dpsgd`) on `records` private records spends: T = epochs x steps per epoch
    steps at q = 1 / steps per epoch with the calibrated σ, and the ε of the run (paper: Opacus's under
    `cfg.accountant`; strict: replace-one PLD) as its report states it."""
    per_epoch = steps_per_epoch(records, cfg.batch_size)
    total, rate = per_epoch * cfg.epochs, 1.0 / per_epoch
    sigma = noise_multiplier(cfg.accountant, budget, rate, total)
    eps = epsilons(sigma, rate, total, budget.delta)
    spend = {"type": "dpsgd-opacus", "noise_multiplier": sigma, "sample_rate": rate, "steps": total,
             "max_grad_norm": cfg.max_grad_norm, "expected_batch_size": cfg.batch_size,
             "describe": f"DP-SGD (Opacus): {total} steps ({cfg.epochs} epochs of {per_epoch}), Poisson rate "
                         f"{rate:.4g}, noise multiplier {sigma:.6g}, C = {cfg.max_grad_norm:g}, expected batch "
                         f"{cfg.batch_size}"}
    notes = []
    if budget.accounting == "strict" and sigma == MIN_NOISE_MULTIPLIER and eps["replace_one"] < budget.epsilon:
        notes.append(f"the noise multiplier is at its floor {MIN_NOISE_MULTIPLIER:g} (privacy/accounting.py): this "
                     f"plan spends strict ε {eps['replace_one']:.4g}, less than the target {budget.epsilon:g}")
    return Plan(remaining=[], notes=notes,
                details={"per_epoch": per_epoch, "total": total, "sample_rate": rate, "sigma": sigma,
                                       "epsilons": eps},
                spends=[spend], epsilon={"paper": eps[cfg.accountant], "strict": eps["replace_one"]})
