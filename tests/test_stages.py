"""Issue 4: stage cache, teacher ensembles (vectorised == loop), data-free generator learning."""

import warnings

import pytest
import torch
from torch.func import stack_module_state

from privdistill.config import ClassifierTraining
from privdistill.data import load_data
from privdistill.data.dataset import to_uint8
from privdistill.engine import Env, RunDir
from privdistill.engine.cache import StageCache
from privdistill.engine.datafree import (
    BatchNormStatistics,
    GeneratorCollapseWarning,
    GeneratorTraining,
    datafree_loss,
    generate,
    train_generator,
    warn_if_collapsed,
)
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining, ensemble_accuracy, train_teachers
from privdistill.engine.stages import Stages
from privdistill.errors import ConfigError, DataError, ModelError
from privdistill.models import create_model


@pytest.fixture
def tiny(tiny_npz):
    return load_data(f"npz:{tiny_npz}")


def teacher_cfg(**kw):
    base = dict(num_teachers=4, model="small-cnn", steps=25, batch_size=16, lr=3e-3, trainer="vectorized")
    base.update(kw)
    return TeacherTraining(**base)


def test_vectorised_and_loop_trainers_give_the_same_teachers(tiny):
    env = Env.cpu(seed=5)
    cfg = dict(num_teachers=7)  # 300 examples into 7 parts: sizes 42 and 43, so unequal partitions are covered
    vec, _ = train_teachers(tiny.train, teacher_cfg(trainer="vectorized", **cfg), env)
    loop, _ = train_teachers(tiny.train, teacher_cfg(trainer="loop", **cfg), env)
    chunked, _ = train_teachers(tiny.train, teacher_cfg(trainer="vectorized", chunk_size=3, **cfg), env)
    # Grouped (vmap) and plain convolutions sum in another order; Adam amplifies those 1e-7 differences
    # in the smallest gradient coordinates to ~3e-4 after 25 steps. Chunking changes nothing (1e-7).
    a, _ = vec.stacked()
    for other, atol in ((loop, 1e-3), (chunked, 1e-6)):
        b, _ = other.stacked()
        for k in a:
            assert torch.allclose(a[k], b[k], atol=atol, rtol=1e-3), k
    x = tiny.test.batch(torch.arange(20))[0]
    assert torch.equal(vec.votes(x), loop.votes(x))


def test_votes_count_every_teacher_once_and_members_match(tiny):
    env = Env.cpu(seed=1)
    ens, stats = train_teachers(tiny.train, teacher_cfg(), env)
    x = tiny.test.batch(torch.arange(30))[0]
    votes = ens.votes(x, num_classes=10)
    assert votes.shape == (30, 10) and torch.all(votes.sum(1) == 4)
    member = ens.member(2).eval()
    with torch.no_grad():
        assert torch.equal(member(x).argmax(1), ens.predictions(x)[2])
    acc = ensemble_accuracy(ens, tiny.test, env, laplace_scale=0.5)
    assert acc["ensemble_accuracy"] > 0.8 and 0 <= acc["noisy_ensemble_accuracy"] <= 1
    assert stats["partition_sizes"] == [75, 75] and stats["teachers_per_minute"] > 0


def test_ensemble_save_load_roundtrip(tiny, tmp_path):
    ens, _ = train_teachers(tiny.train, teacher_cfg(steps=2), Env.cpu())
    ens.save(tmp_path / "t.safetensors")
    back = TeacherEnsemble.load(tmp_path / "t.safetensors")
    x = tiny.test.batch(torch.arange(5))[0]
    assert torch.equal(ens.logits(x), back.logits(x))


def test_looped_and_vmapped_ensemble_inference_agree_also_under_bf16(tiny):
    ens, _ = train_teachers(tiny.train, teacher_cfg(steps=10), Env.cpu(seed=2))
    x = tiny.test.batch(torch.arange(40))[0]
    vmapped = ens.logits(x, vectorized=True)
    assert torch.allclose(ens.logits(x, vectorized=False), vmapped, atol=1e-5)
    assert torch.allclose(ens.logits(x.contiguous(memory_format=torch.channels_last)), vmapped, atol=1e-5)
    # regression: autocast caches casts of grad-requiring weights, which kept teacher 0 for every teacher
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = ens.logits(x, vectorized=False)
    assert torch.allclose(half, vmapped, atol=0.1 * float(vmapped.abs().max()))
    assert not torch.allclose(half[0], half[1], atol=1e-3), "every teacher answers with its own weights"


def test_auto_trainer_is_the_loop_on_a_cpu_but_for_batches_of_few_pixels(tiny):
    from privdistill.engine.ensemble import VMAP_CPU_PIXELS, auto_trainer

    _, stats = train_teachers(tiny.train, teacher_cfg(trainer="auto", steps=2), Env.cpu())
    assert stats["trainer"] == "loop"  # 16 images of 28 x 28: the loop's dense convolutions are faster

    class Small(list):  # what auto_trainer reads: the record count and the image size
        image_size = (8, 8)

    digits = Small(range(1500))
    fifteen = teacher_cfg(num_teachers=100, batch_size=64)  # the batch is bounded by the 15-record shares
    assert 15 * 64 <= VMAP_CPU_PIXELS < 33 * 64
    assert auto_trainer(fifteen, digits, Env.cpu(), has_buffers=False) == "vectorized"
    assert auto_trainer(fifteen, digits, Env.cpu(), has_buffers=True) == "loop"  # vmap cannot update BatchNorm
    assert auto_trainer(teacher_cfg(num_teachers=10, batch_size=33), digits, Env.cpu(), has_buffers=False) == "loop"


def test_teacher_bad_input(tiny):
    env = Env.cpu()
    with pytest.raises(DataError, match="at least 1000 training examples"):
        train_teachers(tiny.train, teacher_cfg(num_teachers=1000), env)
    with pytest.raises(ConfigError, match="exceeds the smallest partition"):
        train_teachers(tiny.train, teacher_cfg(num_teachers=50, batch_size=16), env)
    with pytest.raises(ModelError, match="trainer=loop"):
        train_teachers(tiny.train, teacher_cfg(model="resnet18", steps=1), env)
    with pytest.raises(ConfigError):
        TeacherTraining(num_teachers=0).validate()


def test_partitions_missing_classes_warn(tiny):
    from privdistill.engine.ensemble import EnsembleWarning

    with pytest.warns(EnsembleWarning, match="lack some class"):
        train_teachers(tiny.train, teacher_cfg(num_teachers=30, batch_size=8, steps=1), Env.cpu())


def test_an_ensemble_of_stacked_modules_gives_each_teachers_own_logits(tiny):
    a = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28)
    b = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28)
    params, buffers = stack_module_state([a, b])
    ens = TeacherEnsemble(a, {k: v.detach() for k, v in params.items()}, {k: v.detach() for k, v in buffers.items()})
    x = tiny.test.batch(torch.arange(3))[0]
    with torch.no_grad():
        assert torch.allclose(ens.logits(x)[1], b(x), atol=1e-5)


def test_killed_teacher_training_resumes_from_finished_chunks(tiny, tmp_path):
    env = Env.cpu(seed=2)
    cfg = teacher_cfg(chunk_size=2)
    full, _ = train_teachers(tiny.train, cfg, env, checkpoint_dir=tmp_path)
    chunks = sorted(tmp_path.glob("teachers-*.pt"))
    assert [c.name for c in chunks] == ["teachers-00000.pt", "teachers-00002.pt"]
    # As if killed during the second chunk: its file is missing. Mark the first chunk so that we can see
    # it is loaded, not retrained.
    chunks[1].unlink()
    first = torch.load(chunks[0], weights_only=True)
    torch.save({k: v + 1.0 for k, v in first.items()}, chunks[0])
    resumed, _ = train_teachers(tiny.train, cfg, env, checkpoint_dir=tmp_path)
    for k in full.names:
        a, b = full.stacked()[0][k], resumed.stacked()[0][k]
        assert torch.allclose(a[:2] + 1.0, b[:2]), "finished chunk reused as saved"
        assert torch.equal(a[2:], b[2:]), "missing chunk retrained identically"


def test_generator_losses_and_training_reduce_the_objective(tiny):
    env = Env.cpu(seed=0)
    teacher = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28)
    from privdistill.engine import train_classifier

    train_classifier(teacher, tiny.train, cfg=ClassifierTraining(model="small-cnn", epochs=3, batch_size=32, lr=3e-3),
                     env=env)
    teacher.eval()
    cfg = GeneratorTraining(loss="dgd", rounds=3, steps_per_round=10, batch_size=32, width=32, lr=0.05)
    gen, stats = train_generator(teacher, cfg, env, channels=1, image_size=28)
    first_rounds = stats["final"]
    assert stats["alpha"] == 5.0 and stats["beta"] == 0.1 and first_rounds["round"] == 3
    before = {k: v.clone() for k, v in gen.state_dict().items()}
    images = generate(gen, 50, env)
    assert images.shape == (50, 1, 28, 28) and images.dtype == torch.uint8
    # sampling runs BatchNorm in train mode but leaves the generator as trained (running statistics included),
    # so a released generator is the same whether its samples were drawn in the run or read from the cache
    after = gen.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "generate() changed the generator's buffers"
    raw = generate(gen, 50, env, quantise=False)  # same latent stream: the floats behind those bytes
    assert raw.dtype == torch.float32 and torch.equal(to_uint8(raw), images)
    x = torch.rand(8, 1, 28, 28) * 2 - 1
    for kind in ("dgd", "dpdfd"):
        loss, parts = datafree_loss(teacher, x, kind, 1.0, 1.0)
        assert torch.isfinite(loss) and parts["activation"] <= 0, "activation is a reward (negative term)"


def _interrupted_at(monkeypatch, module, name: str, call: int):
    """Make `module.name` raise KeyboardInterrupt at its `call`-th call (1-based), as a kill would."""
    original, calls = getattr(module, name), []

    def stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, stop)


def test_interrupted_generator_and_vae_trainings_resume_to_the_same_weights(tiny, tmp_path, monkeypatch):
    from privdistill.engine import datafree, vae
    from privdistill.engine.vae import VAETraining, train_vae

    env = Env.cpu(seed=2)
    teacher = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28)
    # the rate decays every round, so the resumed run must also continue the schedule where it stopped
    gen_cfg = GeneratorTraining(loss="dgd", rounds=3, steps_per_round=2, lr_decay_every=1, batch_size=16, width=16,
                                lr=0.05, checkpoint_every=3)
    vae_cfg = VAETraining(latent_dim=4, steps=6, batch_size=16, checkpoint_every=2)
    images = tiny.train.images[:64]
    for i, (train, module, name, call) in enumerate([
            (lambda run: train_generator(teacher, gen_cfg, env, channels=1, image_size=28, run=run),
             datafree, "datafree_loss", 5),
            (lambda run: train_vae(images, vae_cfg, env, run=run), vae, "vae_loss", 4)]):
        full, full_stats = train(None)
        run = RunDir(tmp_path / f"run{i}")
        run.path.mkdir()
        with monkeypatch.context() as patch:
            _interrupted_at(patch, module, name, call)
            with pytest.raises(KeyboardInterrupt):
                train(run)
        torch.manual_seed(99)  # the resumed run must not depend on the global RNG it finds
        resumed, resumed_stats = train(run)
        for key, value in full.state_dict().items():
            assert torch.equal(value, resumed.state_dict()[key]), (name, key)
        assert {k: v for k, v in full_stats.items() if k != "wall_seconds"} == \
            {k: v for k, v in resumed_stats.items() if k != "wall_seconds"}


def test_srr_loss_needs_batchnorm_and_matches_running_stats():
    cnn = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28)
    with pytest.raises(ModelError, match="no BatchNorm"):
        BatchNormStatistics(cnn)
    net = create_model("resnet18", in_channels=1, num_classes=10, image_size=28).eval()
    bn = BatchNormStatistics(net)
    loss, parts = datafree_loss(net, torch.randn(4, 1, 28, 28), "srr", 5.0, 10.0, bn)
    assert parts["activation"] > 0 and torch.isfinite(loss)
    bn.remove()


def test_stage_cache_reuses_complete_stages_and_never_partial_ones(tmp_path):
    cache = StageCache(tmp_path / "cache")
    calls = []

    def build(run: RunDir):
        calls.append(run.path.name)
        (run.path / "artifact.txt").write_text("x")
        return {"value": 1}

    a = cache.get_or_build("teachers", "1", {"cfg": 1}, build)
    b = cache.get_or_build("teachers", "1", {"cfg": 1}, build)
    c = cache.get_or_build("teachers", "1", {"cfg": 2}, build)
    assert not a.reused and b.reused and not c.reused and len(calls) == 2
    assert a.path == b.path and a.key != c.key and b.info()["value"] == 1
    assert cache.get_or_build("teachers", "2", {"cfg": 1}, build).key != a.key, "code version is part of the key"

    # A build that crashes leaves a .partial directory, which is not a stage and is resumed next time.
    def crash(run: RunDir):
        (run.path / "half.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_build("generator", "1", {"cfg": 3}, crash)
    partial = [e for e in cache.entries() if e["name"].startswith("generator")]
    assert len(partial) == 1 and not partial[0]["complete"]
    d = cache.get_or_build("generator", "1", {"cfg": 3}, build)
    assert not d.reused and (d.path / "half.txt").exists(), "the rebuild resumes inside the partial directory"
    assert [e["complete"] for e in cache.entries() if e["name"].startswith("generator")] == [True]
    assert len(cache.remove("teachers")) == 3


def test_stages_share_the_baseline_between_runs(tiny, tmp_path):
    env = Env.cpu(seed=0)
    cache = StageCache(tmp_path / "cache")
    cfg = ClassifierTraining(model="small-cnn", epochs=1, batch_size=32)
    run1 = RunDir.open(tmp_path / "r1", config={})
    run2 = RunDir.open(tmp_path / "r2", config={})
    m1, s1 = Stages(cache, env, tiny, run1).baseline(cfg)
    m2, s2 = Stages(cache, env, tiny, run2).baseline(cfg)
    assert not s1.reused and s2.reused and s1.key == s2.key
    m3, s3 = Stages(cache, Env.cpu(seed=1), tiny, run2).baseline(cfg)
    assert s3.key != s1.key, "another seed is another stage"
    disabled = Stages(StageCache(tmp_path / "cache", enabled=False), env, tiny, run1)
    _, s4 = disabled.baseline(cfg)
    assert str(s4.path).startswith(str(run1.path)), "with the cache off, stages live inside the run"


def test_teacher_stage_interrupted_during_evaluation_is_not_retrained(tiny, tmp_path, monkeypatch):
    import privdistill.engine.stages as stages_module

    env = Env.cpu(seed=3)
    cache = StageCache(tmp_path / "cache")
    cfg = teacher_cfg(steps=3)
    run = RunDir.open(tmp_path / "r", config={})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while evaluating the ensemble")

    monkeypatch.setattr(stages_module, "ensemble_accuracy", killed)
    with pytest.raises(KeyboardInterrupt):
        Stages(cache, env, tiny, run).teachers(cfg)
    monkeypatch.undo()

    def no_training(*args, **kwargs):
        raise AssertionError("the finished teachers were trained again")

    monkeypatch.setattr(stages_module, "train_teachers", no_training)
    ensemble, stage = Stages(cache, env, tiny, run).teachers(cfg)
    info = stage.info()
    # the training statistics of the interrupted build were kept (not the "time not recorded" fallback); the
    # time itself can round to 0.0 s on a fast CPU, so only its presence is asserted
    assert ensemble.num_teachers == 4 and info["num_teachers"] == 4
    assert info["wall_seconds"] is not None and info["wall_seconds"] >= 0 and "note" not in info
    assert 0 <= info["noisy_ensemble_accuracy"] <= 1 and info["laplace_scale"] == 40.0


def test_loop_trained_batchnorm_teachers_keep_their_running_statistics(tiny):
    # The loop trainer is what the vectorised one's refusal recommends for BatchNorm models; it used to drop
    # their buffers, so such an ensemble failed when it voted.
    env = Env.cpu()
    ensemble, _ = train_teachers(tiny.train, teacher_cfg(model="resnet18", trainer="loop", num_teachers=2, steps=2),
                                 env)
    _, buffers = ensemble.stacked()
    means = [v for k, v in buffers.items() if k.endswith("running_mean")]
    assert means and all(m.abs().sum() > 0 for m in means), "running statistics were updated and kept"
    votes = ensemble.votes(tiny.test.images[:8].float().div(127.5).sub(1))
    assert votes.shape == (8, tiny.num_classes) and int(votes.sum()) == 8 * 2


def test_a_mode_collapsed_generator_warns_when_built_and_when_reused(tiny, tmp_path):
    # A classifier that answers "1" whatever it sees: no generator can spread its samples over the classes.
    env = Env.cpu(seed=0)
    constant = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28).eval()
    head = [m for m in constant.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.nn.functional.one_hot(torch.tensor(1), 10).float() * 20)
    cfg = GeneratorTraining(loss="dgd", rounds=1, steps_per_round=3, batch_size=8, width=16)
    stages = Stages(StageCache(tmp_path / "cache"), env, tiny, RunDir.open(tmp_path / "r", config={}))
    with pytest.warns(GeneratorCollapseWarning, match="mode-collapsed"):
        _, built = stages.generator(constant, "constant-1", cfg)
    assert built.info()["class_balance"] < 0.01
    with pytest.warns(GeneratorCollapseWarning):
        _, again = stages.generator(constant, "constant-1", cfg)
    assert again.reused


def test_collapse_threshold_spares_balanced_generators():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        assert warn_if_collapsed({"entropy": 2.29}, 10, "balanced") == pytest.approx(2.29 / 2.302585, rel=1e-4)
        assert warn_if_collapsed({"one_hot": 0.1}, 10, "no entropy logged") is None
    with pytest.warns(GeneratorCollapseWarning, match="0.64"):
        warn_if_collapsed({"entropy": 1.48}, 10, "the H100 generator of 2026-11-23")


def _build_slowly(root: str, log: str) -> str:
    """Child process of the race below: build one stage whose build takes a while and logs each build."""
    import time as _time

    def build(run):
        with open(log, "a") as f:
            f.write("built\n")
        _time.sleep(1.0)
        return {"value": 1}

    return str(StageCache(root).get_or_build("race", "1", {"k": 1}, build).path)


def test_two_processes_building_one_stage_build_it_once(tmp_path):
    import multiprocessing

    log = tmp_path / "builds.log"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        paths = pool.starmap(_build_slowly, [(str(tmp_path / "cache"), str(log))] * 2)
    assert log.read_text().splitlines() == ["built"], "the second process waited and reused the first one's stage"
    assert paths[0] == paths[1] and not list((tmp_path / "cache").glob("*.partial"))


def test_removing_stages_leaves_one_being_built(tmp_path):
    import fcntl

    cache = StageCache(tmp_path / "cache")
    cache.get_or_build("done", "1", {}, lambda run: {})
    partial = tmp_path / "cache" / "busy-0123.partial"
    partial.mkdir()
    with open(tmp_path / "cache" / ".busy-0123.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a builder holds it
        assert [n.split("-")[0] for n in cache.remove()] == ["done"]
        assert partial.is_dir() and (tmp_path / "cache" / ".busy-0123.lock").is_file()
    assert cache.remove() == ["busy-0123.partial"]
