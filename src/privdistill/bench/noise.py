"""`privdistill bench noise`: draws per second of each secure sampler (privacy/secure.py) against torch.randn on
the same shape, and of OpenDP's exact samplers (the reference), on this machine.

Times are the best of several repeats, secure and plain interleaved so that both see the same machine load; the
ratio is the figure of merit (the goal: secure noise at the speed of plain noise)."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass

import torch

from privdistill.privacy.secure import SecureNoise, opendp_integers


@dataclass
class NoiseTiming:
    name: str
    shape: tuple[int, ...]
    secure_ns: float  # per draw
    plain_ns: float  # torch.randn (or torch's Laplace) per draw, same shape
    opendp_ns: float | None = None

    @property
    def ratio(self) -> float:
        return self.secure_ns / self.plain_ns


def _timed(fn) -> float:
    # each timing follows a call of the same function (numba compiles once a process, a sampler's constants are
    # cached per scale, and the caches then hold what that function reads): both sides timed in steady state,
    # where timing a side right after the other measures the other's cache evictions too
    fn()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_noise(size: int = 39_700, repeats: int = 7, opendp_size: int = 2_000) -> list[NoiseTiming]:
    """The samplers a run uses, at the shape of one DP-SGD step of the quickstart's head (39,700 coordinates)."""
    secure = SecureNoise()
    values = torch.randn(size)
    counts = torch.zeros(size, dtype=torch.int64)
    labels = torch.randint(0, 10, (size,))
    in_set = torch.ones(size, 10, dtype=torch.bool)
    keep = torch.full((size,), 0.7, dtype=torch.float64)

    def laplace(n: int) -> torch.Tensor:  # the reproducible path's Laplace (privacy.mechanisms.laplace_noise)
        return torch.empty(n).exponential_() - torch.empty(n).exponential_()

    cases = [
        ("Gaussian, real values on the grid", lambda: secure.add(values, distribution="gaussian", scale=1.3),
         lambda: values + torch.randn(size) * 1.3, ("gaussian", 40.0)),
        ("Laplace, real values on the grid", lambda: secure.add(values, distribution="laplace", scale=1.3),
         lambda: values + laplace(size) * 1.3, ("laplace", 40.0)),
        ("discrete Gaussian, counts (σ 40)", lambda: secure.add(counts, distribution="gaussian", scale=40.0),
         lambda: counts + torch.randn(size).mul(40.0).round().long(), ("gaussian", 40.0)),
        ("discrete Laplace, counts (b 40)", lambda: secure.add(counts, distribution="laplace", scale=40.0),
         lambda: counts + laplace(size).mul(40.0).round().long(), ("laplace", 40.0)),
        ("randomized response, 10 classes", lambda: secure.randomized_response(in_set, labels, keep),
         lambda: torch.where(torch.rand(size) < 0.7, labels, torch.randint(0, 10, (size,))), None),
    ]
    out = []
    for name, secure_fn, plain_fn, reference in cases:
        # interleave: best secure and best plain measured over the same stretch of time
        secure_s, plain_s = float("inf"), float("inf")
        for _ in range(repeats):
            secure_s = min(secure_s, _timed(secure_fn))
            plain_s = min(plain_s, _timed(plain_fn))
        opendp_ns = None
        if reference is not None and opendp_size:
            opendp = _timed(lambda: opendp_integers(opendp_size, distribution=reference[0], scale=reference[1]))
            opendp_ns = opendp / opendp_size * 1e9
        out.append(NoiseTiming(name, (size,), secure_s / size * 1e9, plain_s / size * 1e9, opendp_ns))
    return out


def machine() -> str:
    """The CPU, for the benchmark's record."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {torch.get_num_threads()} torch threads"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads"
