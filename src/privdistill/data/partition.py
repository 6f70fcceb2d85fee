"""Disjoint partitions of a private dataset, one per teacher.

Disjointness is what lets a teacher ensemble's privacy analysis say "one record changes one teacher".
"""

from __future__ import annotations

import torch

from privdistill.errors import DataError


def partition_indices(num_examples: int, num_parts: int, *, seed: int) -> list[torch.Tensor]:
    """Split indices 0..N-1 into `num_parts` disjoint, complete parts of near-equal size (seeded).

    The split depends on N and the seed only, never on the data: with a label-dependent split (e.g. dealing
    each class round-robin) replacing one record would move other records between teachers, and "one record
    changes one teacher" would no longer hold.
    """
    if num_parts < 1:
        raise DataError(f"the number of parts must be >= 1, got {num_parts}")
    if num_parts > num_examples:
        raise DataError(f"cannot split {num_examples} examples into {num_parts} non-empty parts "
                        "(more parts than examples)")
    perm = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed))
    return [part.sort().values for part in torch.tensor_split(perm, num_parts)]


def missing_classes(labels: torch.Tensor, parts: list[torch.Tensor], num_classes: int) -> dict[int, list[int]]:
    """For each part that lacks some class, the list of classes it lacks."""
    out = {}
    for p, idx in enumerate(parts):
        present = torch.bincount(labels[idx], minlength=num_classes) > 0
        if not bool(present.all()):
            out[p] = torch.nonzero(~present).flatten().tolist()
    return out
