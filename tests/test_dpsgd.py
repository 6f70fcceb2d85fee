"""DP-SGD baseline: calibration to the target ε (Opacus's tolerance), the strict replace-one ε, resume."""

import warnings

import pytest
import torch

from privdistill.errors import ConfigError
from privdistill.methods.common import RunRequest
from privdistill.methods.dpsgd import epsilons, run_dpsgd, steps_per_epoch
from privdistill.privacy.accounting import strict_noise_multiplier

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
        "dpsgd.epochs=2", "dpsgd.batch_size=100", "dpsgd.model=small-cnn", "dpsgd.lr=0.1", "run.progress=false",
        "run.precision=fp32", "budget.epsilon=10", "budget.accounting=paper"]


def _run(tiny_npz, tmp_path, name, extra=(), resume=False):
    return run_dpsgd(RunRequest(dataset=f"npz:{tiny_npz}", overrides=TINY + list(extra), run_dir=str(tmp_path / name),
                                resume=resume)).summary


def test_the_per_epoch_epsilon_is_opacus_s_own_float():
    """methods/dpsgd_plan.accountant_epsilon composes one step's RDP (computed once per σ and q) instead of
    Opacus recomputing it at every epoch: the same ε to the last bit, for one phase and for several."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    from privdistill.methods.dpsgd_plan import accountant_epsilon

    for history in ([(1.1, 0.01, 300)], [(0.8, 0.2, 10)], [(1.1, 0.01, 300), (2.0, 0.05, 7), (1.1, 0.01, 3)]):
        rdp = RDPAccountant()
        rdp.history = list(history)
        assert accountant_epsilon(rdp, 1e-5) == rdp.get_epsilon(delta=1e-5)
        assert accountant_epsilon(rdp, 1e-5) == accountant_epsilon(rdp, 1e-5)  # the memoised step
    prv = PRVAccountant()
    prv.history = [(1.1, 0.01, 300)]
    assert accountant_epsilon(prv, 1e-5) == pytest.approx(prv.get_epsilon(delta=1e-5), rel=1e-9)


def test_epsilon_matches_the_target_within_opacus_tolerance(tiny_npz, tmp_path):
    s = _run(tiny_npz, tmp_path, "rdp", ["budget.epsilon=4"])
    a = s["dpsgd_accounting"]
    # make_private_with_epsilon's binary search stops within epsilon_tolerance = 0.01 below the target
    assert 4 - 0.011 <= s["epsilon_paper"] <= 4 + 1e-9
    assert s["epsilon_paper"] == pytest.approx(a["epsilon_opacus_rdp"], abs=1e-4)
    assert a["epsilon_opacus_prv"] < a["epsilon_opacus_rdp"], "PRV is tighter than RDP's conversion"
    assert a["steps"] == 2 * steps_per_epoch(300, 100)
    # replace-one (strict) costs more than add/remove at the same noise (tight PLD vs PRV, both numerical)
    assert s["epsilon_strict"] > a["epsilon_opacus_prv"]
    assert s["target_epsilon"] == 4 and s["delta"] == 1e-5 and s["method"] == "dpsgd"
    assert s["not_covered"] == [], "every pathway goes through the noisy gradients"
    assert s["history"] and all("train_loss" not in h for h in s["history"]), "private-batch loss is not published"


def test_strict_calibration_meets_the_replace_one_target():
    q, steps = 0.05, 40
    sigma = strict_noise_multiplier(target_epsilon=2.0, delta=1e-5, sample_rate=q, steps=steps, tolerance=0.05)
    eps = epsilons(sigma, q, steps, 1e-5)
    assert 2.0 - 0.051 <= eps["replace_one"] <= 2.0
    assert eps["rdp"] < eps["replace_one"] * 1.5 and eps["prv"] < eps["replace_one"]
    # more noise never costs more
    assert epsilons(sigma * 1.2, q, steps, 1e-5)["replace_one"] < eps["replace_one"]


def test_a_resumed_run_equals_an_uninterrupted_one(tiny_npz, tmp_path, monkeypatch):
    # bit-for-bit replay is what the CPU guarantees; on CUDA cuDNN's default kernels differ in the last bits (H100)
    cpu = ["run.device=cpu", "run.noise=reproducible"]  # compared bit for bit: the noise replayed by name
    whole = _run(tiny_npz, tmp_path, "whole", cpu)
    import privdistill.methods.dpsgd as dpsgd

    real, calls = dpsgd.accuracy, {"n": 0}

    def crash_in_second_epoch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("simulated crash after the first epoch's checkpoint")
        return real(*args, **kwargs)

    monkeypatch.setattr(dpsgd, "accuracy", crash_in_second_epoch)
    with pytest.raises(KeyboardInterrupt):
        _run(tiny_npz, tmp_path, "crashed", cpu)
    monkeypatch.setattr(dpsgd, "accuracy", real)
    resumed = _run(tiny_npz, tmp_path, "crashed", cpu, resume=True)
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / "whole" / "model.safetensors")),
            load_file(str(tmp_path / "crashed" / "model.safetensors")))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["epsilon_paper"] == whole["epsilon_paper"]
    assert resumed["dpsgd_accounting"]["steps"] == whole["dpsgd_accounting"]["steps"], "accountant state restored"


def test_batchnorm_models_are_refused(tiny_npz, tmp_path):
    with pytest.raises(ConfigError, match="not DP-SGD compatible"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _run(tiny_npz, tmp_path, "bn", ["dpsgd.model=paper-cnn-bn"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_trains_on_cuda_with_autocast_evaluation(tiny_npz, tmp_path):
    # On an H100 the model stayed on the CPU and the first (bf16-autocast) evaluation crashed.
    s = _run(tiny_npz, tmp_path, "cuda", ["run.device=cuda", "run.precision=bf16", "dpsgd.epochs=1"])
    assert s["device"].startswith("cuda") and 0.0 <= s["test_accuracy"] <= 1.0



def test_secure_noise_is_the_default_and_draws_every_gradient_noise(tiny_npz, tmp_path, secure_draws):
    s = _run(tiny_npz, tmp_path, "secure", ["dpsgd.epochs=1"])
    assert s["noise_secure"] is True and s["epsilon_sampling"] > 0
    from privdistill.models import create_model

    size = sum(p.numel() for p in create_model("small-cnn", in_channels=1, num_classes=10, image_size=28).parameters())
    steps = s["dpsgd_accounting"]["steps"]
    assert [n for _, n in secure_draws] == [size] * steps, "every coordinate's noise, every step, secure"


def test_python_api_takes_a_recipe_a_config_file_and_arrays(tiny_npz, tmp_path):
    """DP-SGD is a method of the Python API like the others (issue 26), with recipes and config files."""
    import numpy as np

    from privdistill.methods import DPSGD

    request = DPSGD(epsilon=1, recipe="scatternet", config="mine.yaml").request("mnist")
    assert request.overrides["run.recipe"] == "scatternet" and request.config_file == "mine.yaml"
    arrays = np.load(tiny_npz)
    result = DPSGD(overrides=TINY, run_dir=str(tmp_path / "api"), epochs=1).fit(arrays["x"], arrays["y"])
    assert result.summary["method"] == "dpsgd" and result.summary["epochs"] == 1
    assert result.summary["epsilon_paper"] <= 10 + 1e-9 and result.generator is None
