"""Ray scale-out, on a local 2-CPU Ray instance."""

import builtins

import pytest
import torch

from privdistill.data import load_data
from privdistill.engine import Env
from privdistill.engine.ensemble import TeacherTraining, train_teachers
from privdistill.errors import PrivdistillError

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    from privdistill.engine.distributed import connect

    connect(num_cpus=2)
    yield
    ray.shutdown()


def cfg(**kw):
    base = dict(num_teachers=4, model="small-cnn", steps=15, batch_size=16, lr=3e-3, trainer="loop")
    base.update(kw)
    return TeacherTraining(**base)


def test_ray_tasks_train_the_same_teachers_as_local_training(local_ray, tiny_npz):
    from privdistill.engine.distributed import train_teachers_ray

    data = load_data(f"npz:{tiny_npz}")
    env = Env.cpu(seed=4)
    local, _ = train_teachers(data.train, cfg(), env)
    remote, stats = train_teachers_ray(data.train, cfg(), env, chunk_size=2)
    assert stats["ray_tasks"] == 2
    # Same partitions, seeds and steps: the same teachers. Bit equality is not asserted: a Ray worker is another
    # process whose CPU kernels may sum in another order (seen on an AVX512-BF16 EPYC: 1e-5 apart after 15
    # steps). A wrong partition, seed or step count moves a tensor by about its own norm, not by 1e-3 of it.
    for k in local.names:
        a, b = local.stacked()[0][k], remote.stacked()[0][k]
        assert float((a - b).norm()) <= 1e-3 * float(a.norm()) + 1e-6, k
    x = data.test.batch(torch.arange(60))[0]
    agree = (local.votes(x).argmax(1) == remote.votes(x).argmax(1)).float().mean()
    assert agree >= 0.95, "the two ensembles vote alike"


def test_ray_trains_batchnorm_teachers_like_local_training(local_ray, tiny_npz):
    """A model with buffers under trainer=auto: both paths choose the loop and keep the running statistics as
    buffers (Ray once passed them as parameters, and the ensemble could not be built)."""
    from privdistill.engine.distributed import train_teachers_ray

    data = load_data(f"npz:{tiny_npz}")
    env = Env.cpu(seed=4)
    bn = cfg(model="paper-cnn-bn", trainer="auto", num_teachers=2, steps=5)
    local, local_stats = train_teachers(data.train, bn, env)
    remote, stats = train_teachers_ray(data.train, bn, env, chunk_size=1)
    assert (local_stats["trainer"], stats["trainer"]) == ("loop", "ray/loop")
    assert local.names == remote.names and remote.buffer_names == local.buffer_names
    assert any("running_mean" in name for name in remote.buffer_names)
    x = data.test.batch(torch.arange(30))[0]
    assert torch.allclose(local.logits(x), remote.logits(x), atol=1e-3, rtol=1e-3)


def test_without_ray_the_message_says_how_to_install(monkeypatch):
    from privdistill.engine import distributed

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(PrivdistillError, match=r"pip install 'privdistill\[ray\]'"):
        distributed.require_ray()


def test_a_malformed_cluster_address_is_refused_before_ray_starts():
    from privdistill.engine.distributed import connect
    from privdistill.errors import ConfigError

    for address in ("bogus", "bogus://x", "ray://host"):
        with pytest.raises(ConfigError, match="ray://host:port"):
            connect(address)
