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


def public_indices(n_train: int, holdout: int, seed: int) -> torch.Tensor:
    """Indices (into the training set, sorted) of the public slice of a run with `seed`."""
    if not 0 < holdout < n_train:
        raise ConfigError(f"the held-out public slice must have between 1 and {n_train - 1} examples, got {holdout}")
    perm = torch.randperm(n_train, generator=Env.cpu(seed=seed).generator(streams.DGD_SPLIT, 1))
    return perm[:holdout].sort().values


def holdout_split(data: DataSplits, holdout: int, env: Env) -> tuple[ImageDataset, ImageDataset]:
    """(private part, public slice) of the training set."""
    n = len(data.train)
    public = public_indices(n, holdout, env.seed)
    private = torch.ones(n, dtype=torch.bool)
    private[public] = False
    return (data.train.subset(torch.nonzero(private).flatten(), name=f"{data.train.name} (private part)"),
            data.train.subset(public, name=f"{data.train.name} (held-out public slice)"))
