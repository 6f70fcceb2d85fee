"""A few noisy labels, spread over an unlabelled pool (ours, not a paper's).

At a strict ε of 1 a vote channel buys tens of labels; the pool the queries come from carries structure they can
follow. Two ways, each post-processing of the released answers and of the pool (the ledger prices the queries as it
would random ones; tests/test_few_label.py checks that nothing new is recorded):

    medoids + spreading   the pool embedded at no ε cost (normalised ScatterNet coefficients, or the backbone features
                          of a `reader` already on a pathway the method's report names), PCA'd; k-means with k = the
                          label budget, each cluster's medoid queried; the answers spread over the pool's k-NN graph
                          (Zhou et al. 2004, LabelSpreading); the student trains on the whole pool
    cluster votes         k-means with k = K in the reader's class probabilities; each teacher votes its majority over
                          a cluster's members (one changed teacher moves a histogram by (+1, -1), as in an ordinary
                          query); the noisy histograms name the clusters by an assignment giving every class a cluster

Spreading works on real pools (PATE's public slice), cluster votes on DGD's synthetic pools (research log, "Few
labels"; the constants below come from experiments/few_label_proxy.py).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from privdistill.data.dataset import to_float
from privdistill.engine.context import Env
from privdistill.engine.features import fixed_features
from privdistill.engine.query_selection import read_features
from privdistill.models.scatternet import ScatterNet

EMBEDDING_DIMS = 64  # PCA dimensions of the pool embedding
READER_PROJECTION = 256  # a reader's features are first projected to this many dimensions
NEIGHBOURS = 10  # k of the k-NN graph the labels spread along
ALPHA = 0.2  # LabelSpreading's clamping: the share of a sample's label taken from its neighbours


def embed_pool(images: torch.Tensor, env: Env, *, dims: int = EMBEDDING_DIMS,
               reader: torch.nn.Module | None = None) -> np.ndarray:
    """[n, dims] float64: the pool (uint8 or [-1, 1] images) in one of the spaces above, run on env's device.
    Without a `reader`, the scattering; images whose sides are not multiples of 4 (the scattering's J = 2) are
    embedded from their pixels instead. With one, its backbone features through a fixed random projection
    (READER_PROJECTION dimensions: a large pool's 6,272-wide features would not fit in memory)."""
    c, h, w = images.shape[1:]
    if reader is not None:
        rng = torch.Generator().manual_seed(env.seed)
        coefficients = read_features(reader, images, env, project_to=READER_PROJECTION, rng=rng)[1]
    elif h % 4 == 0 and w % 4 == 0:  # a linear ScatterNet without a prior: its `scatter` is the normalised scattering
        coefficients = fixed_features(ScatterNet(c, 2, (h, w)), images, env).flatten(1)
    else:
        coefficients = to_float(images).flatten(1)
    x = coefficients.double().numpy()
    dims = max(1, min(dims, x.shape[0] - 1, x.shape[1]))
    from sklearn.decomposition import PCA  # scikit-learn imported where used: 1.5 s that most runs never need

    z = PCA(dims, random_state=env.seed,
            svd_solver="randomized" if min(x.shape) > 4 * dims else "full").fit_transform(x)
    return (z - z.mean(0)) / (z.std(0) + 1e-8)


def medoid_queries(embedding: np.ndarray, count: int, *, seed: int = 0) -> torch.Tensor:
    """Indices of `count` pool samples, one per k-means cluster (k = `count`): each cluster's member nearest its
    centre, in the order of the clusters."""
    if not 0 < count <= len(embedding):
        raise ValueError(f"cannot choose {count} medoids from a pool of {len(embedding)}")
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=count, n_init=3 if count <= 200 else 1, random_state=seed).fit(embedding)
    chosen = []
    for cluster, centre in enumerate(km.cluster_centers_):
        members = np.flatnonzero(km.labels_ == cluster)
        chosen.append(members[((embedding[members] - centre) ** 2).sum(1).argmin()])
    return torch.as_tensor(np.asarray(chosen), dtype=torch.long)


def spread_labels(embedding: np.ndarray, queried: torch.Tensor, answers: torch.Tensor, num_classes: int, *,
                  neighbours: int = NEIGHBOURS, alpha: float = ALPHA) -> torch.Tensor:
    """[n, num_classes] label distributions over the whole pool from `answers` (class indices; -1 = not answered)
    of the samples at `queried`. A sample the graph does not reach gets the answers' class frequencies."""
    queried, answers = torch.as_tensor(queried).long(), torch.as_tensor(answers).long()
    keep = answers >= 0
    n = len(embedding)
    prior = torch.bincount(answers[keep], minlength=num_classes).double()
    prior = prior / prior.sum() if prior.sum() > 0 else torch.full((num_classes,), 1 / num_classes)
    y = np.full(n, -1, dtype=np.int64)
    y[queried[keep].numpy()] = answers[keep].numpy()
    if len(np.unique(y[y >= 0])) < 2:  # LabelSpreading needs two classes; one class spreads to all
        out = prior.expand(n, num_classes).clone()
    else:
        from sklearn.semi_supervised import LabelSpreading

        model = LabelSpreading(kernel="knn", n_neighbors=min(neighbours, n - 1), alpha=alpha, max_iter=100)
        model.fit(embedding, y)
        dist = np.nan_to_num(model.label_distributions_)
        out = torch.zeros(n, num_classes, dtype=torch.float64)
        out[:, torch.as_tensor(model.classes_)] = torch.as_tensor(dist)
        unreached = out.sum(1) <= 0
        out[unreached] = prior
    out = out / out.sum(1, keepdim=True)
    out[queried[keep]] = torch.nn.functional.one_hot(answers[keep], num_classes).double()  # answers stand as given
    return out.float()


def reader_probabilities(reader: torch.nn.Module, images: torch.Tensor, env: Env) -> np.ndarray:
    """[n, K] float64: the reader's class probabilities of the pool (the space cluster votes cluster in)."""
    logits = read_features(reader, images, env, project_to=8, rng=torch.Generator().manual_seed(env.seed))[0]
    return logits.softmax(1).double().numpy()


def cluster_pool(embedding: np.ndarray, count: int, *, seed: int = 0) -> torch.Tensor:
    """[n] the k-means cluster (k = `count`) of every pool sample."""
    if not 0 < count <= len(embedding):
        raise ValueError(f"cannot make {count} clusters of a pool of {len(embedding)}")
    from sklearn.cluster import KMeans

    return torch.as_tensor(KMeans(n_clusters=count, n_init=3, random_state=seed).fit(embedding).labels_).long()


CLUSTER_MEMBERS = 100  # members of a cluster each teacher reads for its vote (DGD's cluster votes)


def cluster_votes(teachers, images: torch.Tensor, clusters: torch.Tensor, count: int, num_classes: int, env: Env, *,
                  members: int, seed: int = 0) -> torch.Tensor:
    """counts[count, K]: for each cluster, how many teachers name each class as their majority label over (up to)
    `members` of the cluster's images drawn at random. One vote a teacher a cluster: the sensitivity of an ordinary
    query. `teachers` has `predictions(x) -> [teachers, n]` (engine/ensemble.py)."""
    gen = torch.Generator().manual_seed(seed)
    takes = []
    for c in range(count):
        inside = (clusters == c).nonzero().squeeze(1)
        takes.append(inside[torch.randperm(len(inside), generator=gen)[:members]])
    # every chosen member read by every teacher in large batches, then grouped by cluster
    preds = torch.cat([teachers.predictions(env.place_batch(to_float(x))).cpu()
                       for x in torch.split(images[torch.cat(takes)], 500)], dim=1)  # [teachers, members of all]
    out = torch.zeros(count, num_classes, dtype=torch.long)
    for c, rows in enumerate(torch.split(preds, [len(t) for t in takes], dim=1)):
        out[c] = torch.bincount(torch.mode(rows, dim=1).values, minlength=num_classes)  # each teacher's majority
    return out


def name_clusters(histograms: torch.Tensor) -> torch.Tensor:
    """[k] a class for every cluster from its (noisy) vote histogram [k, K]: the assignment that maximises the summed
    votes of the names given, every class named at least once where k >= K (k < K: each cluster's argmax)."""
    hist = torch.as_tensor(histograms).double().numpy()
    k, classes = hist.shape
    if k < classes:
        return torch.as_tensor(hist.argmax(1)).long()
    # columns: one per class that must be used, then k free columns where a cluster takes its best class; the
    # must-use columns carry a bonus larger than any gain, so the assignment fills them first
    best = hist.max(1, keepdims=True)
    bonus = np.abs(hist).sum() + 1.0
    rows, cols = linear_sum_assignment(-np.concatenate([hist + bonus, np.repeat(best, k, axis=1)], axis=1))
    names = hist.argmax(1)
    names[rows[cols < classes]] = cols[cols < classes]
    return torch.as_tensor(names).long()
