"""Choosing which synthetic samples DGD queries (engine/query_selection.py)."""

import pytest
import torch
from torch import nn

from privdistill.engine.context import Env
from privdistill.engine.query_selection import _class_quotas, k_center_greedy, split_pool
from privdistill.errors import ConfigError


class Brightness(nn.Module):
    """Reads an image's class from its mean brightness: class k where the mean (in [-1, 1]) is near -1 + 2k/9,
    with a margin that grows with the distance from the neighbouring classes."""

    def __init__(self):
        super().__init__()
        self.centres = torch.linspace(-1, 1, 10)
        self.classifier = nn.Identity()

    def features(self, x):
        return -((x.flatten(1).mean(1, keepdim=True) - self.centres) ** 2) * 200

    def forward(self, x):
        return self.classifier(self.features(x))


def pool_of(levels: torch.Tensor) -> torch.Tensor:
    """uint8 images of 1 x 4 x 4 whose every pixel is the given level (0-255)."""
    return levels.to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 4, 4).contiguous()


def classes_of(reader, pool):
    return reader(pool.float() / 127.5 - 1).argmax(1)


def select_queries(pool, count, rule, **kw):
    return split_pool(pool, count, rule, **kw)[0]


@pytest.fixture
def env():
    return Env.cpu(seed=0)


def test_random_is_a_seeded_draw_of_distinct_samples(env):
    pool = pool_of(torch.arange(200) % 256)
    a = select_queries(pool, 50, "random", reader=None, env=env, rng=torch.Generator().manual_seed(3), num_classes=10)
    b = select_queries(pool, 50, "random", reader=None, env=env, rng=torch.Generator().manual_seed(3), num_classes=10)
    assert torch.equal(a, b) and len(a.unique()) == 50


def test_k_center_greedy_covers_every_cluster_before_repeating_one():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    points = (centres.repeat_interleave(25, 0) + 0.1 * torch.randn(100, 2, generator=g))[torch.randperm(100,
                                                                                                   generator=g)]
    chosen = k_center_greedy(points, 4)
    clusters = {tuple(c) for c in (points[chosen] / 10).round().tolist()}
    assert len(chosen) == 4 and len(clusters) == 4


def test_diverse_is_balanced_and_spread_within_each_class(env):
    reader = Brightness()
    pool = pool_of(torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(1)))
    kw = dict(reader=reader, env=env, num_classes=10)
    diverse = select_queries(pool, 40, "diverse", rng=torch.Generator().manual_seed(0), **kw)
    random = select_queries(pool, 40, "random", rng=torch.Generator().manual_seed(0), **kw)
    assert torch.bincount(classes_of(reader, pool[diverse]), minlength=10).tolist() == [4] * 10

    def spread(idx):  # the widest brightness range covered within a class, summed over classes
        levels, labels = pool[idx, 0, 0, 0].float(), classes_of(reader, pool[idx])
        return sum(float(levels[labels == k].max() - levels[labels == k].min()) for k in range(10)
                   if (labels == k).any())

    assert spread(diverse) > spread(random)


def test_quotas_give_a_short_class_all_it_has_and_its_shortfall_to_the_others():
    labels = torch.tensor([0] * 2 + [1] * 50 + [2] * 50)
    quotas = _class_quotas(labels, 30, num_classes=4)
    assert quotas[0] == 2 and sum(quotas.values()) == 30 and 3 not in quotas
    assert abs(quotas[1] - quotas[2]) <= 1


def test_bad_requests_say_what_is_wrong(env):
    pool = pool_of(torch.arange(10))
    kw = dict(env=env, rng=torch.Generator(), num_classes=10)
    with pytest.raises(ConfigError, match="one of"):
        select_queries(pool, 5, "smart", reader=None, **kw)
    with pytest.raises(ConfigError, match="source model"):
        select_queries(pool, 5, "diverse", reader=None, **kw)
    with pytest.raises(ConfigError, match="pool of 10"):
        select_queries(pool, 11, "random", reader=None, **kw)


def test_the_split_is_a_partition_and_random_is_the_papers_permutation(env):
    reader, pool = Brightness(), pool_of(torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(2)))
    for rule in ("random", "diverse"):
        queried, rest = split_pool(pool, 40, rule, reader=reader, env=env, rng=torch.Generator().manual_seed(5),
                                   num_classes=10)
        assert len(queried) == 40 and sorted(torch.cat([queried, rest]).tolist()) == list(range(300))
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(5))
    queried, rest = split_pool(pool, 40, "random", reader=None, env=env, rng=torch.Generator().manual_seed(5),
                               num_classes=10)
    assert torch.equal(queried, perm[:40]) and torch.equal(rest, perm[40:])


def test_a_dgd_run_selects_its_queries_and_names_what_the_choice_reads(tiny_npz, tmp_path):
    from privdistill.methods.common import RunRequest
    from privdistill.methods.dgd import DGD, run_dgd
    from tests.test_dgd import TINY

    s = DGD(f"npz:{tiny_npz}", queries=40, overrides=TINY + ["run.device=cpu", "dgd.query_selection=diverse"],
            run_dir=str(tmp_path / "run")).fit().summary
    assert s["query_selection"] == "diverse" and s["queries"] == 40
    assert any("diverse selection reads" in p for p in s["not_covered"]), "the choice is on an uncovered pathway"
    with pytest.raises(ConfigError, match="private-holdout"):
        run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / "holdout"),
                           overrides=TINY + ["dgd.queries=40", "dgd.inputs=private-holdout",
                                             "dgd.query_selection=diverse"]))
