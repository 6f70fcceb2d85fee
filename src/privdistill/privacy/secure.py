"""Secure noise: every privacy draw from a cryptographically secure stream, a whole tensor at a time.

What it protects against, beyond a seeded run (``noise_source(seed)``):

* A known seed. Every call keys a fresh ChaCha20 stream (pyca/cryptography, OpenSSL's implementation) with 256
  bits from the operating system's CSPRNG (``os.urandom``); the key lives only for that call and nothing that
  could regenerate the noise is written anywhere (a resumed run reuses the ledger's recorded answers, the release
  itself, or pays again for what it must redraw: DPDFD, methods/dpdfd_plan.py).
* Floating-point attacks (Mironov, CCS 2012; Jin et al. 2022 for the Gaussian and Opacus). Vote counts are
  integers and get discrete Laplace / discrete Gaussian noise (Canonne, Kamath & Steinke 2020, "CKS20"): the
  output is an integer. A real-valued release x (DPDFD's gradients, DGD's latent codes, DP-SGD's summed gradients)
  is put on a grid of step h = 2^(floor(log2 scale) - GRID_BITS), a power of two fixed by the noise scale alone,
  and gets discrete noise on that grid: the output is (round(x / h) + Y) * h with Y a discrete Laplace / Gaussian
  of scale scale / h. The set of reachable outputs is the grid, whatever x is.

How the draws are made (vectorised: numpy over arrays, rejection rounds until every coordinate is accepted):

* discrete Laplace of scale b (CKS20, Algorithm 2 with a power-of-two block T >= b): U uniform on {0..T-1} kept
  with probability exp(-U/b); V geometric, P(V >= k) = exp(-kT/b), by repeated Bernoulli trials; X = U + T V; a
  fair sign, rejecting (-, 0). The output is exactly discrete-Laplace distributed up to the Bernoulli trials below.
* discrete Gaussian of scale sigma (CKS20, Algorithm 3): Y from the discrete Laplace of scale t (a power of two
  near sigma; the algorithm is correct for every t > 0), kept with probability exp(-(|Y| - sigma^2/t)^2 / (2
  sigma^2)).
* randomized response on a set of k members: keep with probability p, else a uniform other member.

Exactness. Every random choice above is either a uniform integer taken from the stream's bits (exact: T is a power
of two) or a Bernoulli trial u < p with u a 53-bit uniform and p a float64 evaluated with numpy's exp. Each such
trial's probability is off by at most BERNOULLI_ERROR = 2^-50 (granularity 2^-53, plus the rounding of exp and
of its argument: a few ulps of p times a factor x e^-x <= 1, bounded generously). Coupling the exact algorithm with
this one trial by trial, the two outputs differ with probability at most (expected trials) x 2^-50: that is the
total-variation distance of each draw from the exact law, ``tv_per_draw`` (about 1e-14 for every sampler here;
the trials are counted analytically, ``expected_trials``). n draws are within n x tv of the exact joint law, and a
mechanism (ε, δ)-DP under the exact law is (ε, δ + (1 + e^ε) n tv)-DP under this one; ``TALLY`` counts the draws
and their bound so that the run can state it and add it to δ (privacy/report.py).

Grid rounding moves each coordinate by at most h/2 before the noise (and the noise is on the grid): the L2
sensitivity grows by at most sqrt(d) h = sqrt(d) scale 2^-GRID_BITS (L1: d h), a relative change of
sqrt(d) (scale/Δ) 2^-30 (about 2e-7 for DP-SGD's 39,700-coordinate head at noise multiplier 1): below the precision
any ε here is printed with.

Speed (privdistill bench noise; docs/benchmarks.md): the stream gives about 4 GB/s on one core; the samplers cost a
small multiple of torch.randn on the same shape. OpenDP (its exact samplers over Python lists, ~10-30 µs a
coordinate) is the reference the tests compare the laws with.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from privdistill.errors import PrivacyError

GRID_BITS = 30  # real-valued noise lives on the grid h = 2^(floor(log2 scale) - GRID_BITS) (module docstring)
BERNOULLI_ERROR = 2.0 ** -50  # bound on |P(u < p̂) - p| for one Bernoulli trial (module docstring)
_MASK53 = np.uint64((1 << 53) - 1)
_TWO_M53 = 2.0 ** -53


class SecureStream:
    """Uniform 64-bit words from ChaCha20 keyed from os.urandom on every call (no state survives a call)."""

    def words(self, n: int) -> np.ndarray:
        if n <= 0:
            return np.empty(0, dtype=np.uint64)
        encryptor = Cipher(algorithms.ChaCha20(os.urandom(32), os.urandom(16)), mode=None).encryptor()
        out = bytearray(8 * n)
        encryptor.update_into(bytes(8 * n), out)
        return np.frombuffer(out, dtype=np.uint64)

    def words32(self, n: int) -> np.ndarray:
        return self.words((n + 1) // 2).view(np.uint32)[:n]

    def uniform(self, n: int) -> np.ndarray:
        """n floats uniform on the 53-bit grid of [0, 1)."""
        return (self.words(n) >> np.uint64(11)).astype(np.float64) * _TWO_M53


@dataclass
class Tally:
    """Draws made by the secure samplers in this process and the bound on their total-variation distance from
    the exact laws (module docstring). ``reset`` at the start of a run; read by the run's privacy report."""

    draws: int = 0
    tv: float = 0.0

    def add(self, draws: int, tv_per_draw: float) -> None:
        with _LOCK:
            self.draws += int(draws)
            self.tv += int(draws) * tv_per_draw

    def reset(self) -> None:
        with _LOCK:
            self.draws, self.tv = 0, 0.0


_LOCK = threading.Lock()
TALLY = Tally()


def _pow2_at_least(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(x))) if x > 1 else 1


class _Sampler:
    """CKS20's discrete Laplace / discrete Gaussian as one rejection sampler, compiled (module docstring).

    A candidate is X = U + T V: U uniform on {0..T-1} and a sign from one 32-bit word; V geometric with
    P(V >= k) = q^k, q = exp(-T/b), by inverse CDF: V counts the thresholds floor(q^k 2^64) above a 64-bit uniform w
    (exact up to 2^-64 a threshold and their float rounding; w's low half is drawn only when its high half ties a
    threshold's, one time in 2^32). It is kept with probability exp(-U/b), which makes X discrete-Laplace of scale b
    (P(X = x) ∝ exp(-|x|/b)), times, for the Gaussian, CKS20's exp(-(|X| - sigma^2/b)^2 / (2 sigma^2)): one
    Bernoulli trial with the product of both probabilities (the same acceptance as two independent trials), decided
    on a 64-bit uniform drawn 32 bits at a time (the second half only on a tie); (-, 0) is rejected.

    T is a power of two about b/4 (b: the Laplace scale; for the Gaussian, CKS20's t, a power of two near sigma:
    the algorithm is correct for every t > 0): U is then kept 88 % of the time, at the price of a longer walk
    along the thresholds for V, which costs a compare a step.
    """

    def __init__(self, distribution: str, scale: float):
        self.distribution, self.scale = distribution, float(scale)
        if self.scale >= 2.0 ** 40:
            raise PrivacyError(f"integer noise of scale {self.scale:.3g} is beyond the samplers here (< 2^40)")
        if distribution == "laplace":
            self.b = self.scale
        else:
            self.b = float(2.0 ** max(0, round(math.log2(self.scale)))) if self.scale > 1 else 1.0
        self.block_bits = max(0, math.floor(math.log2(self.b / BLOCK_DIVISOR))) if self.b >= 2 * BLOCK_DIVISOR else 0
        self.block = 1 << self.block_bits
        q = math.exp(-self.block / self.b)
        thresholds = []
        while True:
            value = math.floor(q ** (len(thresholds) + 1) * 2.0 ** 64)
            if value <= 0:
                break
            thresholds.append(min(value, (1 << 64) - 1))
        self.th_hi = np.array([t >> 32 for t in thresholds], dtype=np.uint32)
        self.th_lo = np.array([t & 0xFFFFFFFF for t in thresholds], dtype=np.uint32)
        self.centre = self.scale * self.scale / self.b
        self.two_var = 2 * self.scale * self.scale
        self.acceptance = self._acceptance(q)
        # per candidate one approximate Bernoulli trial, and V's thresholds (their rounding, about 1e-16 in all, is
        # counted as one more trial); 1 / acceptance candidates an output
        self.trials = 2 / self.acceptance
        self.words_per_candidate = 3.01

    def _acceptance(self, q: float) -> float:
        """P(a candidate is kept). Before the trial P(X = x) = (1 - q) q^floor(x/T) / T; times exp(-(x mod T)/b)
        that is (1 - q) exp(-x/b) / T, for each sign; the Gaussian factor and the (-, 0) rejection on top. Summed
        exactly while that is cheap, else by a fine Riemann sum of the same smooth summand, less a 1 % margin."""
        if self.distribution == "laplace":
            return (1 - q) / self.block * (1 / -math.expm1(-1 / self.b) - 0.5)
        span = int(self.centre + 40 * self.scale) + 2
        gauss = lambda x: np.exp(-x / self.b - (x - self.centre) ** 2 / self.two_var)  # noqa: E731
        if span <= 4_000_000:
            total = float(np.sum(gauss(np.arange(span, dtype=np.float64)))) - 0.5 * float(gauss(np.float64(0)))
        else:
            x = np.linspace(0.0, span, 4_000_001)
            total = 0.99 * float(np.trapezoid(gauss(x), x))
        return (1 - q) / self.block * total

    def sample(self, stream: SecureStream, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        # two threads (the compiled loop releases the GIL) each fill half of `out` from their own stream
        halves = [(0, n // 2), (n // 2, n)] if n >= PARALLEL_FROM else [(0, n)]
        if len(halves) == 1:
            self._fill(stream, out)
        else:
            list(_pool().map(lambda span: self._fill(SecureStream(), out[span[0]:span[1]]), halves))
        return out

    def _fill(self, stream: SecureStream, out: np.ndarray) -> None:
        filled = 0
        while filled < out.size:
            words = stream.words32(int((out.size - filled) / self.acceptance * self.words_per_candidate * 1.02) + 64)
            filled = _candidates(words, out, filled, self.block_bits, self.b, self.centre, 1 / self.two_var,
                                 self.distribution == "gaussian", self.th_hi, self.th_lo)


BLOCK_DIVISOR = 4  # T is about b / BLOCK_DIVISOR (the class docstring; measured fastest of 1, 2, 4, 8)
PARALLEL_FROM = 16_384  # draws from which the sampler splits the work over two threads


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="privdistill-noise")


UNROLLED = 16  # V's first thresholds, compared without branches (a longer walk is the rare slow path)


@numba.njit(cache=True, nogil=True)
def _candidates(words, out, filled, block_bits, b, centre, inv_two_var, gaussian, th_hi, th_lo
                ):  # pragma: no cover - compiled
    """Candidates (the class docstring) from the 32-bit words until `out` is full or the words may run short;
    returns the new fill. Compiled with numba and kept free of unpredictable branches on the common path (a
    random accept/reject branch would cost more than the arithmetic): a candidate costs a few nanoseconds."""
    mask = np.uint32((1 << block_bits) - 1)
    block = float(1 << block_bits)
    inv_b = 1.0 / b
    levels = th_hi.size
    quick = min(UNROLLED, levels)
    pos = 0
    end = words.size - 6  # a candidate reads at most 6 words
    while filled < out.size and pos <= end:
        first = words[pos]
        w_hi = words[pos + 1]
        pos += 2
        v = 0
        for k in range(quick):
            v += w_hi < th_hi[k]
        # V is settled by the high half unless it ties the threshold it stopped at, or the walk runs past `quick`
        if v == quick or w_hi == th_hi[v]:
            w_lo = words[pos]
            pos += 1
            v = 0
            while v < levels and (w_hi < th_hi[v] or (w_hi == th_hi[v] and w_lo < th_lo[v])):
                v += 1
        u = float(first & mask)
        x = u + block * v
        log_p = -u * inv_b
        if gaussian:
            d = x - centre
            log_p -= d * d * inv_two_var
        scaled = math.exp(log_p) * 4294967296.0  # p 2^32: keep iff the 64-bit uniform a.a_lo < p 2^64
        a = float(words[pos])
        pos += 1
        keep = a + 1.0 <= scaled  # a < floor(p 2^32): settled on the high half
        if a <= scaled and not keep:  # a == floor(p 2^32) (one time in 2^32): the low half decides
            keep = float(words[pos]) < (scaled - a) * 4294967296.0
            pos += 1
        negative = first >= np.uint32(1 << 31)
        keep &= not (negative and x == 0)
        out[filled] = -np.int64(x) if negative else np.int64(x)
        filled += keep
    return filled


_SAMPLERS: dict[tuple[str, float], _Sampler] = {}


def sampler(distribution: str, scale: float) -> _Sampler:
    """The integer sampler for `distribution` at `scale` (cached: its acceptance is computed once)."""
    key = (distribution, float(scale))
    if key not in _SAMPLERS:
        _SAMPLERS[key] = _Sampler(distribution, float(scale))
    return _SAMPLERS[key]


def tv_per_draw(distribution: str, scale: float) -> float:
    """Bound on one draw's total-variation distance from the exact discrete law (module docstring)."""
    return sampler(distribution, scale).trials * BERNOULLI_ERROR


def grid_step(scale: float) -> float:
    """The grid of real-valued noise at this scale: a power of two, a function of the scale alone."""
    return 2.0 ** (math.floor(math.log2(scale)) - GRID_BITS)


class SecureNoise:
    """The privacy noise of a run in secure mode. Pass it wherever a mechanism takes ``generator=``
    (privacy.mechanisms); it has no state and no seed. Draws happen on the CPU; results come back on the
    input's device."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.stream = SecureStream()

    def __repr__(self) -> str:
        return "SecureNoise(ChaCha20 from OS entropy)"

    def integers(self, n: int, *, distribution: str, scale: float) -> np.ndarray:
        """n draws of the discrete Laplace (scale b) or discrete Gaussian (sigma) on the integers."""
        if distribution not in ("laplace", "gaussian"):
            raise PrivacyError(f"unknown noise distribution {distribution!r}")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise PrivacyError(f"noise scale must be a positive finite number, got {scale!r}")
        draw = sampler(distribution, float(scale))
        out = draw.sample(self.stream, n)
        TALLY.add(n, draw.trials * BERNOULLI_ERROR)
        return out

    def add(self, values: torch.Tensor, *, distribution: str, scale: float) -> torch.Tensor:
        """values + noise, elementwise: discrete noise on the integers for an integer tensor (vote counts), noise
        on the grid for a floating-point one (decided by the dtype, never by the values: a float tensor that
        happens to hold integers still gets real-valued noise). `scale` is the Laplace b or the Gaussian sigma."""
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise PrivacyError(f"noise scale must be a positive finite number, got {scale!r}")
        flat = values.detach().reshape(-1).cpu()
        if not flat.is_floating_point():
            noisy = flat.long().numpy() + self.integers(flat.numel(), distribution=distribution, scale=scale)
            return torch.from_numpy(noisy).to(values.device).reshape(values.shape)
        h = grid_step(float(scale))
        on_grid = np.rint(flat.double().numpy() / h)
        if on_grid.size and not np.all(np.abs(on_grid) < 2.0 ** 52 - 2.0 ** 48):
            raise PrivacyError(f"a value of magnitude {float(flat.abs().max()):.3g} is too large for noise of scale "
                               f"{scale:.3g} on its grid (|x| must stay below 2^{52 - GRID_BITS - 1} times the scale)")
        noise = self.integers(on_grid.size, distribution=distribution, scale=float(scale) / h)
        noisy = (on_grid + noise.astype(np.float64)) * h  # integers < 2^53 times a power of two: exact
        return torch.from_numpy(noisy).to(device=values.device, dtype=values.dtype).reshape(values.shape)

    def randomized_response(self, in_set: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """k-RR on each row's candidate set (privacy.mechanisms.rr_on_sets): the label is kept with probability
        keep[i] if it is in the set, else another member is drawn uniformly; a label outside the set gives a
        uniform member. One Bernoulli trial (a 53-bit uniform) and one uniform index (a 64-bit word modulo the
        count: bias below k 2^-64) per row, compiled."""
        mask = in_set.cpu().bool()
        n = mask.shape[0]
        if n == 0:
            return torch.empty(0, dtype=torch.int64, device=labels.device)
        if bool((mask.sum(1) == 0).any()):
            raise PrivacyError("randomized_response: every row's candidate set needs at least one member")
        out = np.empty(n, dtype=np.int64)
        _rr_rows(mask.numpy().view(np.uint8), labels.cpu().long().numpy(), keep.cpu().double().numpy(),
                 self.stream.words(2 * n), out)
        TALLY.add(n, 2 * BERNOULLI_ERROR)
        return torch.from_numpy(out).to(labels.device)


@numba.njit(cache=True, nogil=True)
def _rr_rows(mask, labels, keep, words, out):  # pragma: no cover - compiled
    classes = mask.shape[1]
    for i in range(mask.shape[0]):
        y = labels[i]
        members = 0
        for c in range(classes):
            members += mask[i, c]
        inside = 0 <= y < classes and mask[i, y] == 1
        if inside and float(words[2 * i] >> np.uint64(11)) * 2.0 ** -53 < keep[i]:
            out[i] = y
            continue
        others = members - 1 if inside else members
        if others == 0:  # the label is the set's only member
            out[i] = y
            continue
        j = words[2 * i + 1] % np.uint64(others)
        for c in range(classes):
            if mask[i, c] == 1 and not (inside and c == y):
                if j == 0:
                    out[i] = c
                    break
                j -= np.uint64(1)


def use_secure_noise(optimizer) -> None:
    """DP-SGD in secure mode: an Opacus DPOptimizer's Gaussian noise, N(0, (sigma C)^2) per coordinate of the summed
    clipped gradient, drawn here on the grid instead of by torch. Everything else, and so the accounting, stays
    Opacus's. (Opacus's own secure_mode needs torchcsprng, which has no build for current torch.)"""
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    secure = SecureNoise()

    def add_noise() -> None:
        std = optimizer.noise_multiplier * optimizer.max_grad_norm
        for param in optimizer.params:
            _check_processed_flag(param.summed_grad)
            param.grad = secure.add(param.summed_grad, distribution="gaussian", scale=std).view_as(param)
            _mark_as_processed(param.summed_grad)

    optimizer.add_noise = add_noise


# ------------------------------------------------------------------------------------ OpenDP, the reference
def _opendp():
    try:
        import opendp.prelude as dp
    except ImportError as err:  # pragma: no cover - opendp is a core dependency
        raise PrivacyError("the OpenDP reference needs OpenDP (pip install opendp)") from err
    dp.enable_features("contrib")
    return dp


def opendp_integers(n: int, *, distribution: str, scale: float) -> np.ndarray:
    """n draws of OpenDP's exact discrete Laplace / Gaussian on the integers: the reference the tests and
    `privdistill bench noise` compare the samplers here with."""
    dp = _opendp()
    domain = dp.vector_domain(dp.atom_domain(T=int), size=n)
    metric = dp.l1_distance(T=int) if distribution == "laplace" else dp.l2_distance(T=int)
    make = dp.m.make_laplace if distribution == "laplace" else dp.m.make_gaussian
    return np.asarray(make(domain, metric, float(scale))([0] * n), dtype=np.int64)


def privacy_map_check(distribution: str, scale: float, size: int, sensitivity: float) -> float:
    """OpenDP's own privacy figure for its discrete mechanism on integers at `sensitivity` (L1 for Laplace: ε; L2
    for Gaussian: zCDP ρ). The tests compare it with Δ/b and Δ²/(2σ²), the figures the accountants use."""
    dp = _opendp()
    domain = dp.vector_domain(dp.atom_domain(T=int), size=size)
    metric = dp.l1_distance(T=int) if distribution == "laplace" else dp.l2_distance(T=int)
    make = dp.m.make_laplace if distribution == "laplace" else dp.m.make_gaussian
    return float(make(domain, metric, float(scale)).map(int(sensitivity)))
