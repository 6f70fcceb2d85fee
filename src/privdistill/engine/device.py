"""Device, precision, threads and seeding.

On CPUs with native bf16 (AMX / AVX512-BF16) the default is channels-last + bf16 autocast, the fastest measured
(docs/research-log.md, "Non-private baseline"); parameters and the optimizer stay in fp32, only the
matmuls/convolutions run in bf16. `--precision fp32` turns it off.
"""

from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import torch

from privdistill.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def select_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA when present, else the CPU; 'cpu', 'cuda', 'cuda:1' are taken as given."""
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from err
    if device.type not in ("cpu", "cuda"):  # torch parses mps, xpu, meta, ...; none is supported here
        raise ConfigError(f"device {name!r} is not supported (use auto, cpu, cuda or cuda:N)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available on this machine; use --device cpu")
    return device


def cpu_has_native_bf16() -> bool:
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # older torch without these probes
        return False


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        if precision == "fp16" and device.type == "cpu":
            raise ConfigError("fp16 autocast is for CUDA; use bf16 or fp32 on the CPU")
        return precision
    if device.type == "cuda":  # not fp16: no loop uses loss scaling, and DPDFD's per-logit gradients underflow it
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_native_bf16() else "fp32"


def autocast(device: torch.device, precision: str):
    """Mixed-precision context for forward passes (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def configure_threads(threads: int = 0) -> int:
    """0 = one thread per available core (sched_getaffinity, so containers report their real share)."""
    if threads <= 0:
        try:
            threads = len(os.sched_getaffinity(0))
        except AttributeError:
            threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


def seed_everything(seed: int, deterministic: bool = False) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    elif torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True
    if torch.cuda.is_available():
        # Every fp32 convolution stays fp32 (DP-SGD, --precision fp32, and inside bf16 runs PATE's VAT probe and
        # the decoder Jacobian of the tangent perturbation): cuDNN would otherwise use TF32 (10 mantissa bits).
        torch.backends.cudnn.allow_tf32 = False


def derived_generator(seed: int, *stream: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for one named random stream (e.g. (seed, epoch)), so that any point of a run can be
    reproduced from its step counter alone: resuming needs no RNG state besides the step."""
    mixed = seed
    for s in stream:
        mixed = (mixed * 1_000_003 + int(s) + 0x9E3779B9) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(mixed)


def describe_device(device: torch.device, precision: str) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU ({torch.get_num_threads()} threads)"
        try:
            with open("/proc/cpuinfo") as f:
                model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
            if model:
                name = f"{model}, {torch.get_num_threads()} threads"
        except OSError:
            pass
    return f"{device.type}: {name}, {precision}"
