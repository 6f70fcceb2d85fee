"""Disjoint partitions of a private dataset, one per teacher.

Disjointness is what lets a teacher ensemble's privacy analysis say "one record changes one teacher".
"""

from __future__ import annotations

import torch

from privdistill.errors import DataError


def partition_indices(labels: torch.Tensor, num_parts: int, *, seed: int,
                      stratified: bool = False) -> list[torch.Tensor]:
    """Split indices 0..N-1 into `num_parts` disjoint, complete parts of near-equal size (seeded).

    Stratified: each class is shuffled and dealt round-robin, so every part gets the class mix of the whole
    (up to one example per class). Part sizes differ by at most one in both modes.
    """
    n = len(labels)
    if num_parts < 1:
        raise DataError(f"the number of parts must be >= 1, got {num_parts}")
    if num_parts > n:
        raise DataError(f"cannot split {n} examples into {num_parts} non-empty parts (more parts than examples)")
    gen = torch.Generator().manual_seed(seed)
    if not stratified:
        perm = torch.randperm(n, generator=gen)
        return [part.sort().values for part in torch.tensor_split(perm, num_parts)]
    # Shuffle within each class, concatenate class by class, then deal position i to part i mod n: every
    # class is spread over consecutive parts, and sizes stay balanced overall.
    order = []
    for k in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == k, as_tuple=False).flatten()
        order.append(idx[torch.randperm(len(idx), generator=gen)])
    order = torch.cat(order)
    # Rotate the start so that class boundaries do not always favour the first parts.
    owner = (torch.arange(n) + int(torch.randint(num_parts, (1,), generator=gen))) % num_parts
    return [order[owner == p].sort().values for p in range(num_parts)]


def missing_classes(labels: torch.Tensor, parts: list[torch.Tensor], num_classes: int) -> dict[int, list[int]]:
    """For each part that lacks some class, the list of classes it lacks."""
    out = {}
    for p, idx in enumerate(parts):
        present = torch.bincount(labels[idx], minlength=num_classes) > 0
        if not bool(present.all()):
            out[p] = torch.nonzero(~present).flatten().tolist()
    return out
