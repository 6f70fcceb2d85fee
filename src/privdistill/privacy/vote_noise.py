"""What a vote's noise leaves of the teachers' answer, before any teacher is trained (DGD and PATE plans).

The noise of LNMax/GNMax is fixed in vote units (DGD's b = 40 was chosen for 250 teachers); with fewer teachers
the same noise drowns the vote. `unanimous_label_accuracy` is the best a noisy label can do: the probability
that it names the class every teacher voted for. Real teachers disagree, so real label accuracy is lower. The
plans print it, and warn when it is below `WARN_BELOW`. A Monte-Carlo estimate of a public formula with public
parameters: no private data is read and nothing here spends privacy.
"""

from __future__ import annotations

import warnings

import numpy as np

WARN_BELOW = 0.6


class VoteNoiseWarning(UserWarning):
    """The vote noise is so large for this many teachers that most noisy labels would be wrong."""


def unanimous_label_accuracy(num_teachers: int, num_classes: int, *, distribution: str, scale: float,
                             threshold: float | None = None, sigma1: float | None = None,
                             draws: int = 20000) -> tuple[float, float]:
    """(P(noisy label = the unanimous class), P(answered)) for `num_teachers` votes on one class of `num_classes`,
    noised with Laplace(scale) or N(0, scale^2); Confident-GNMax's threshold step with `threshold`, `sigma1`."""
    rng = np.random.default_rng(0)
    votes = np.zeros((draws, num_classes))
    votes[:, 0] = num_teachers
    noise = rng.laplace(0.0, scale, votes.shape) if distribution == "laplace" else rng.normal(0.0, scale, votes.shape)
    right = float(np.mean(np.argmax(votes + noise, axis=1) == 0))
    answered = 1.0
    if threshold is not None and sigma1 is not None:
        answered = float(np.mean(num_teachers + rng.normal(0.0, sigma1, draws) >= threshold))
    return right, answered


def vote_noise_note(num_teachers: int, num_classes: int, *, distribution: str, scale: float, option: str,
                    threshold: float | None = None, sigma1: float | None = None) -> str:
    """One line for the plan's notes; warns (VoteNoiseWarning) when the noise leaves little of the vote."""
    right, answered = unanimous_label_accuracy(num_teachers, num_classes, distribution=distribution, scale=scale,
                                               threshold=threshold, sigma1=sigma1)
    kind = "Laplace b" if distribution == "laplace" else "Gaussian sigma"
    note = (f"vote noise ({kind} = {scale:g}, {num_teachers} teachers): even if every teacher voted for the right "
            f"class, a noisy label would be right {right:.0%} of the time")
    if threshold is not None:
        note += f", and {answered:.0%} of the queries would pass the threshold T = {threshold:g}"
    if right < WARN_BELOW or answered < 0.5:
        fitted = scale_for_accuracy(num_teachers, num_classes, distribution=distribution, target=0.9)
        note += (f"; a {kind} of {fitted:.3g} would make it 90 % (each query then costs more epsilon: "
                 "--dry-run shows how many fit)")
        warnings.warn(f"{note}. The noise was set for another number of teachers: lower {option} or use more "
                      "teachers.", VoteNoiseWarning, stacklevel=3)
    return note


def scale_for_accuracy(num_teachers: int, num_classes: int, *, distribution: str, target: float) -> float:
    """The largest noise scale (to 2 %) at which a unanimous vote of `num_teachers` still gives the right label with
    probability `target`: the noise a run with this many teachers could afford (bisection on the Monte-Carlo
    estimate above; accuracy falls as the scale grows)."""
    low, high = 1e-3 * num_teachers, 10.0 * num_teachers
    while high / low > 1.02:
        mid = (low * high) ** 0.5
        if unanimous_label_accuracy(num_teachers, num_classes, distribution=distribution, scale=mid,
                                    draws=4000)[0] >= target:
            low = mid
        else:
            high = mid
    return low
