"""Data-dependent RDP bounds of the PATE aggregators, written from the papers' statements.

* Papernot et al., ICLR 2018 (arXiv 1802.08908): Theorem 6, Propositions 7, 8 and 10, and Confident-GNMax's
  threshold step (sensitivity 1 instead of sqrt(2)).
* Papernot et al., ICLR 2017 (arXiv 1610.05755): Theorem 3 and Lemma 4.

Vectorised over queries: ``votes`` [Q, K] -> RDP values [Q, L] at the L orders. Neighbouring relation: replace-one
(a record moves one teacher's vote). A data-dependent epsilon is itself a function of the private data: publishing
it needs PATE 2018's smooth-sensitivity step (not implemented); the headline strict figure is data-independent.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import log_ndtr, logsumexp

from privdistill.errors import PrivacyError
from privdistill.privacy._checks import check_positive


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """log(1 - exp(x)) for x <= 0, stable at both ends (-inf for x == 0)."""
    x = np.asarray(x, dtype=float)
    out = np.empty_like(x)
    far = x < -math.log(2.0)
    out[far] = np.log1p(-np.exp(x[far]))
    near = ~far
    with np.errstate(divide="ignore"):
        out[near] = np.log(-np.expm1(x[near]))
    return out


def check_votes(votes, *, name: str = "votes") -> np.ndarray:
    """Vote histograms as a float array [Q, K]; empty, ragged, negative or non-finite input raises."""
    try:
        arr = np.asarray(votes, dtype=float)
    except (TypeError, ValueError) as err:
        raise PrivacyError(f"{name} must be a numeric array [queries, classes]: {err}") from None
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise PrivacyError(f"{name} must have shape [queries, classes], got shape {tuple(arr.shape)}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise PrivacyError(f"{name} is empty (shape {tuple(arr.shape)})")
    if arr.shape[1] < 2:
        raise PrivacyError(f"{name} needs at least 2 classes, got {arr.shape[1]}")
    if not np.all(np.isfinite(arr)):
        raise PrivacyError(f"{name} contains NaN or infinite counts")
    if np.any(arr < 0):
        raise PrivacyError(f"{name} contains negative counts")
    return arr


# ---------------------------------------------------------------------------------- q (Pr[not argmax])
def _union_bound(v: np.ndarray, log_beats) -> np.ndarray:
    """ln sum over i != i* of Pr[class i beats the top class i*], `log_beats` giving that log-probability from
    the gaps n_i* - n_i >= 0; capped at 1 - 1/K (the top class is always the most likely outcome)."""
    top = np.argmax(v, axis=1)
    terms = log_beats(v[np.arange(v.shape[0]), top][:, None] - v)
    terms[np.arange(v.shape[0]), top] = -np.inf
    return np.minimum(logsumexp(terms, axis=1), math.log1p(-1.0 / v.shape[1]))


def log_q_gnmax(votes, sigma: float) -> np.ndarray:
    """Upper bound on ln Pr[GNMax output != argmax] per query (PATE 2018, Prop. 7; union bound).

    Class i beats the top class i* with probability Pr[N(0, 2 sigma^2) > n_i* - n_i].
    """
    sigma = check_positive("sigma", sigma)
    return _union_bound(check_votes(votes), lambda gaps: log_ndtr(-gaps / (math.sqrt(2.0) * sigma)))


def log_q_lnmax(votes, scale: float) -> np.ndarray:
    """Upper bound on ln Pr[LNMax output != argmax] per query (PATE 2017, Lemma 4; union bound).

    With Laplace noise of scale b, class i beats i* with probability <= (2 + g)/4 * exp(-g),
    g = (n_i* - n_i)/b.
    """
    scale = check_positive("Laplace scale", scale)
    return _union_bound(check_votes(votes), lambda gaps: np.log(2.0 + gaps / scale) - math.log(4.0) - gaps / scale)


def log_pr_answered(votes, threshold: float, sigma1: float) -> np.ndarray:
    """ln Pr[max(votes) + N(0, sigma1^2) >= threshold] per query (Confident-GNMax step 1)."""
    sigma1 = check_positive("sigma1", sigma1)
    v = check_votes(votes)
    return log_ndtr((v.max(axis=1) - float(threshold)) / sigma1)


# ----------------------------------------------------------------------------------------- RDP bounds
def _orders(orders) -> np.ndarray:
    o = np.atleast_1d(np.asarray(orders, dtype=float))
    if np.any(o <= 1) or not np.all(np.isfinite(o)):
        raise PrivacyError("Renyi orders must be finite and > 1")
    return o


def rdp_gnmax_data_dependent(logq, sigma: float, orders) -> np.ndarray:
    """Data-dependent GNMax RDP (PATE 2018, Theorem 6 applied at the orders of Prop. 10).

    ``logq``: array [Q] of upper bounds on ln Pr[outcome != argmax]. Returns [Q, L]; every entry is
    min(data-independent bound, Theorem 6 bound) where Theorem 6's conditions hold.
    """
    sigma = check_positive("sigma", sigma)
    o = _orders(orders)
    logq = np.atleast_1d(np.asarray(logq, dtype=float))
    if np.any(logq > 0):
        raise PrivacyError("log q must be <= 0")
    var = sigma**2
    base = np.broadcast_to(o / var, (logq.size, o.size)).copy()
    finite = np.isfinite(logq)
    # q = 0: the outcome is certain, no privacy cost at all.
    base[~finite] = 0.0
    if not np.any(finite):
        return base
    lq = logq[finite][:, None]
    mu2 = np.sqrt(var * -lq)
    mu1 = mu2 + 1.0
    eps1 = mu1 / var
    eps2 = mu2 / var
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = (mu2 > 1.0) & (-lq > eps2) & (
            lq <= (mu2 - 1.0) * eps2 - mu2 * (np.log(mu1 / (mu1 - 1.0)) + np.log(mu2 / (mu2 - 1.0))))
        applies = cond & (o[None, :] < mu1)
        log_1mq = _log1mexp(lq)
        log_a = log_1mq - _log1mexp(np.minimum((lq + eps2) * (1.0 - 1.0 / mu2), 0.0))
        log_b = eps1 - lq / (mu1 - 1.0)
        lam1 = o[None, :] - 1.0
        log_s = np.logaddexp(log_1mq + lam1 * log_a, lq + lam1 * log_b)
        dd = log_s / lam1
    sub = base[finite]
    sub = np.where(applies & np.isfinite(dd), np.minimum(sub, dd), sub)
    base[finite] = sub
    return base


def rdp_threshold_data_dependent(log_pr: np.ndarray, sigma1: float, orders) -> np.ndarray:
    """Data-dependent RDP of the threshold check: Theorem 6 with q = Pr[the less likely of answered /
    not answered]; the sensitivity is 1 instead of sqrt(2), i.e. GNMax's formula at sigma*sqrt(2)."""
    log_pr = np.atleast_1d(np.asarray(log_pr, dtype=float))
    logq = np.minimum(log_pr, _log1mexp(np.minimum(log_pr, 0.0)))
    return rdp_gnmax_data_dependent(logq, math.sqrt(2.0) * check_positive("sigma1", sigma1), orders)


def rdp_pure_data_dependent(logq, pure_epsilon: float, orders) -> np.ndarray:
    """Data-dependent RDP of an eps-DP noisy max (PATE 2017, Theorem 3), capped by the
    data-independent bounds eps^2 lambda / 2 (eps-DP implies eps^2/2-zCDP) and eps. Returns [Q, L]."""
    eps = check_positive("pure epsilon", pure_epsilon)
    o = _orders(orders)
    logq = np.atleast_1d(np.asarray(logq, dtype=float))
    if np.any(logq > 0):
        raise PrivacyError("log q must be <= 0")
    cap = np.minimum(0.5 * eps**2 * o, eps)
    out = np.broadcast_to(cap, (logq.size, o.size)).copy()
    q = np.exp(logq)
    ok = q <= 1.0 / (math.exp(eps) + 1.0)
    if np.any(ok):
        lq = logq[ok][:, None]
        lam1 = o[None, :] - 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            log_1mq = _log1mexp(lq)
            t_one = log_1mq + (log_1mq - _log1mexp(np.minimum(eps + lq, 0.0))) * lam1
            t_two = lq + eps * lam1
            dd = np.logaddexp(t_one, t_two) / lam1
        dd = np.where(np.isfinite(dd), dd, np.inf)
        out[ok] = np.minimum(out[ok], dd)
    out[~np.isfinite(logq)] = 0.0
    return out
