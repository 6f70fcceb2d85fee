"""Which synthetic samples to spend a label budget on (ours, not a paper's).

DGD's strict ε fixes how many pool samples are queried, not which; the choice costs no privacy when it reads only
what is already outside the ε: the pool and the model the generator was fitted to (the DP source end to end). The
private teachers are never read here (research log, "DGD+").

Rules (`dgd.query_selection`): `random` (the paper); `diverse`, count / K samples of each class as the reader labels
them, within a class a k-center greedy cover in the reader's features (Sener & Savarese 2018).
"""

from __future__ import annotations

import torch
from torch import nn

from privdistill.data.dataset import to_float
from privdistill.engine.context import Env
from privdistill.engine.datafree import logits_and_features
from privdistill.errors import ConfigError

QUERY_SELECTIONS = ("random", "diverse")


@torch.no_grad()
def split_pool(pool: torch.Tensor, count: int, rule: str, *, reader: nn.Module | None, env: Env,
               rng: torch.Generator, num_classes: int, feature_dim: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(queried, unqueried) indices of `pool`: `count` chosen by `rule`, and the rest in a random order. Both
    come from one permutation drawn from `rng` first, so `random` is exactly the paper's split of that stream."""
    if rule not in QUERY_SELECTIONS:
        raise ConfigError(f"query selection must be one of {', '.join(QUERY_SELECTIONS)}, got {rule!r}")
    if not 0 <= count <= len(pool):
        raise ConfigError(f"cannot select {count} queries from a pool of {len(pool)}")
    order = torch.randperm(len(pool), generator=rng)
    if rule == "random":
        return order[:count], order[count:]
    if reader is None:
        raise ConfigError(f"query selection {rule!r} reads the generator's source model; this run has none "
                          "(e.g. dgd.inputs=private-holdout): use random")
    # the features through a random projection that keeps distances (Johnson-Lindenstrauss) at a fraction of the
    # cost and memory: a large pool's backbone features would not fit (960,000 x 6,272 floats)
    logits, features = read_features(reader, pool[order], env, project_to=feature_dim, rng=rng)
    labels = logits.argmax(1)
    chosen = []
    for label, quota in _class_quotas(labels, count, num_classes).items():
        members = (labels == label).nonzero().squeeze(1)  # positions in `order`, already a random order
        chosen.append(members[k_center_greedy(features[members], quota)])
    positions = torch.cat(chosen) if chosen else torch.empty(0, dtype=torch.long)
    rest = torch.ones(len(pool), dtype=torch.bool)
    rest[positions] = False
    return order[positions], order[rest]


def k_center_greedy(points: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of k of `points` [n, d], each the one farthest from those chosen before (the first: index 0, the
    caller's random order), a 2-approximation of the minimax cover (Gonzalez 1985)."""
    if k <= 0:
        return torch.empty(0, dtype=torch.long)
    chosen = [0]
    nearest = torch.cdist(points, points[:1]).squeeze(1)
    for _ in range(k - 1):
        nxt = int(nearest.argmax())
        chosen.append(nxt)
        nearest = torch.minimum(nearest, torch.cdist(points, points[nxt:nxt + 1]).squeeze(1))
    return torch.tensor(chosen)


def _class_quotas(labels: torch.Tensor, count: int, num_classes: int) -> dict[int, int]:
    """count split as evenly as the classes allow: a class with fewer samples than its share gives them all and
    its shortfall goes to the others (largest first)."""
    available = torch.bincount(labels, minlength=num_classes).tolist()
    quotas, left = {k: 0 for k in range(num_classes)}, count
    open_classes = [k for k in range(num_classes) if available[k]]
    while left and open_classes:
        share = max(1, left // len(open_classes))
        for k in sorted(open_classes, key=lambda c: -available[c]):
            give = min(share, available[k] - quotas[k], left)
            quotas[k] += give
            left -= give
        open_classes = [k for k in open_classes if quotas[k] < available[k]]
    return {k: q for k, q in quotas.items() if q}


@torch.no_grad()
def read_features(reader: nn.Module, images: torch.Tensor, env: Env, *, project_to: int, rng: torch.Generator,
          batch: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """The reader's logits and its backbone features (datafree.logits_and_features: the input of its last linear
    layer) through one random projection to `project_to` dimensions drawn from `rng` at the first batch, each row
    then of unit norm."""
    was_training = reader.training
    reader.eval()
    logits, feats, projection = [], [], None
    for start in range(0, len(images), batch):
        x = env.place_batch(to_float(images[start:start + batch]))
        with env.autocast():
            out, f = logits_and_features(reader, x)
        logits.append(out.float().cpu())
        f = f.float().flatten(1).cpu()
        if projection is None:
            projection = torch.randn(f.shape[1], project_to, generator=rng) / project_to ** 0.5
        feats.append(nn.functional.normalize(f @ projection, dim=1))
    reader.train(was_training)
    return torch.cat(logits), torch.cat(feats)
