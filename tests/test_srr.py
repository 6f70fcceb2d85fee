"""Issue 7: SRR (selective randomized response), its label-DP setting, RR / RRWithPrior, budget, resume."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import privdistill.methods.srr as srr_mod
from cli_run import cli_in_process
from privdistill.errors import BudgetExceededError, ConfigError, DataError, PrivacyError
from privdistill.methods.common import RunRequest
from privdistill.methods.runner import Budget
from privdistill.methods.srr import SRRConfig, label_event, run_srr
from privdistill.methods.srr_schedule import stage_sizes
from privdistill.privacy.events import RandomizedResponse, RandomizedResponseWithPrior
from privdistill.privacy.ledger import PrivacyLedger
from privdistill.privacy.mechanisms import (
    release_labels,
    released_label_likelihood,
    rr_on_sets,
    rr_with_prior_sets,
)

# a config that runs in a few seconds on one thread (fabricated 28x28 patterns, 10 classes)
TINY = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
        "srr_teacher.model=paper-cnn-bn", "srr_teacher.steps=40", "srr_teacher.batch_size=32",
        "srr_teacher.lr=0.003", "srr_teacher.eval_every_epochs=100",
        "srr_generator.rounds=2", "srr_generator.steps_per_round=5", "srr_generator.batch_size=32",
        "srr_generator.width=32", "srr.stages=4", "srr.num_samples=160", "srr.batch_size=32",
        "srr.epochs_per_stage=2", "srr.finetune_steps=2", "srr.finetune_batch_size=16",
        "run.threads=1", "run.precision=fp32", "run.progress=false"]
REPRODUCIBLE = ["run.noise=reproducible"]  # tests that compare two runs bit for bit replay the noise by name
PER_LABEL = ["budget.accounting=paper"]  # budget.epsilon is then the epsilon per label (the paper's)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def request(tiny_npz, run_dir, *extra, record=False, results_dir="results"):
    return RunRequest(dataset=f"npz:{tiny_npz}", overrides=TINY + list(extra), run_dir=str(run_dir),
                      record=record, results_dir=str(results_dir))


# ------------------------------------------------------------------------------------------ mechanisms
def test_rr_with_prior_picks_the_optimal_top_k():
    eps = 1.0
    w = lambda k: math.exp(eps) / (math.exp(eps) + k - 1)  # noqa: E731
    prior = torch.tensor([[0.9, 0.05, 0.05, 0, 0], [0.3, 0.3, 0.3, 0.1, 0.0], [0.2] * 5])
    sets = rr_with_prior_sets(prior, eps)
    for row, p in zip(sets, prior):
        ranked = sorted(p.tolist(), reverse=True)
        best = max(range(1, 6), key=lambda k: (w(k) * sum(ranked[:k]), -k))
        assert int(row.sum()) == best
        assert set(torch.nonzero(row).flatten().tolist()) == set(torch.argsort(-p, stable=True)[:best].tolist())
    assert sets[0].tolist() == [True, False, False, False, False]  # confident prior: k* = 1


def test_rr_on_sets_has_the_rr_distribution_and_is_eps_dp():
    eps, n = 1.3, 200_000
    in_set = torch.zeros(n, 5, dtype=torch.bool)
    in_set[:, [0, 2, 3]] = True  # I = {0, 2, 3}, k = 3
    g = torch.Generator().manual_seed(0)
    freq = {}
    for y in (0, 1):  # label in I, label not in I
        out = rr_on_sets(in_set, torch.full((n,), y), epsilon=eps, generator=g)
        freq[y] = torch.bincount(out, minlength=5).double() / n
    keep = math.exp(eps) / (math.exp(eps) + 2)
    assert freq[0][0] == pytest.approx(keep, abs=0.005)
    assert freq[0][2] == pytest.approx((1 - keep) / 2, abs=0.005) and freq[0][1] == freq[0][4] == 0
    assert torch.allclose(freq[1][[0, 2, 3]], torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.005)
    ratio = (freq[0][[0, 2, 3]] / freq[1][[0, 2, 3]]).log().abs().max()
    assert ratio <= eps + 0.02
    single = torch.zeros(4, 5, dtype=torch.bool)
    single[:, 2] = True  # k = 1: the output does not depend on the label
    assert rr_on_sets(single, torch.tensor([2, 0, 1, 4]), epsilon=5.0, generator=g).tolist() == [2, 2, 2, 2]
    with pytest.raises(PrivacyError, match="non-empty"):
        rr_on_sets(torch.zeros(2, 3, dtype=torch.bool), torch.tensor([0, 1]), epsilon=1.0, generator=g)


def test_released_label_likelihood_is_the_mechanisms_output_distribution():
    """P(released | y) from `released_label_likelihood` matches rr_on_sets' measured output frequencies, for a
    true label inside and outside the candidate set."""
    eps, n = 0.8, 200_000
    in_set = torch.zeros(n, 5, dtype=torch.bool)
    in_set[:, [0, 2, 3]] = True
    g = torch.Generator().manual_seed(1)
    for y in (0, 1, 3):
        released = rr_on_sets(in_set, torch.full((n,), y), epsilon=eps, generator=g)
        measured = torch.bincount(released, minlength=5).double() / n
        for j in (0, 2, 3):
            predicted = released_label_likelihood(in_set[:1], torch.tensor([j]), epsilon=eps)[0, y]
            assert float(predicted) == pytest.approx(float(measured[j]), abs=0.005)
    full = torch.ones(1, 10, dtype=torch.bool)  # plain RR: keep e^eps/(e^eps + 9), any other 1/(e^eps + 9)
    row = released_label_likelihood(full, torch.tensor([4]), epsilon=1.0)[0]
    assert float(row[4]) == pytest.approx(math.e / (math.e + 9)) and float(row[0]) == pytest.approx(1 / (math.e + 9))
    with pytest.raises(PrivacyError, match="member"):
        released_label_likelihood(in_set[:1], torch.tensor([1]), epsilon=eps)


def test_release_labels_dispatches_and_srr_keeps_the_teacher_label_in_the_prior_set():
    g = torch.Generator().manual_seed(1)
    prior = torch.tensor([[0.6, 0.3, 0.05, 0.05]] * 4000, dtype=torch.float64)
    teacher = torch.zeros(4000, dtype=torch.long)
    out = release_labels("srr", prior, teacher, epsilon=2.0, threshold=None, generator=g)
    assert set(out.unique().tolist()) <= {0, 1}  # I = {k : y_s > 1/8} = {0, 1}
    assert float((out == 0).double().mean()) == pytest.approx(math.exp(2) / (math.exp(2) + 1), abs=0.02)
    rr = release_labels("rr", prior, teacher, epsilon=2.0, threshold=None, generator=g)
    assert set(rr.unique().tolist()) == {0, 1, 2, 3}
    rrp = release_labels("rr-prior", prior, teacher, epsilon=2.0, threshold=None, generator=g)
    assert set(rrp.unique().tolist()) <= {0, 1}


def test_events_stage_sizes_and_config_checks():
    cfg = SRRConfig()
    assert label_event(cfg, 10, 10, 2.0) == RandomizedResponseWithPrior(2.0, 10, 10, "data-free")
    assert label_event(SRRConfig(mechanism="rr"), 10, 10, 10.0) == RandomizedResponse(10.0, 10, 10)
    for mech in ("srr", "rr", "rr-prior"):  # all priced per label under "change one label"
        assert label_event(SRRConfig(setting="label-dp", mechanism=mech), 7, 10, 10.0) \
            == RandomizedResponseWithPrior(10.0, 7, 10, "label-dp")
    assert stage_sizes(10, 3) == [4, 3, 3] and sum(stage_sizes(60000, 320)) == 60000
    assert stage_sizes(60000, 3, 0.5) == [30000, 15000, 15000] and stage_sizes(5, 3, 0.9) == [3, 1, 1]
    with pytest.raises(ConfigError, match="at least"):
        stage_sizes(2, 3)
    with pytest.raises(ConfigError):  # the epsilon is the budget section's
        Budget(epsilon=0).validate()
    for bad in (dict(setting="x"), dict(mechanism="x"), dict(stages=0), dict(finetune_steps=-1)):
        with pytest.raises(ConfigError):
            SRRConfig(**bad).validate()


# ------------------------------------------------------------------------------------------ end to end
def test_data_free_run_records_labels_and_reports_both_epsilons(tiny_npz, tmp_path, cache):
    summary = run_srr(request(tiny_npz, tmp_path / "run", *PER_LABEL, "budget.epsilon=1", record=True,
                                results_dir=tmp_path / "results")).summary
    run = tmp_path / "run"
    assert summary["method"] == "srr" and summary["epsilon_paper"] == 1.0 and summary["target_epsilon"] == 1.0
    ledger = PrivacyLedger(run, accounting="paper")
    assert ledger.keys() == ["stage-1", "stage-2", "stage-3", "stage-4"]
    assert sum(e.count for e in ledger.events()) == 160
    # strict: 160 labels from one teacher, composed (between the exact optimum and 160 * eps)
    assert 10 < summary["epsilon_strict"] < 160
    assert summary["baseline_accuracy"] > 0.8 and 0 <= summary["label_accuracy_vs_teacher"] <= 1
    assert summary["delta"] == 1e-5 and "pure" in summary["epsilon_note"]
    privacy = json.loads((run / "privacy.json").read_text())
    assert privacy["artifacts"]["generator"][0]["covered"] is False
    assert any(not p["covered"] for p in privacy["artifacts"]["student"])
    assert summary["not_covered"] == [p["via"] for p in privacy["artifacts"]["student"] if not p["covered"]]
    assert (tmp_path / "results" / "custom" / "srr-npz-tiny-eps1.json").is_file() or \
        (tmp_path / "results" / "quick" / "srr-npz-tiny-eps1.json").is_file()  # paper: unnamed
    assert not (run / "synthetic").exists(), "stage images are removed once the run has finished"
    # the shared stages are cached: a second epsilon reuses the teacher and the generator
    other = run_srr(request(tiny_npz, tmp_path / "run10", *PER_LABEL, "budget.epsilon=10")).summary
    assert other["stages_used"]["teacher"]["reused"] and other["stages_used"]["generator"]["reused"]
    assert other["label_accuracy_vs_teacher"] > summary["label_accuracy_vs_teacher"]


def test_label_dp_setting_is_eps_label_dp_and_learns(tiny_npz, tmp_path, cache):
    summary = run_srr(request(tiny_npz, tmp_path / "run", "srr.setting=label-dp", *PER_LABEL, "budget.epsilon=2",
                                "srr.num_samples=0", "srr.stages=3", "srr.epochs_per_stage=4", "srr.lr=0.003",
                                "srr.student_model=small-cnn")).summary
    assert summary["epsilon_strict"] == pytest.approx(2.0, abs=1e-4) and summary["epsilon_paper"] == 2.0
    assert "label" in summary["relation"] and summary["variant"] == "label-dp"
    assert summary["num_labels"] == 300 and 0.3 < summary["label_accuracy_vs_truth"] <= 1
    assert summary["test_accuracy"] > 0.5
    privacy = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert set(privacy["artifacts"]) == {"student"}
    assert summary["not_covered"] == [p["via"] for p in privacy["artifacts"]["student"] if not p["covered"]]
    # no teacher is trained in this setting, so nothing non-private about it is published (issue 28)
    assert summary["baseline_accuracy"] is None and summary["teacher_model"] is None
    assert "teacher" not in summary["stages_used"] and not list(cache.glob("baseline-*"))
    rr = run_srr(request(tiny_npz, tmp_path / "rr", "srr.setting=label-dp", "srr.mechanism=rr", *PER_LABEL,
                           "budget.epsilon=2", "srr.num_samples=0", "srr.stages=1",
                           "srr.student_model=small-cnn")).summary
    assert rr["variant"] == "label-dp-rr" and rr["epsilon_strict"] == pytest.approx(2.0, abs=1e-4)
    # the label-dp recipe's own run is named by the recipe alone (srr-D-epsE-label-dp.json, not -label-dp-label-dp)
    named = run_srr(request(tiny_npz, tmp_path / "named", "run.recipe=label-dp", *PER_LABEL, "budget.epsilon=2",
                              "srr.num_samples=0", "srr.stages=1", "srr.student_model=small-cnn", record=True,
                              results_dir=tmp_path / "results")).summary
    assert named["variant"] is None and named["recipe"] == "label-dp"
    assert [p.name for p in (tmp_path / "results").rglob("*.json")] == ["srr-npz-tiny-eps2-label-dp.json"]


def test_budget_refuses_before_training(tiny_npz, tmp_path, cache):
    with pytest.raises(BudgetExceededError, match="strict"):
        # the target (calibrated per-label epsilon) above the hard limit
        run_srr(request(tiny_npz, tmp_path / "a", "budget.epsilon=20", "budget.max_epsilon=10",
                          "budget.accounting=strict"))
    with pytest.raises(BudgetExceededError, match="paper"):
        run_srr(request(tiny_npz, tmp_path / "b", *PER_LABEL, "budget.epsilon=1", "budget.max_epsilon=0.5"))
    assert not cache.exists() or not any(cache.glob("baseline-*")), "nothing may be trained before the check"
    # label-DP draws one label per private record: a preset's larger num_samples (60,000: all of MNIST) means all
    capped = run_srr(request(tiny_npz, tmp_path / "c", "srr.setting=label-dp", "srr.num_samples=100000",
                             "budget.epsilon=10", "srr.stages=1", "srr.student_model=small-cnn")).summary
    assert capped["num_labels"] == 300 and any("all of them" in n for n in capped["plan_notes"])


class _Interrupt(Exception):
    pass


def test_likelihood_loss_multi_stage_run_traces_every_stage(tiny_npz, tmp_path, cache):
    """Label-DP RRWithPrior in two stages (half the labels first), cumulative, trained on the released labels'
    likelihood: the stage trace has each stage's candidate sets, label correctness and test accuracy; the
    candidate sets are kept for the loss and the first stage (no prior yet) is plain RR."""
    summary = run_srr(request(tiny_npz, tmp_path / "run", "srr.setting=label-dp", "srr.mechanism=rr-prior",
                                *PER_LABEL, "budget.epsilon=2", "srr.num_samples=0", "srr.stages=2",
                                "srr.first_stage_fraction=0.6", "srr.student_data=cumulative",
                                "srr.loss=likelihood", "srr.eval_every_stages=1", "srr.epochs_per_stage=4",
                                "srr.lr=0.003", "srr.student_model=small-cnn")).summary
    trace = summary["stage_trace"]
    assert [t["stage"] for t in trace] == [1, 2] and [t["count"] for t in trace] == [180, 120]
    assert trace[0]["mean_set_size"] == 10 and trace[1]["mean_set_size"] < 10
    assert all(t["test_accuracy"] is not None for t in trace) and summary["test_accuracy"] > 0.5
    assert summary["config"]["loss"] == "likelihood"
    assert sorted(p.name for p in (tmp_path / "run" / "label-sets").iterdir()) == ["stage-0001.pt", "stage-0002.pt"]


def test_interrupted_run_resumes_to_the_same_student_without_redrawing(tiny_npz, tmp_path, cache, monkeypatch):
    """Interrupt after stage 2's labels are recorded but before its checkpoint; the resumed run reuses them."""
    # bit-for-bit replay is what the CPU guarantees; on CUDA cuDNN's default kernels differ in the last bits (H100)
    from safetensors.torch import load_file

    full = run_srr(request(tiny_npz, tmp_path / "full", *PER_LABEL, *REPRODUCIBLE, "budget.epsilon=1",
                           "run.device=cpu")).summary
    draws = []
    real_release, real_stats = srr_mod.release_labels, srr_mod.label_stats

    def counting_release(*args, **kwargs):
        draws.append(1)
        return real_release(*args, **kwargs)

    def failing_stats(i, *args, **kwargs):
        if i == 1:
            raise _Interrupt
        return real_stats(i, *args, **kwargs)

    monkeypatch.setattr(srr_mod, "release_labels", counting_release)
    monkeypatch.setattr(srr_mod, "label_stats", failing_stats)
    with pytest.raises(_Interrupt):
        run_srr(request(tiny_npz, tmp_path / "cut", *PER_LABEL, *REPRODUCIBLE, "budget.epsilon=1", "run.device=cpu"))
    assert len(draws) == 2 and PrivacyLedger(tmp_path / "cut", accounting="paper").keys() == ["stage-1", "stage-2"]
    monkeypatch.setattr(srr_mod, "label_stats", real_stats)
    req = request(tiny_npz, tmp_path / "cut", *PER_LABEL, *REPRODUCIBLE, "budget.epsilon=1", "run.device=cpu")
    req.resume = True
    resumed = run_srr(req).summary
    assert len(draws) == 4, "stage 2's labels were drawn again on resume"
    a, b = load_file(tmp_path / "full" / "student.safetensors"), load_file(tmp_path / "cut" / "student.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["test_accuracy"] == full["test_accuracy"]
    la, lb = (PrivacyLedger(tmp_path / d, accounting="paper") for d in ("full", "cut"))
    # the spends only: opening a ledger without the run's max_epsilon records a config line
    assert [r["answers"] for r in la.records() if r["kind"] == "spend"] == \
        [r["answers"] for r in lb.records() if r["kind"] == "spend"]


@pytest.mark.slow
def test_sigkilled_cli_run_resumes_to_the_same_result(tiny_npz, tmp_path, cache):
    from safetensors.torch import load_file

    args = ["srr", "--dataset", f"npz:{tiny_npz}", "-e", "1", "--accounting", "paper"]
    for item in TINY + REPRODUCIBLE + ["srr.stages=8", "srr.num_samples=240", "run.device=cpu"]:  # exact replay
        args += ["--set", item]
    env = {**os.environ, "PRIVDISTILL_NO_PROGRESS": "1"}
    cli_in_process(args + ["--run-dir", str(tmp_path / "full")], env)  # only the killed run needs a process
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "privdistill", *args, "--run-dir", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = killed / "srr-checkpoint.pt"
    deadline = time.time() + 240
    while time.time() < deadline:
        try:
            if ckpt.exists() and torch.load(ckpt, weights_only=False)["step"] >= 2:
                break
        except Exception:  # noqa: BLE001 - read while being replaced
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stage = torch.load(ckpt, weights_only=False)["step"]
    assert 2 <= stage < 8, f"killed at stage {stage}, not mid-run"
    recorded = PrivacyLedger(killed, accounting="paper").records()
    cli_in_process(args + ["--run-dir", str(killed), "--resume"], env)
    after = PrivacyLedger(killed, accounting="paper").records()
    assert after[:len(recorded)] == recorded and len([r for r in after if r["kind"] == "spend"]) == 8
    a, b = load_file(tmp_path / "full" / "student.safetensors"), load_file(killed / "student.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed student differs from the uninterrupted run"


def test_cli_refuses_over_budget_with_a_clear_error(tiny_npz, tmp_path, cache):
    from typer.testing import CliRunner

    from privdistill.cli import get_app

    args = ["srr", "--dataset", f"npz:{tiny_npz}", "-e", "20", "--max-epsilon", "10", "--accounting", "strict",
            "--run-dir", str(tmp_path / "r")]
    for item in TINY:
        args += ["--set", item]
    # in this process: the command line's own handler prints such an error in one line, exit status 2
    # (tests/test_cli.py, test_user_errors_print_one_line_and_exit_2, runs it in a process of its own)
    out = CliRunner().invoke(get_app(), args)
    assert isinstance(out.exception, BudgetExceededError) and "max-epsilon" in str(out.exception)
    assert not (tmp_path / "r" / "student.safetensors").exists()


def test_python_api_returns_the_released_models_and_report(tiny_npz, tmp_path, cache):
    from privdistill.methods import SRR

    released = SRR(epsilon=1, accounting="paper", overrides=TINY, run_dir=str(tmp_path / "api")).fit(f"npz:{tiny_npz}")
    assert released.summary["epsilon_paper"] == 1 and released.summary["setting"] == "data-free"
    assert released.student(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert released.generator is None, "fitted to the non-private teacher: kept in the run directory, not released"
    assert {"student", "generator"} <= set(released.privacy["artifacts"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rr_with_prior_runs_on_cuda_tensors_with_a_cpu_generator():
    prior = torch.softmax(torch.randn(64, 10), dim=1).cuda()
    labels = torch.randint(0, 10, (64,)).cuda()
    out = release_labels("rr-prior", prior, labels, epsilon=1.0, threshold=None,
                         generator=torch.Generator().manual_seed(0))
    assert out.device.type == "cuda" and out.shape == (64,)


@pytest.mark.parametrize("mechanism", ["srr", "rr"])
def test_secure_noise_draws_every_label_from_opendp(tiny_npz, tmp_path, cache, secure_draws, mechanism):
    summary = run_srr(request(tiny_npz, tmp_path / "run", "srr.setting=label-dp", f"srr.mechanism={mechanism}",
                              *PER_LABEL, "budget.epsilon=2", "srr.num_samples=0", "srr.stages=2",
                              "srr.epochs_per_stage=1", "srr.student_model=small-cnn",
                              "srr.secure_noise=true")).summary
    assert summary["noise_secure"] is True and summary["epsilon_strict"] == pytest.approx(2.0, abs=1e-4)
    # every one of the 300 labels came out of OpenDP's randomized response, each exactly once
    assert [kind for kind, _ in secure_draws] == ["rr"] * len(secure_draws)
    assert sum(n for _, n in secure_draws) == 300


def test_fit_takes_arrays_and_torch_datasets(tiny_npz, tmp_path, cache):
    import numpy as np

    from privdistill.methods.srr import SRR

    arrays = np.load(tiny_npz)
    x, y = arrays["x"], arrays["y"]
    options = dict(setting="label-dp", epsilon=2, accounting="paper",
                   overrides=TINY + ["srr.num_samples=0", "srr.stages=1", "srr.student_model=small-cnn"])
    from_arrays = SRR(run_dir=str(tmp_path / "a"), **options).fit(x, y).summary
    assert from_arrays["dataset"].startswith("arrays:sha256-") and from_arrays["num_labels"] == 270  # 10 % held out
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    from_dataset = SRR(run_dir=str(tmp_path / "b"), **options).fit(dataset).summary
    assert from_dataset["dataset"] == from_arrays["dataset"], "the same data: the same name (and cached stages)"
    with pytest.raises(DataError, match="labels"):
        SRR(run_dir=str(tmp_path / "c"), **options).fit(x)


E2E = ["budget.privacy=end-to-end", "budget.epsilon=4", "dp_source.model=scatter-linear", "dp_source.epochs=2",
       "dp_source.batch_size=64", "dp_source.statistics_share=0.25"]


def test_srr_refuses_what_end_to_end_cannot_cover_before_training(tiny_npz, tmp_path, cache):
    with pytest.raises(ConfigError, match="protects labels only"):
        run_srr(request(tiny_npz, tmp_path / "a", "srr.setting=label-dp", "budget.privacy=end-to-end",
                        "budget.epsilon=2"))
    with pytest.raises(ConfigError, match="statistics_share"):  # a DP teacher has no BN statistics to match
        run_srr(request(tiny_npz, tmp_path / "b", "budget.privacy=end-to-end", "budget.epsilon=2",
                        "dp_source.statistics_share=0"))
    with pytest.raises(ConfigError, match="srr.loss=ce"):
        run_srr(request(tiny_npz, tmp_path / "c", *E2E, "srr.loss=likelihood"))
    with pytest.raises(ConfigError, match="only a DP teacher"):  # the softmax of a non-private teacher: refused
        run_srr(request(tiny_npz, tmp_path / "c2", "srr.loss=soft"))
    with pytest.raises(ConfigError, match="augment_copies"):  # copies of what? refused before the source trains
        run_srr(request(tiny_npz, tmp_path / "d", *E2E, "dp_source.augment_copies=4"))
    with pytest.raises(ConfigError, match="student_data=stage"):  # earlier stages' labels are not kept
        run_srr(request(tiny_npz, tmp_path / "e", *E2E, "srr.student_data=cumulative"))
    with pytest.raises(ConfigError, match="ScatterNet DP teacher"):  # its statistics are of scattering features
        run_srr(request(tiny_npz, tmp_path / "f", *E2E, "dp_source.model=small-cnn"))
    with pytest.raises(ConfigError, match="epochs and batch_size"):
        run_srr(request(tiny_npz, tmp_path / "g", *E2E, "dp_source.epochs=0"))
    assert not list(cache.glob("baseline-*")), "refused before anything trained"


@pytest.mark.slow
def test_data_free_srr_end_to_end_covers_everything_within_the_target(tiny_npz, tmp_path, cache):
    """The teacher is a DP-SGD model trained in the run and the generator matches DP feature statistics: the two
    events are the ledger's only ones, their composition is the run's ε (within the target), nothing is left
    uncovered, and the labels are the DP teacher's own (no mechanism); a resumed run spends nothing more."""
    from privdistill.privacy import both
    from privdistill.privacy.ledger import PrivacyLedger

    run_dir = tmp_path / "e2e"
    s = run_srr(request(tiny_npz, run_dir, *E2E, "srr.stages=2")).summary
    assert s["not_covered"] == [] and s["privacy_scope"] == "end-to-end"
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert all(p["covered"] for art in privacy["artifacts"].values() for p in art), "generator covered too"
    ledger = PrivacyLedger(run_dir)
    assert sorted(ledger.keys()) == ["dp-source", "dp-source/statistics"]
    events = ledger.events()
    total = both(events, delta=1e-5)["strict"].value
    assert s["epsilon_strict"] == pytest.approx(total, rel=1e-6) and total <= 4 + 1e-9, "one ε, within the target"
    statistics = [e for e in events if e.sample_rate == 1.0]
    assert len(statistics) == 1 and statistics[0].delta == pytest.approx(0.25e-5)
    source = json.loads((run_dir / "dp-source" / "summary.json").read_text())
    assert source["epsilon_strict"] <= 3 + 1e-6, "the teacher gets the rest: 3 of 4"
    assert s["label_accuracy_vs_teacher"] == 1.0 and s["mechanism"].startswith("none"), "the DP teacher's labels"
    # resumed through the CLI: nothing more is spent, and the console says what the ε covers
    from typer.testing import CliRunner

    from privdistill.cli import get_app

    args = ["srr", "-d", f"npz:{tiny_npz}", "--run-dir", str(run_dir), "--resume"]
    for item in TINY + E2E + ["srr.stages=2"]:
        args += ["--set", item]
    result = CliRunner().invoke(get_app(), args)
    assert result.exit_code == 0, result.output
    assert "from the DP teacher" in result.output and "DP feature statistics" in " ".join(result.output.split())
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["epsilon_strict"] == pytest.approx(s["epsilon_strict"]) and len(PrivacyLedger(run_dir).keys()) == 2


@pytest.mark.slow
def test_data_free_srr_end_to_end_soft_fits_the_dp_teacher_s_softmax(tiny_npz, tmp_path, cache):
    """srr.loss=soft end to end: the student trains on the DP teacher's answers on each stage's samples, and the
    ledger holds the same two events (the softmax is post-processing: nothing more is spent)."""
    from privdistill.privacy.ledger import PrivacyLedger

    s = run_srr(request(tiny_npz, tmp_path / "soft", *E2E, "srr.stages=2", "srr.loss=soft")).summary
    assert s["not_covered"] == [] and s["config"]["loss"] == "soft" and math.isfinite(s["history"][-1]["train_loss"])
    assert sorted(PrivacyLedger(tmp_path / "soft").keys()) == ["dp-source", "dp-source/statistics"]


def test_feature_statistics_are_the_data_s_up_to_the_noise():
    """gaussian_feature_statistics: without noise (a tiny multiplier) the mean and variance of GroupNorm-like
    features (norm sqrt(d)) come back; with noise they move by about z * sqrt(2 d) / n on the mean."""
    from privdistill.privacy.mechanisms import gaussian_feature_statistics

    g = torch.Generator().manual_seed(0)
    n, d = 4000, 50
    x = torch.randn(n, d, generator=g) * torch.linspace(0.5, 1.5, d) + torch.linspace(-1, 1, d)
    x = (x - x.mean(1, keepdim=True)) / x.std(1, unbiased=False, keepdim=True)  # per-example norm sqrt(d)
    mean, var = gaussian_feature_statistics(x, noise_multiplier=1e-6, generator=torch.Generator().manual_seed(1),
                                            square_clip=1.0)
    assert torch.allclose(mean, x.mean(0), atol=1e-4) and torch.allclose(var, x.var(0, unbiased=False), atol=1e-3)
    noisy, _ = gaussian_feature_statistics(x, noise_multiplier=20.0, generator=torch.Generator().manual_seed(1))
    error = (noisy - x.mean(0)).abs().mean()
    assert 0.2 * 20 * (2 * d) ** 0.5 / n < error < 3 * 20 * (2 * d) ** 0.5 / n
    with pytest.raises(PrivacyError):
        gaussian_feature_statistics(x[0], noise_multiplier=1.0, generator=g)


def test_the_delta_split_never_rounds_above_delta():
    from privdistill.methods.end_to_end import split_delta

    for delta in (1e-5, 3e-6, 7e-7, 1e-6):
        for share in (0.8, 0.2, 0.75, 0.5, 0.9, 0.1, 0.999):
            a, b = split_delta(delta, share)
            assert a + b <= delta and a == pytest.approx(delta * share) and b > 0
    assert 1e-5 * 0.8 + 1e-5 * 0.2 > 1e-5, "what the naive split does"


def test_student_average_is_the_prior_and_the_release_at_the_same_epsilon(tiny_npz, tmp_path, cache, monkeypatch):
    """srr.student_ema: the average of the student's weights is every later stage's prior and the released model;
    it reads only released labels, so the spend is the plain run's."""
    from safetensors.torch import load_file

    args = ("srr.setting=label-dp", *PER_LABEL, "budget.epsilon=2", "srr.num_samples=0", "srr.stages=2",
            "srr.student_model=small-cnn", "srr.lr=0.003", "run.device=cpu")
    priors = []
    real_prior = srr_mod.stage_prior

    def recording_prior(srr, i, images):
        prior = real_prior(srr, i, images)
        if i > 0:  # the model the prior was read from must be the released one (the average when set)
            priors.append((srr.released is not srr.student, srr.average is not None))
        return prior

    monkeypatch.setattr(srr_mod, "stage_prior", recording_prior)
    plain = run_srr(request(tiny_npz, tmp_path / "plain", *args)).summary
    averaged = run_srr(request(tiny_npz, tmp_path / "ema", *args, "srr.student_ema=0.9")).summary
    assert priors == [(False, False), (True, True)]
    assert averaged["epsilon_strict"] == plain["epsilon_strict"] and averaged["config"]["student_ema"] == 0.9
    a, b = load_file(tmp_path / "plain" / "student.safetensors"), load_file(tmp_path / "ema" / "student.safetensors")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    assert averaged["test_accuracy"] > 0.3
    with pytest.raises(ConfigError, match="student_ema"):
        SRRConfig(student_ema=1.0).validate()


def test_soft_student_loss_is_the_cross_entropy_to_the_teacher_s_softmax():
    """srr.loss=soft (end to end): the student fits the DP teacher's whole answer; its loss is smallest, among
    students, at the teacher's own distribution, where hard labels would push it to the argmax."""
    from privdistill.methods.srr_training import SRRTraining

    teacher = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    at_teacher = SRRTraining.student_loss(teacher.log(), teacher, soft=True)
    assert at_teacher == pytest.approx(float(-(teacher * teacher.log()).sum(1).mean()), rel=1e-5)
    sharper = torch.tensor([[0.9, 0.05, 0.05], [0.05, 0.05, 0.9]])
    assert SRRTraining.student_loss(sharper.log(), teacher, soft=True) > at_teacher
    assert SRRTraining.student_loss(sharper.log(), teacher.argmax(1)) < SRRTraining.student_loss(
        teacher.log(), teacher.argmax(1)), "hard labels prefer the sharper student"
