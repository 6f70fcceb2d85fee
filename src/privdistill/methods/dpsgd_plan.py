"""DP-SGD's plan (the method is methods/dpsgd.py): the noise multiplier σ its run trains with, calibrated on the run's
T steps under the budget's accounting, and the ε its report states once those steps are taken, both computed before
anything trains, so that a dry run prints the σ, the steps and the ε of the run.

Opacus keeps DP-SGD's record (no privacy ledger): the plan's ε is the runner's budget check for it, as the ledger's
pricing is for the other methods.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from privdistill.errors import ConfigError
from privdistill.methods.runner import Budget, Plan
from privdistill.privacy.accounting import pld_poisson_gaussian_replace_one, strict_noise_multiplier

OPACUS_ACCOUNTANTS = ("rdp", "prv")


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Opacus's convention: sample rate q = 1 / len(data_loader) = 1 / ceil(n / batch_size)."""
    return max(1, math.ceil(n / batch_size))


def epsilons(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> dict[str, float]:
    """ε of `steps` Poisson-sampled Gaussian steps under Opacus's RDP and PRV accountants (add/remove-one)
    and dp-accounting's PLD with the replace-one relation (the project's strict relation)."""
    from opacus.accountants import create_accountant

    out: dict[str, float] = {}
    if steps == 0:
        return {"rdp": 0.0, "prv": 0.0, "replace_one": 0.0}
    for name in OPACUS_ACCOUNTANTS:
        acc = create_accountant(name)
        acc.history = [(noise_multiplier, sample_rate, steps)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "optimal order is the largest alpha" at tiny ε
            out[name] = float(acc.get_epsilon(delta=delta))
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
    try:
        from opacus.accountants.utils import get_noise_multiplier
    except ImportError as err:  # pragma: no cover - opacus is an optional extra
        raise ConfigError("DP-SGD needs Opacus: pip install 'privdistill[dpsgd]'") from err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "optimal order is the largest alpha" at tiny ε
        return float(get_noise_multiplier(target_epsilon=budget.epsilon, target_delta=budget.delta,
                                          sample_rate=sample_rate, steps=steps, accountant=accountant))


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
    return Plan(remaining=[], details={"per_epoch": per_epoch, "total": total, "sample_rate": rate, "sigma": sigma,
                                       "epsilons": eps},
                spends=[spend], epsilon={"paper": eps[cfg.accountant], "strict": eps["replace_one"]})
