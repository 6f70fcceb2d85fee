"""Secure noise: every privacy draw from a cryptographically secure stream, a whole tensor at a time.

What it protects against, beyond a reproducible run (``noise_source(seed)``):

* A known seed: every call keys a fresh ChaCha20 stream (pyca/cryptography) with 256 bits of ``os.urandom``; nothing
  that could regenerate the noise is written anywhere (a resumed run reuses the ledger's answers or pays again).
* Floating-point attacks (Mironov, CCS 2012): integer votes get discrete Laplace / Gaussian noise (Canonne, Kamath &
  Steinke 2020, "CKS20"); a real value x is put on a grid of step h = 2^(floor(log2 scale) - GRID_BITS) and gets
  discrete noise on it, (round(x / h) + Y) * h: the reachable outputs are the grid, whatever x is.

The draws (`_Sampler`): CKS20's samplers as one numba rejection loop over the stream's 32-bit words.

Exactness, and what is added to ε and δ: every uniform and every Bernoulli trial is exact for its float64
probability p̂; p̂ itself is within a relative error r of the true value, so on the bulk of the law (12 sigma / 70 b)
each output's probability is within exp(rho) of the exact law's (rho = 3 r plus the thresholds' share, ~1e-13),
and outside it lies a mass `tail` < 1e-30. A run of n draws of an (ε, δ)-DP mechanism is then
(ε + 2 n rho, e^(n rho) δ + (1 + e^ε') n tail)-DP; ``TALLY`` sums rho and tail and the run reports both additions.
Grid rounding grows the L2 sensitivity by at most sqrt(d) h (L1: d h), a relative change of sqrt(d) (scale/Δ) 2^-30.
Figures and the full argument: research log, "Notes that left the code: privacy/secure.py".
"""

from __future__ import annotations

import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import mpmath
import numba
import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from privdistill.errors import PrivacyError

GRID_BITS = 30  # real-valued noise lives on the grid h = 2^(floor(log2 scale) - GRID_BITS) (module docstring)
ULP = 2.0 ** -53  # float64's unit roundoff
EXP_ULPS = 2  # exp's error in ulps assumed by the bounds (libm: < 1; tests/test_secure_noise.py measures it)
THRESHOLD_WORDS = 6  # V's thresholds floor(q^k 2^192), as six 32-bit words
BULK_SIGMAS, BULK_SCALES = 12, 70  # the bulk of the Gaussian (in sigma) and of the Laplace (in b)


class SecureStream:
    """Uniform words from ChaCha20 keyed from os.urandom on every call (no state survives a call)."""

    def words(self, n: int) -> np.ndarray:
        if n <= 0:
            return np.empty(0, dtype=np.uint64)
        encryptor = Cipher(algorithms.ChaCha20(os.urandom(32), os.urandom(16)), mode=None).encryptor()
        out = bytearray(8 * n)
        encryptor.update_into(bytes(8 * n), out)
        return np.frombuffer(out, dtype=np.uint64)

    def words32(self, n: int) -> np.ndarray:
        return self.words((n + 1) // 2).view(np.uint32)[:n]


@dataclass
class Tally:
    """The secure draws made in this process, with the sums of their bounds (module docstring): `rho`, each
    draw's log-probability ratio to the exact law on its bulk, and `tail`, the exact law's mass outside it.
    ``reset`` at the start of a run; read by the run's privacy report (privacy/report.py)."""

    draws: int = 0
    rho: float = 0.0
    tail: float = 0.0

    def add(self, draws: int, rho: float, tail: float) -> None:
        with _LOCK:
            self.draws += int(draws)
            self.rho += int(draws) * rho
            self.tail += int(draws) * tail

    def reset(self) -> None:
        with _LOCK:
            self.draws, self.rho, self.tail = 0, 0.0, 0.0


_LOCK = threading.Lock()
TALLY = Tally()


class _Sampler:
    """CKS20's discrete Laplace / discrete Gaussian as one rejection sampler, compiled (module docstring).

    A candidate is X = U + T V: U uniform on {0..T-1} and a sign from one 32-bit word; V geometric with
    P(V >= k) = q^k, q = exp(-T/b), by inverse CDF: V counts the thresholds floor(q^k 2^192) above a uniform w
    read 32 bits at a time (the next word only while w ties a threshold). It is kept with probability exp(-U/b),
    which makes X discrete-Laplace of scale b (P(X = x) ∝ exp(-|x|/b)), times, for the Gaussian, CKS20's
    exp(-(|X| - sigma^2/b)^2 / (2 sigma^2)): one Bernoulli trial with the product of both probabilities (the same
    acceptance as two independent trials), decided exactly against the float64 product; (-, 0) is rejected.

    T is a power of two about b / BLOCK_DIVISOR (for the Gaussian, CKS20's t near sigma; correct for every t > 0).
    """

    def __init__(self, distribution: str, scale: float):
        self.distribution, self.scale = distribution, float(scale)
        if not 0 < self.scale < 2.0 ** 40:
            raise PrivacyError(f"integer noise of scale {self.scale:.3g} is beyond the samplers (0 < scale < 2^40)")
        if distribution == "laplace":
            self.b = self.scale
        else:
            self.b = self.scale if self.scale > 1 else 1.0  # CKS20 is correct for every t; t = sigma is its best
        self.block_bits = max(0, math.floor(math.log2(self.b / BLOCK_DIVISOR))) if self.b >= 2 * BLOCK_DIVISOR else 0
        self.block = 1 << self.block_bits
        q = mpmath.exp(-mpmath.mpf(self.block) / mpmath.mpf(self.b))
        bits = 32 * THRESHOLD_WORDS
        thresholds = []
        with mpmath.workprec(bits + 64):
            while len(thresholds) < 100_000:
                value = int(mpmath.floor(q ** (len(thresholds) + 1) * mpmath.mpf(2) ** bits))
                if value <= 0:
                    break
                thresholds.append(value)
        self.th = np.array([[(t >> (32 * (THRESHOLD_WORDS - 1 - j))) & 0xFFFFFFFF for j in range(THRESHOLD_WORDS)]
                            for t in thresholds], dtype=np.uint32).reshape(-1, THRESHOLD_WORDS)
        self.th_hi = np.ascontiguousarray(self.th[:, 0])
        self.q = float(q)
        self.centre = self.scale * self.scale / self.b
        self.two_var = 2 * self.scale * self.scale
        self.acceptance = self._acceptance(self.q)
        self.rho, self.tail = self.bounds()

    def _acceptance(self, q: float) -> float:
        """P(a candidate is kept), for sizing the batches. Before the trial P(X = x) = (1 - q) q^floor(x/T) / T;
        times exp(-(x mod T)/b) that is (1 - q) exp(-x/b) / T, for each sign; the Gaussian factor and the (-, 0)
        rejection on top."""
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

    def bounds(self) -> tuple[float, float]:
        """(rho, tail) of one draw (module docstring). On the bulk |x| <= x_max the trial's p̂ is exp of a float
        argument gamma (at most a few roundings: relative error 4 ulp of gamma, plus the rounding of sigma^2/b,
        which moves gamma by |x - c| c 2 ulp / sigma^2) with exp's own EXP_ULPS: relative error r. The thresholds
        are exact floors at 2^-192, a relative error of P(V = k) at most 2^-191 / (q^k (1 - q)) up to the bulk's
        k. A candidate's weight is off by a factor within (1 ± (r + r_V)), and so is the normaliser (the bulk's
        share; outside it the candidates carry at most the tail's mass): |log P'/P| <= rho = 3 (r + r_V) + 2 tail."""
        gaussian = self.distribution == "gaussian"
        x_max = math.ceil(BULK_SIGMAS * self.scale if gaussian else BULK_SCALES * self.scale) + 1
        if gaussian:
            gamma = self.block / self.b + (x_max + self.centre) ** 2 / self.two_var
            r = gamma * 4 * ULP + (x_max + self.centre) * self.centre * 2 * ULP / (self.scale ** 2) \
                + EXP_ULPS * ULP
            # exact law's mass beyond x_max: 2 sum_{x >= x_max} e^{-x^2/2s^2} / Z, Z >= max(1, 0.99 s sqrt(2 pi))
            z = max(1.0, 0.99 * self.scale * math.sqrt(2 * math.pi))
            tail = 2 * math.exp(-x_max ** 2 / self.two_var) / -math.expm1(-x_max / self.scale ** 2) / z
        else:
            r = (self.block / self.b) * 4 * ULP + EXP_ULPS * ULP
            # P(|X| >= x_max) = 2 e^{-x_max/b} / (1 + e^{-1/b})
            tail = 2 * math.exp(-x_max / self.b) / (1 + math.exp(-1 / self.b))
        k_max = min(x_max // self.block + 1, len(self.th))
        r_v = 2.0 ** -191 / (self.q ** k_max * (1 - self.q))
        return 3 * (r + r_v) + 2 * tail, tail

    def sample(self, stream: SecureStream, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        if n < PARALLEL_FROM:
            self._fill(stream, out)
        else:  # two threads (the compiled loop releases the GIL) each fill half of `out` from their own stream
            list(_pool().map(lambda half: self._fill(SecureStream(), half), (out[:n // 2], out[n // 2:])))
        return out

    def _fill(self, stream: SecureStream, out: np.ndarray) -> None:
        filled = 0
        while filled < out.size:
            words = stream.words32(int((out.size - filled) / self.acceptance * 3.1) + 2 * RESERVE)
            filled = _candidates(words, out, filled, self.block_bits, self.b, self.centre, 1 / self.two_var,
                                 self.distribution == "gaussian", self.th_hi, self.th)


BLOCK_DIVISOR = 4  # T is about b / BLOCK_DIVISOR (the class docstring; measured fastest of 1, 2, 4, 8)
PARALLEL_FROM = 16_384  # draws from which the sampler splits the work over two threads
UNROLLED = 16  # V's first thresholds, compared without branches (a longer walk is the rare slow path)
RESERVE = 64  # words a candidate may need at the most: it starts only with that many left (no candidate is cut)


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="privdistill-noise")


@numba.njit(cache=True, nogil=True)
def _below(words, pos, p):  # pragma: no cover - compiled
    """Whether a uniform of unbounded precision, read from words[pos:] 32 bits at a time, is below the float p in
    [0, 1]: exactly P = p. Returns (below, next position)."""
    scaled = p * 4294967296.0
    while True:
        high = math.floor(scaled)
        a = float(words[pos])
        pos += 1
        if a < high:
            return True, pos
        if a > high:
            return False, pos
        scaled = (scaled - high) * 4294967296.0  # exact: a float64 has 53 bits to shift out
        if scaled == 0.0:
            return False, pos


@numba.njit(cache=True, nogil=True)
def _candidates(words, out, filled, block_bits, b, centre, inv_two_var, gaussian, th_hi, th
                ):  # pragma: no cover - compiled
    """Candidates (the class docstring) from the 32-bit words until `out` is full or fewer than RESERVE words are
    left; returns the new fill. Kept free of unpredictable branches on the common path (a random accept/reject
    branch costs more than the arithmetic)."""
    mask = np.uint32((1 << block_bits) - 1)
    block = float(1 << block_bits)
    inv_b = 1.0 / b
    levels = th_hi.size
    quick = min(UNROLLED, levels)
    pos = 0
    end = words.size - RESERVE
    while filled < out.size and pos <= end:
        first = words[pos]
        w_hi = words[pos + 1]
        pos += 2
        v = 0
        for k in range(quick):
            v += w_hi < th_hi[k]
        # V is settled by the high word unless it ties the threshold it stopped at, or the walk runs past `quick`
        if v == quick or w_hi == th_hi[v]:
            low = pos  # w's further words, read only on ties
            pos += th.shape[1] - 1
            v = 0
            while v < levels:
                j = 0
                while j < th.shape[1]:
                    word = w_hi if j == 0 else words[low + j - 1]
                    if word != th[v, j]:
                        break
                    j += 1
                if j == th.shape[1] or (w_hi if j == 0 else words[low + j - 1]) > th[v, j]:
                    break  # w >= threshold: V stops here
                v += 1
        u = float(first & mask)
        x = u + block * v
        log_p = -u * inv_b
        if gaussian:
            d = x - centre
            log_p -= d * d * inv_two_var
        # the trial, exactly against p: settled on the first word unless it ties floor(p 2^32) (one in 2^32)
        scaled = math.exp(log_p) * 4294967296.0
        a = float(words[pos])
        keep = a + 1.0 <= scaled  # a < floor(p 2^32)
        if a <= scaled and not keep:
            keep, pos = _below(words, pos, math.exp(log_p))
        else:
            pos += 1
        sign = 1 - 2 * np.int64(first >> np.uint32(31))  # branch-free: a random sign mispredicts half the time
        keep &= not (sign < 0 and x == 0)
        out[filled] = np.int64(x) * sign
        filled += keep
    return filled


@functools.lru_cache(maxsize=None)
def sampler(distribution: str, scale: float) -> _Sampler:
    """The integer sampler for `distribution` at `scale` (cached: its acceptance is computed once)."""
    return _Sampler(distribution, float(scale))


def grid_step(scale: float) -> float:
    """The grid of real-valued noise at this scale: scale 2^-GRID_BITS, a function of the scale alone (so the noise
    on it has the power-of-two scale 2^GRID_BITS, for which the samplers' block fits exactly)."""
    return float(scale) * 2.0 ** -GRID_BITS


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
        TALLY.add(n, draw.rho, draw.tail)
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
        limit = 2.0 ** 52 - 2.0 ** 48  # |round(x / h) + Y| stays an exact float64 integer
        x = flat.numpy().astype(np.float64, copy=False)
        if x.size and not float(np.abs(x).max()) / h < limit:
            raise PrivacyError(f"a value of magnitude {float(flat.abs().max()):.3g} is too large for noise of scale "
                               f"{scale:.3g} on its grid (|x| must stay below 2^{52 - GRID_BITS - 1} times the scale)")
        noise = self.integers(x.size, distribution=distribution, scale=float(scale) / h)
        noisy = np.empty(x.size, dtype=np.float32 if values.dtype == torch.float32 else np.float64)
        _on_grid(x, noise, h, noisy)
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
        TALLY.add(n, RR_RHO, 0.0)
        return torch.from_numpy(out).to(labels.device)


@numba.njit(cache=True, nogil=True)
def _on_grid(x, noise, h, out):  # pragma: no cover - compiled
    """out = (round(x / h) + noise) h: an integer below 2^53 times the grid step, so the reachable outputs are the
    grid's points whatever x is (one pass, compiled)."""
    for i in range(x.size):
        out[i] = (np.rint(x[i] / h) + noise[i]) * h


#: randomized response's bound: the keep probability p̂ (a float, ~2 ulp from e^ε / (e^ε + k - 1)) against a uniform
#: of 53 bits (granularity 2^-53 on p >= 1/k, relative k 2^-53), and the uniform index's modulo bias (k^2 2^-64)
RR_RHO = 3 * (2 * ULP + 64 * ULP + 2.0 ** -52)


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
        params = list(optimizer.params)
        for param in params:
            _check_processed_flag(param.summed_grad)
        # one draw for every coordinate of the step (the same scale everywhere): fewer calls, one grid
        flat = torch.cat([param.summed_grad.reshape(-1) for param in params])
        noisy = secure.add(flat, distribution="gaussian", scale=std)
        for param, part in zip(params, noisy.split([p.summed_grad.numel() for p in params])):
            param.grad = part.view_as(param)
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


def _opendp_measurement(distribution: str, scale: float, size: int):
    """OpenDP's exact discrete Laplace / Gaussian on vectors of `size` integers (L1 / L2 metric)."""
    dp = _opendp()
    domain = dp.vector_domain(dp.atom_domain(T=int), size=size)
    metric = dp.l1_distance(T=int) if distribution == "laplace" else dp.l2_distance(T=int)
    make = dp.m.make_laplace if distribution == "laplace" else dp.m.make_gaussian
    return make(domain, metric, float(scale))


def opendp_integers(n: int, *, distribution: str, scale: float) -> np.ndarray:
    """n draws of OpenDP's exact discrete Laplace / Gaussian on the integers: the reference the tests and
    `privdistill bench noise` compare the samplers here with."""
    return np.asarray(_opendp_measurement(distribution, scale, n)([0] * n), dtype=np.int64)
