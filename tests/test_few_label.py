"""The few-label student's parts (engine/few_label.py): medoid queries, label spreading, the pool embedding, and
PATE and DGD with them: the same ε is spent as with random queries (the embedding and the spreading cost nothing)."""

import numpy as np
import pytest
import torch

from privdistill.engine.context import Env
from privdistill.engine.few_label import (
    cluster_pool,
    cluster_votes,
    embed_pool,
    medoid_queries,
    name_clusters,
    spread_labels,
)
from privdistill.errors import ConfigError
from privdistill.methods.common import RunRequest
from privdistill.methods.dgd import run_dgd
from privdistill.methods.dgd_plan import DGDConfig
from privdistill.methods.pate import run_pate
from privdistill.privacy.ledger import PrivacyLedger
from tests.test_dgd import TINY as DGD_TINY
from tests.test_pate import TINY


def _clusters(k=6, per=40, dim=8, seed=0):
    """k well-separated Gaussian blobs: points, their cluster, their centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim)) * 20
    labels = np.repeat(np.arange(k), per)
    points = centres[labels] + rng.normal(size=(k * per, dim))
    return points, labels, centres


def test_the_medoid_rule_queries_one_sample_per_cluster_near_its_centre():
    points, labels, _ = _clusters()
    chosen = medoid_queries(points, 6, seed=1).numpy()
    assert len(chosen) == 6 and len(set(chosen)) == 6
    assert sorted(labels[chosen]) == list(range(6)), "one query in each cluster"
    for i in chosen:  # each is the member nearest its cluster's centre (k-means: the members' mean)
        members = np.flatnonzero(labels == labels[i])
        assert i == members[((points[members] - points[members].mean(0)) ** 2).sum(1).argmin()]


def test_one_label_a_cluster_spreads_to_every_member():
    points, labels, _ = _clusters()
    chosen = medoid_queries(points, 6, seed=1)
    answers = torch.as_tensor(labels[chosen.numpy()] + 3) % 9  # classes need not be 0..k-1
    dist = spread_labels(points, chosen, answers, num_classes=9)
    assert dist.shape == (len(points), 9) and torch.allclose(dist.sum(1), torch.ones(len(points)))
    expected = (torch.as_tensor(labels) + 3) % 9
    assert torch.equal(dist.argmax(1), expected), "every member takes its cluster's one label"
    # an unanswered query (-1) adds nothing; a single answered class spreads to all
    one = spread_labels(points, chosen[:2], torch.tensor([4, -1]), num_classes=9)
    assert torch.equal(one.argmax(1), torch.full((len(points),), 4))


def test_a_wrong_label_stays_in_its_cluster():
    points, labels, _ = _clusters(per=30)
    chosen = medoid_queries(points, 6, seed=2)
    answers = torch.as_tensor(labels[chosen.numpy()]).clone()
    answers[0] = (answers[0] + 1) % 6  # one noisy answer
    spread = spread_labels(points, chosen, answers, num_classes=6).argmax(1).numpy()
    wrong = spread != labels
    assert wrong.sum() == 30 and len(set(labels[wrong])) == 1, "only the mislabelled cluster is wrong"


def test_the_naming_gives_every_class_a_cluster_where_argmax_would_not():
    # the teachers misread cluster 1 (a "1") as a "7", which cluster 2 owns: the argmax would leave class 1 unnamed
    hist = torch.tensor([[90., 5, 5], [10, 40, 50], [0, 10, 90]])
    assert hist.argmax(1).tolist() == [0, 2, 2]
    assert name_clusters(hist).tolist() == [0, 1, 2]
    # more clusters than classes: every class once, the rest their argmax; fewer: argmax
    more = torch.tensor([[90., 5, 5], [80, 15, 5], [10, 40, 50], [0, 10, 90]])
    assert name_clusters(more).tolist() == [0, 0, 1, 2]
    assert name_clusters(torch.tensor([[1., 9, 0], [8, 2, 0]])).tolist() == [1, 0]


class _Readers:
    """Stand-in teachers: teacher t labels an image by its first pixel's value, except teacher 0, which says 0."""

    num_teachers = 3

    def predictions(self, x):
        label = ((x[:, 0, 0, 0] + 1) * 127.5).round().long()  # back from [-1, 1] to the stored uint8 value
        return torch.stack([torch.zeros_like(label), label, label])  # [teachers, n]


def test_cluster_votes_count_each_teachers_majority_once_per_cluster():
    images = torch.zeros(60, 1, 4, 4, dtype=torch.uint8)
    images[:30, 0, 0, 0] = 2  # cluster 0: mostly 2s, a few 1s
    images[:5, 0, 0, 0] = 1
    images[30:, 0, 0, 0] = 1  # cluster 1: 1s
    clusters = torch.tensor([0] * 30 + [1] * 30)
    votes = cluster_votes(_Readers(), images, clusters, 2, 3, Env.cpu(), members=30, seed=0)
    assert votes.tolist() == [[1, 0, 2], [1, 2, 0]], "one vote a teacher a cluster: its majority"
    assert (votes.sum(1) == 3).all()


def test_clusters_of_well_separated_blobs_are_the_blobs():
    points, labels, _ = _clusters()
    found = cluster_pool(points, 6, seed=0).numpy()
    for c in range(6):  # each found cluster is one blob
        assert len(set(labels[found == c])) == 1


def test_the_embedding_reads_images_of_any_size():
    images = torch.randint(0, 256, (50, 1, 12, 12), dtype=torch.uint8)
    z = embed_pool(images, Env.cpu(), dims=8)
    assert z.shape == (50, 8) and np.allclose(z.mean(0), 0, atol=1e-6)
    odd = torch.randint(0, 256, (30, 3, 10, 10), dtype=torch.uint8)  # sides not multiples of 4: the pixels
    odd = embed_pool(odd, Env.cpu(), dims=8)
    assert odd.shape == (30, 8)


def test_pate_with_medoids_and_spread_labels_spends_what_random_queries_spend(tiny_npz, tmp_path):
    base = TINY + ["budget.epsilon=10", "pate.aggregation=gnmax"]
    runs = {}
    for name, extra in {"random": [], "few": ["pate.query_selection=medoids", "pate_student.labels=spread"]}.items():
        runs[name] = run_pate(RunRequest(dataset=f"npz:{tiny_npz}", overrides=base + extra,
                                         run_dir=str(tmp_path / name))).summary
    random, few = runs["random"], runs["few"]
    assert few["query_selection"] == "medoids" and few["student_labels"] == "spread"
    assert 0 <= few["spread_label_accuracy"] <= 1
    assert few["epsilon_strict"] == random["epsilon_strict"] and few["epsilon_paper"] == random["epsilon_paper"]
    events = [PrivacyLedger(tmp_path / name).events() for name in ("random", "few")]
    assert events[0] == events[1], "the embedding, the medoids and the spreading record nothing"
    assert any("ScatterNet" in str(p) for p in few["not_covered"]), "the report names the feature space"


def test_dgd_with_medoid_queries_spends_what_random_queries_spend(tiny_npz, tmp_path):
    base = DGD_TINY + ["dgd.queries=12", "dgd.aggregation=gaussian", "student.unsupervised=false",
                       "dgd.spread_pool=150"]
    runs = {}
    for name, extra in {"random": [], "few": ["dgd.query_selection=medoids"]}.items():
        runs[name] = run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", overrides=base + extra,
                                        run_dir=str(tmp_path / name))).summary
    random, few = runs["random"], runs["few"]
    assert few["query_selection"] == "medoids" and few["queries"] == 12
    assert few["epsilon_strict"] == random["epsilon_strict"] and few["epsilon_paper"] == random["epsilon_paper"]
    events = [PrivacyLedger(tmp_path / name).events() for name in ("random", "few")]
    assert events[0] == events[1], "the embedding and the medoids record nothing"
    assert "medoids selection reads" in " ".join(str(p) for p in few["not_covered"])


def test_dgd_cluster_votes_spend_one_query_a_cluster_at_the_target_epsilon(tiny_npz, tmp_path):
    base = DGD_TINY + ["budget.epsilon=4", "dgd.aggregation=gaussian", "dgd.release=histogram",
                       "student.unsupervised=false", "dgd.spread_pool=150", "dgd.query_selection=clusters"]
    run = run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", overrides=base, run_dir=str(tmp_path / "c")))
    summary = run.summary
    classes = summary["clusters"]["classes"]
    assert summary["query_selection"] == "clusters" and summary["queries"] == len(classes)
    assert sum(classes) == 150 and all(c > 0 for c in classes), "every class names a cluster; every sample labelled"
    assert 3.9 < summary["epsilon_strict"] <= 4.0, "the noise is calibrated to spend the target"
    (event,) = [e for e in PrivacyLedger(tmp_path / "c").events()]
    assert event.count == len(classes)
    assert "class probabilities" in " ".join(str(p) for p in summary["not_covered"])


def test_medoids_and_clusters_need_the_generators_source():
    for rule in ("medoids", "clusters"):
        with pytest.raises(ConfigError, match="private-holdout has none"):
            DGDConfig(query_selection=rule, release="histogram", inputs="private-holdout").validate()
