"""The execution environment every stage receives: device, precision, seed, progress."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from privdistill.config import RunOptions
from privdistill.engine import device as dev


@dataclass
class Env:
    device: torch.device
    precision: str
    seed: int = 0
    deterministic: bool = False
    progress: bool = True

    @classmethod
    def from_options(cls, options: RunOptions) -> "Env":
        device = dev.select_device(options.device)
        dev.configure_threads(options.threads)
        dev.seed_everything(options.seed, options.deterministic)
        return cls(device=device, precision=dev.resolve_precision(options.precision, device), seed=options.seed,
                   deterministic=options.deterministic, progress=options.progress)

    @classmethod
    def cpu(cls, seed: int = 0, precision: str = "fp32", progress: bool = False) -> "Env":
        """A plain CPU environment (tests, small helpers)."""
        return cls(device=torch.device("cpu"), precision=precision, seed=seed, progress=progress)

    def autocast(self):
        return dev.autocast(self.device, self.precision)

    # channels-last models and batches: measured faster for convolutions on both CPU (oneDNN) and CUDA (tensor cores)
    def place(self, model: nn.Module) -> nn.Module:
        return model.to(self.device).to(memory_format=torch.channels_last)

    def place_batch(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, non_blocking=True)
        return x.contiguous(memory_format=torch.channels_last) if x.ndim == 4 else x

    def generator(self, *stream: int) -> torch.Generator:
        """A CPU generator for the named random stream (see `derived_generator`)."""
        return dev.derived_generator(self.seed, *stream)

    def describe(self) -> str:
        return dev.describe_device(self.device, self.precision)
