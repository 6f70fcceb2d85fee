"""The held-out "public" slice of a private training set: PATE's public data and DGD's Fig. 7 variant.

Both methods use the same split (the same random stream), so one teacher ensemble, trained on the private
rest, serves both; the audits use `public_indices` to keep that slice out of their member sets. The slice's
own records get no protection from any ε: it stands in for data that is genuinely public.
"""

from __future__ import annotations

import torch

from privdistill.data.dataset import DataSplits, ImageDataset
from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.errors import ConfigError


def holdout_size(holdout: float, n_train: int) -> int:
    """The public slice's size: `holdout` records, or a fraction of the training set when below 1 (the presets
    use 1/6 for data of one's own, and 10,000 = 1/6 of MNIST's 60,000 for the built-in datasets)."""
    return int(round(holdout * n_train)) if 0 < holdout < 1 else int(holdout)


def public_indices(n_train: int, holdout: float, seed: int) -> torch.Tensor:
    """Indices (into the training set, sorted) of the public slice of a run with `seed`."""
    holdout = holdout_size(holdout, n_train)
    if not 0 < holdout < n_train:
        raise ConfigError(f"the held-out public slice must have between 1 and {n_train - 1} examples, got {holdout}")
    perm = torch.randperm(n_train, generator=Env.cpu(seed=seed).generator(streams.DGD_SPLIT, 1))
    return perm[:holdout].sort().values


def holdout_split(data: DataSplits, holdout: float, env: Env) -> tuple[ImageDataset, ImageDataset]:
    """(private part, public slice) of the training set."""
    n = len(data.train)
    public = public_indices(n, holdout, env.seed)
    private = torch.ones(n, dtype=torch.bool)
    private[public] = False
    return (data.train.subset(torch.nonzero(private).flatten(), name=f"{data.train.name} (private part)"),
            data.train.subset(public, name=f"{data.train.name} (held-out public slice)"))
