"""Issue 6: DPDFD (losses, per-sample logit gradients, the mechanism, planning T, end-to-end runs, resume)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.func import grad, vmap
from typer.testing import CliRunner

from cli_run import cli_in_process
from privdistill.cli import get_app
from privdistill.engine.run import RunDir
from privdistill.errors import BudgetExceededError, ConfigError
from privdistill.methods.common import RunRequest
from privdistill.methods.dkd import _dkd_one, logit_gradients, student_loss
from privdistill.methods.dpdfd import run_dpdfd
from privdistill.methods.dpdfd_plan import DPDFDConfig, auto_variant, check_budget, plan_steps
from privdistill.methods.runner import Budget
from privdistill.privacy import both
from privdistill.privacy.events import NormalisedGaussian
from privdistill.privacy.mechanisms import clip_and_noise, make_generator, normalize_and_noise, privatise

# A DPDFD run small enough for a test: small CNNs, a narrow generator, B = 32; the paper's accounting, asked
# for explicitly (the budget's default is strict).
TINY = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
        "budget.accounting=paper",
        "baseline.model=small-cnn", "baseline.epochs=3", "baseline.batch_size=32", "baseline.lr=0.003",
        "run.precision=fp32", "run.progress=false", "run.threads=1",
        "dpdfd.batch_size=32", "dpdfd.student_model=small-cnn", "dpdfd.eval_every=10", "dpdfd.checkpoint_every=4",
        "dpdfd.ledger_chunk=7", "dpdfd.student_lr=0.003", "dpdfd.max_steps=0", "dpdfd.calibrate_sigma=false",
        "dpdfd_generator.width=16", "dpdfd_generator.rounds=3", "dpdfd_generator.steps_per_round=10",
        "dpdfd_generator.batch_size=32", "dpdfd_generator.lr=0.02",
        "dpdfd_teachers.num_teachers=3", "dpdfd_teachers.model=small-cnn", "dpdfd_teachers.steps=40",
        "dpdfd_teachers.batch_size=16"]


@pytest.fixture
def cache(tmp_path_factory, monkeypatch):
    """One stage cache for the whole module: the tiny baseline is trained once."""
    root = tmp_path_factory.getbasetemp() / "dpdfd-cache"
    monkeypatch.setenv("PRIVDISTILL_CACHE", str(root))
    return root


def run(tiny_npz, path, *extra, record=False, results=None, resume=False):
    req = RunRequest(dataset=f"npz:{tiny_npz}", preset="quick", overrides=TINY + list(extra), run_dir=str(path),
                     record=record, results_dir=str(results or path.parent / "results"), resume=resume)
    return run_dpdfd(req).summary


# ---------------------------------------------------------------------------------- losses, gradients
def teacher_loss(s: torch.Tensor, t: torch.Tensor, *, temperature: float = 4.0, alpha: float = 1.0,
                 beta: float = 8.0) -> torch.Tensor:
    """Per-sample DKD loss L_T: student [B, K], teacher [B, K] -> [B] (the reference the gradients are checked on)."""
    return vmap(_dkd_one, in_dims=(0, 0, None, None, None))(s.float(), t.float(), temperature, alpha, beta)


def test_per_sample_logit_gradients_equal_autograd_and_vmap():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(6, 10, generator=g, requires_grad=True)
    t = torch.randn(6, 10, generator=g) * 3
    fast = logit_gradients(s, t, temperature=2.0)
    (by_sum,) = torch.autograd.grad(teacher_loss(s, t, temperature=2.0).sum(), s)
    one = lambda si, ti: teacher_loss(si[None], ti[None], temperature=2.0)[0]  # noqa: E731
    by_vmap = vmap(grad(one))(s.detach(), t)
    assert torch.allclose(fast, by_sum, atol=1e-6) and torch.allclose(fast, by_vmap, atol=1e-6)
    # multi-teacher: [n, B, K] against the same student logits
    tt = torch.randn(3, 6, 10, generator=g)
    multi = logit_gradients(s, tt, temperature=2.0)
    assert multi.shape == (3, 6, 10)
    assert torch.allclose(multi[1], logit_gradients(s, tt[1], temperature=2.0), atol=1e-6)


def test_dkd_matches_the_reference_formula():
    """DKD (Zhao et al. 2022, their dkd_loss with the teacher's argmax as target), written out by hand."""
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g) * 2
    T, a, b = 3.0, 1.0, 8.0
    target = t.argmax(1)
    gt = torch.nn.functional.one_hot(target, 4).float()
    ps, pt = torch.softmax(s / T, 1), torch.softmax(t / T, 1)
    bs = torch.stack([(ps * gt).sum(1), (ps * (1 - gt)).sum(1)], 1)
    bt = torch.stack([(pt * gt).sum(1), (pt * (1 - gt)).sum(1)], 1)
    tckd = (bt * (bt.log() - bs.log())).sum(1) * T**2
    nt_s = torch.log_softmax(s / T - 1000 * gt, 1)
    nt_t = torch.softmax(t / T - 1000 * gt, 1)
    nckd = (nt_t * (torch.log(nt_t.clamp_min(1e-12)) - nt_s)).sum(1) * T**2
    assert torch.allclose(teacher_loss(s, t, temperature=T, alpha=a, beta=b), a * tckd + b * nckd,
                          atol=1e-5)


def test_l2_student_loss_backpropagates_exactly_gamma_times_the_noisy_gradient():
    draw = torch.Generator().manual_seed(0)
    s = torch.randn(8, 10, generator=draw).requires_grad_(True)
    noisy = torch.randn(8, 10, generator=draw) * 1e-3
    gamma = 0.7
    loss = student_loss(s, s.detach(), gamma * noisy)
    (g,) = torch.autograd.grad(loss, s)
    assert torch.equal(g, gamma * noisy)
    naive = 0.5 * (s - (s.detach() - gamma * noisy)).pow(2).sum()  # forming y_s first rounds g~ away
    assert math.isclose(float(loss.detach()), float(naive.detach()), rel_tol=1e-2)


def test_mechanism_normalise_matches_privacy_module_and_clip_bounds_norms():
    grads = torch.randn(16, 10) * torch.logspace(-4, 1, 16)[:, None]
    cfg = DPDFDConfig()
    a = privatise(grads, operation=cfg.operation, clip_norm=1e-3, sigma=100.0, stability=cfg.stability,
                  granularity="per_sample", generator=make_generator(3))
    b = normalize_and_noise(grads, clip_norm=1e-3, sigma=100.0, stability=1e-4, generator=make_generator(3))
    assert torch.equal(a, b)
    # clipping: tiny gradients keep their size, big ones are cut to C; with negligible noise we see them
    out = clip_and_noise(grads, clip_norm=0.1, sigma=1e-9, generator=make_generator(0)) * 16
    norms = out.norm(dim=1)
    small = grads.norm(dim=1) < 0.1
    assert torch.allclose(norms[small], grads.norm(dim=1)[small], rtol=1e-5)
    assert torch.allclose(norms[~small], torch.full_like(norms[~small], 0.1), rtol=1e-5)
    multi = privatise(torch.randn(3, 16, 10), operation="clip", clip_norm=0.1, sigma=1.0, stability=1e-4,
                      granularity="per_sample", generator=make_generator(1))
    assert multi.shape == (16, 10)


# --------------------------------------------------------------------------------------- planning T
def test_plan_reproduces_the_budget_table_and_the_strict_limits():
    paper = plan_steps(DPDFDConfig(), Budget(epsilon=1, accounting="paper"))
    assert (paper.clip_norm, paper.steps) == (1e-3, 596_808)
    paper10 = plan_steps(DPDFDConfig(), Budget(epsilon=10, accounting="paper"))
    assert (paper10.clip_norm, paper10.steps) == (5e-3, 1_392_730)
    assert plan_steps(DPDFDConfig(), Budget(epsilon=10, accounting="strict")).steps == 34
    none = plan_steps(DPDFDConfig(), Budget(epsilon=1, accounting="strict"))
    assert none.steps == 0 and "no training possible" in none.notes[0]
    capped = plan_steps(DPDFDConfig(max_steps=500), Budget(epsilon=10, accounting="paper"))
    assert capped.steps == 500 and "capped" in capped.notes[0]
    assert plan_steps(DPDFDConfig(algorithm=3), Budget(epsilon=10, accounting="strict"), dataset_size=60000).steps == 0


def test_calibrated_sigma_spends_the_target_in_the_capped_steps():
    cfg = DPDFDConfig(max_steps=3000, calibrate_sigma=True)
    plan = plan_steps(cfg, Budget(epsilon=10, accounting="paper"), num_classes=10)
    assert plan.steps == 3000 and 1 < plan.sigma < 100
    eps = both([plan.event], delta=1e-5)
    assert 9.99 < eps["paper"].value <= 10.0
    assert both([plan.event.with_count(3050)], delta=1e-5)["paper"].value > 10, "the budget is spent, not exceeded"


def test_config_errors():
    with pytest.raises(ConfigError, match="calibrate_sigma"):
        check_budget(DPDFDConfig(calibrate_sigma=True), Budget(epsilon=10))
    with pytest.raises(ConfigError, match="epsilon"):
        check_budget(DPDFDConfig(), Budget(epsilon=None))
    with pytest.raises(ConfigError, match="operation"):
        DPDFDConfig(operation="cut").validate()
    assert auto_variant(DPDFDConfig(algorithm=2), "strict") == "multi-teacher-strict"
    assert auto_variant(DPDFDConfig(variant="ablation-no-ce")) == "ablation-no-ce"
    # a warm-started generator never records under the paper-literal cell's name
    warm = DPDFDConfig(generator_init="teacher", generator_every=0)
    assert auto_variant(warm, "paper") == "teacher-generator"
    assert auto_variant(DPDFDConfig(generator_init="teacher"), "paper") == "teacher-generator-alternating"
    assert auto_variant(DPDFDConfig(), "paper") is None


# ------------------------------------------------------------------------------------------ end to end
def test_run_records_a_chunked_ledger_and_both_epsilons(tiny_npz, tmp_path, cache):
    s = run(tiny_npz, tmp_path / "a", "budget.epsilon=null", "dpdfd.steps=20", "dpdfd.sigma=2", record=True)
    assert s["method"] == "dpdfd" and s["steps"] == 20 and s["algorithm"] == 1
    assert s["baseline_accuracy"] > 0.8 and 0.0 <= s["test_accuracy"] <= 1.0
    expected = both([NormalisedGaussian(clip_norm=5e-3, sigma=2, batch_size=32, steps=20, num_classes=10)], delta=1e-5)
    assert math.isclose(s["epsilon_paper"], expected["paper"].value, rel_tol=1e-5)
    assert math.isclose(s["epsilon_strict"], expected["strict"].value, rel_tol=1e-5)
    lines = [json.loads(x) for x in (tmp_path / "a" / "ledger.jsonl").read_text().splitlines()]
    spends = [x for x in lines if x["kind"] == "spend"]
    assert [x["event"]["steps"] for x in spends] == [7, 7, 6], "one record per chunk of 7 steps"
    assert not (tmp_path / "a" / "ledger_answers").exists(), "the ledger stays small (seeds inline)"
    privacy = json.loads((tmp_path / "a" / "privacy.json").read_text())
    assert all(p["covered"] for art in privacy["artifacts"].values() for p in art)
    assert "post-processing" in s["privacy"]
    for name in ("student.safetensors", "generator.safetensors", "summary.json"):
        assert (tmp_path / "a" / name).exists()
    recorded = json.loads((tmp_path / "results" / "quick" / "dpdfd-npz-tiny.json").read_text())
    assert recorded["test_accuracy"] == s["test_accuracy"]


def test_generator_output_norm_is_set_per_dataset_and_reaches_the_generator(tiny_npz, tmp_path, cache):
    """DAFL's output BatchNorm is on for Fashion-MNIST only (it fixes the collapse there and hurts MNIST)."""
    from privdistill.config import resolve_sections

    for preset in ("quick", "paper"):
        by = {d: resolve_sections({"dpdfd": DPDFDConfig}, preset=preset, dataset=d)["dpdfd"]
              for d in ("fashion-mnist", "mnist")}
        assert by["fashion-mnist"].generator_output_norm and not by["mnist"].generator_output_norm, preset
    run(tiny_npz, tmp_path / "n", "budget.epsilon=null", "dpdfd.steps=3", "dpdfd.sigma=2",
        "dpdfd.generator_output_norm=true")
    assert RunDir.existing(tmp_path / "n").load_weights("generator").output_norm is not None
    run(tiny_npz, tmp_path / "p", "budget.epsilon=null", "dpdfd.steps=3", "dpdfd.sigma=2")
    assert RunDir.existing(tmp_path / "p").load_weights("generator").output_norm is None


def test_warm_started_generator_learns_and_is_reported_not_covered(tiny_npz, tmp_path, cache):
    s = run(tiny_npz, tmp_path / "w", "budget.epsilon=null", "dpdfd.steps=30", "dpdfd.sigma=0.5",
            "dpdfd.generator_init=teacher")
    assert s["test_accuracy"] > 0.6, "the student learns the fabricated task through the noisy gradients"
    privacy = json.loads((tmp_path / "w" / "privacy.json").read_text())
    assert not all(p["covered"] for p in privacy["artifacts"]["generator"])
    assert s["privacy"].startswith("NOT DP")


def test_a_frozen_warm_generator_is_the_cached_stage_unchanged(tiny_npz, tmp_path, cache):
    """generator_every=0 (the teacher-generator recipe): the student learns through the noisy channel while the
    warm generator stays exactly the cached stage's, and the run records under its own variant name."""
    from safetensors.torch import load_file

    s = run(tiny_npz, tmp_path / "f", "budget.epsilon=null", "dpdfd.steps=30", "dpdfd.sigma=0.5",
            "dpdfd.generator_init=teacher", "dpdfd.generator_every=0")
    assert s["test_accuracy"] > 0.6 and s["variant"] == "teacher-generator" and s["privacy"].startswith("NOT DP")
    [stage] = [ref["path"] for ref in s["stages"] if ref["stage"] == "generator"]  # the stage this run read
    fitted = load_file(Path(stage) / "generator.safetensors")
    released = load_file(tmp_path / "f" / "generator.safetensors")
    weights = [k for k in fitted if "running" not in k and "num_batches" not in k]  # BN buffers move in train mode
    assert weights and all(torch.equal(fitted[k], released[k]) for k in weights)


def test_the_teacher_generator_recipe_trains_srrs_teacher_and_generator_once():
    """`--recipe teacher-generator` gives DPDFD exactly SRR's quick teacher and generator (the same settings, so
    the same cache keys): one dataset's SRR and DPDFD cells share both stages."""
    from privdistill.config import ClassifierTraining, keyed_config, resolve_sections
    from privdistill.engine.datafree import GeneratorTraining
    from privdistill.recipes import recipe_layers

    sections = {"baseline": ClassifierTraining, "srr_teacher": ClassifierTraining, "dpdfd": DPDFDConfig,
                "dpdfd_generator": GeneratorTraining, "srr_generator": GeneratorTraining}
    for dataset in ("mnist", "fashion-mnist"):
        srr = resolve_sections(sections, preset="quick", dataset=dataset)
        warm = resolve_sections(sections, preset="quick", dataset=dataset,
                                recipe=recipe_layers("dpdfd", "teacher-generator", dataset, 10))
        assert keyed_config(warm["baseline"]) == keyed_config(srr["srr_teacher"]), dataset
        assert keyed_config(warm["dpdfd_generator"]) == keyed_config(srr["srr_generator"]), dataset
        assert warm["dpdfd"].generator_init == "teacher" and warm["dpdfd"].generator_every == 0
        assert srr["dpdfd"].generator_init == "scratch", "the paper-literal cell keeps its generator"


def test_direct_training_learns_and_is_not_dp_under_strict(tiny_npz, tmp_path, cache):
    s = run(tiny_npz, tmp_path / "d", "dpdfd.algorithm=3", "budget.epsilon=null", "dpdfd.steps=40", "dpdfd.sigma=0.5",
            "dpdfd.batch_size=64")
    assert s["test_accuracy"] > 0.8 and s["epsilon_strict"] == "inf" and s["variant"] == "direct"
    privacy = json.loads((tmp_path / "d" / "privacy.json").read_text())
    assert [p["covered"] for p in privacy["artifacts"]["student"]] == [True, False]
    assert s["not_covered"] == [privacy["artifacts"]["student"][1]["via"]], "the summary names it too"


def test_multi_teacher_and_budget_refusals(tiny_npz, tmp_path, cache):
    s = run(tiny_npz, tmp_path / "m", "dpdfd.algorithm=2", "budget.epsilon=null", "dpdfd.steps=8", "dpdfd.sigma=1")
    assert s["num_teachers"] == 3 and s["variant"] == "multi-teacher" and s["steps"] == 8
    # refuse to start: the planned steps exceed --max-epsilon
    baselines = set(cache.glob("*/baseline-*")) | set(cache.glob("baseline-*"))
    with pytest.raises(BudgetExceededError, match="max-epsilon"):
        run(tiny_npz, tmp_path / "over", "budget.epsilon=null", "dpdfd.steps=10", "dpdfd.sigma=1",
            "budget.max_epsilon=0.01", "baseline.epochs=3")  # a teacher config not trained yet
    assert set(cache.glob("*/baseline-*")) | set(cache.glob("baseline-*")) == baselines, \
        "refused before the teacher was trained"
    # strict accounting at epsilon 1: the budget allows no step; the untrained student is reported
    s0 = run(tiny_npz, tmp_path / "z", "budget.epsilon=1", "budget.accounting=strict", "dpdfd.batch_size=256")
    assert s0["steps"] == 0 and s0["epsilon_strict"] == 0 and s0["variant"] == "strict"
    assert any("no training possible" in n for n in s0["plan_notes"])


def _cli(*args):
    env = {**os.environ, "PRIVDISTILL_NO_PROGRESS": "1"}
    return [sys.executable, "-m", "privdistill", *args], env


@pytest.mark.slow
def test_student_weight_average_is_released_and_the_last_iterate_is_reported_beside_it(tiny_npz, tmp_path, cache):
    from safetensors.torch import load_file

    common = ("budget.epsilon=null", "dpdfd.steps=20", "dpdfd.sigma=2", "dpdfd.eval_every=10", "run.noise=reproducible")
    plain = run(tiny_npz, tmp_path / "plain", *common)
    averaged = run(tiny_npz, tmp_path / "ema", *common, "dpdfd.student_ema=0.9")
    assert averaged["epsilon_strict"] == plain["epsilon_strict"], "the average is post-processing: no extra ε"
    last = [h for h in averaged["history"] if "last_iterate_accuracy" in h]
    assert last and "last_iterate_accuracy" not in json.dumps(plain["history"])
    # the same seed and noise: the last iterate is the plain run's student, and the average is something else
    assert last[-1]["last_iterate_accuracy"] == pytest.approx(plain["test_accuracy"], abs=1e-4)
    a, b = load_file(tmp_path / "plain" / "student.safetensors"), load_file(tmp_path / "ema" / "student.safetensors")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(Exception, match="student_ema"):
        run(tiny_npz, tmp_path / "bad", *common, "dpdfd.student_ema=1")


@pytest.mark.slow
def test_sigkilled_run_resumes_to_the_same_result_without_respending(tiny_npz, tmp_path, cache):
    from safetensors.torch import load_file

    # with the weight average on, so that the released average survives the kill as well as the student
    args = ["dpdfd", "--dataset", f"npz:{tiny_npz}", "--seed", "4", "--steps", "60", "--set", "budget.epsilon=null",
            "--set", "dpdfd.sigma=2", "--set", "dpdfd.student_ema=0.9"] + [a for kv in TINY for a in ("--set", kv)]
    cmd, env = _cli(*args, "--run-dir", str(tmp_path / "full"))
    cli_in_process(cmd[3:], env)  # only the killed run needs a process of its own
    cmd, env = _cli(*args, "--run-dir", str(tmp_path / "killed"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = tmp_path / "killed" / "dpdfd-checkpoint.pt"
    deadline = time.time() + 240
    while time.time() < deadline:
        try:
            if ckpt.exists() and torch.load(ckpt, weights_only=False)["step"] >= 12:
                break
        except Exception:  # noqa: BLE001 - being replaced while we read it
            pass
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = torch.load(ckpt, weights_only=False)["step"]
    assert 12 <= killed_at < 60 and not (tmp_path / "killed" / "summary.json").exists()
    cmd, env = _cli(*args, "--run-dir", str(tmp_path / "killed"), "--resume")
    cli_in_process(cmd[3:], env)
    for name in ("student", "generator"):
        a = load_file(tmp_path / "full" / f"{name}.safetensors")
        b = load_file(tmp_path / "killed" / f"{name}.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), f"resumed {name} differs from the uninterrupted run"
    full = json.loads((tmp_path / "full" / "summary.json").read_text())
    resumed = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert resumed["test_accuracy"] == full["test_accuracy"]
    assert resumed["epsilon_paper"] == full["epsilon_paper"] and resumed["epsilon_strict"] == full["epsilon_strict"]
    keys = lambda p: [json.loads(x).get("key") for x in (p / "ledger.jsonl").read_text().splitlines()]  # noqa: E731
    assert [k for k in keys(tmp_path / "killed") if k] == [k for k in keys(tmp_path / "full") if k], \
        "the resumed run reused the recorded chunks: same spends, none twice"


def test_cli_help_and_one_line_errors(tiny_npz, tmp_path, cache):
    result = CliRunner().invoke(get_app(), ["dpdfd", "--help"])
    assert result.exit_code == 0 and "--accounting" in result.output and "--teacher" in result.output
    cmd, env = _cli("dpdfd", "--dataset", f"npz:{tiny_npz}", "--set", "dpdfd.operation=cut",
                    "--run-dir", str(tmp_path / "x"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode == 2 and "operation must be normalize or clip" in proc.stderr
            and "Traceback" not in proc.stderr)


def test_python_api_distils_an_in_memory_teacher(tiny_npz, tmp_path, cache):
    from privdistill.methods import DPDFD
    from privdistill.models import create_model

    torch.manual_seed(0)
    teacher = create_model("small-cnn").train()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    api = DPDFD(teacher=teacher, steps=6, sigma=1, overrides=TINY + ["budget.epsilon=null"],
                run_dir=str(tmp_path / "api"))
    with pytest.raises(ConfigError, match="needs the private dataset"):
        api.fit()
    # an untrained teacher is at chance: refused before any step, naming the input scale it is fed (TINY warns)
    refusing = DPDFD(teacher=teacher, steps=6, sigma=1, run_dir=str(tmp_path / "refused"),
                     overrides=TINY + ["budget.epsilon=null", "run.plan_check=refuse"])
    with pytest.raises(ConfigError, match=r"at chance on the .*test images.*--teacher-range"):
        refusing.fit(f"npz:{tiny_npz}")
    with pytest.warns(UserWarning, match="at chance"):
        released = api.fit(f"npz:{tiny_npz}")
    assert released.summary["steps"] == 6 and released.summary["teacher"] == "in-memory PaperCNN"
    assert released.student(torch.zeros(2, 1, 28, 28)).shape == (2, 10) and released.generator is not None
    assert all(p["covered"] for art in released.privacy["artifacts"].values() for p in art)
    # the caller's model is left as it was (not moved, not switched to eval mode, weights untouched)
    assert teacher.training and all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())


def test_a_teacher_trained_on_another_pixel_range_is_fed_its_own():
    """TeacherSpec(input_range=(0, 1)) maps the [-1, 1] images this package feeds onto the teacher's [0, 1]."""
    from privdistill.engine.teachers import TeacherSpec, load_teacher

    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(x)
            return x.flatten(1)[:, :2]

    model, key = load_teacher(TeacherSpec(module=Probe(), input_range=(0, 1)), dataset="d", channels=1,
                              num_classes=2, device=torch.device("cpu"))
    model(torch.tensor([-1.0, 0.0, 1.0]).reshape(1, 1, 1, 3))
    assert seen[-1].flatten().tolist() == [0.0, 0.5, 1.0] and key.endswith("-inputs0,1")
    plain, plain_key = load_teacher(TeacherSpec(module=Probe()), dataset="d", channels=1, num_classes=2,
                                    device=torch.device("cpu"))
    assert plain_key != key


def test_unreadable_teacher_files_are_clear_errors(tmp_path):
    from privdistill.engine.teachers import TeacherSpec, load_teacher
    from privdistill.errors import ModelError

    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a pickle at all")
    for spec, message in [(TeacherSpec(module_file=str(junk)), "not a torch.save'd module"),
                          (TeacherSpec(torchvision="resnet18", weights=str(junk)), "not a torch state_dict")]:
        with pytest.raises(ModelError, match=message):
            load_teacher(spec, dataset="mnist", channels=1, num_classes=10, device=torch.device("cpu"))


def test_secure_noise_records_no_seed_and_a_resume_pays_for_what_it_redraws(tiny_npz, tmp_path, cache, secure_draws,
                                                                           monkeypatch):
    import privdistill.methods.dpdfd as dpdfd_mod

    args = ("budget.epsilon=null", "dpdfd.steps=20", "dpdfd.sigma=2", "dpdfd.secure_noise=true", "run.device=cpu")
    real_step = dpdfd_mod._datafree_step

    def crash_at_step_10(cfg, plan, env, student, opt_s, generator, opt_g, teacher, step, chunk_seed):
        if step == 10:
            raise KeyboardInterrupt("simulated crash inside the chunk of steps 7-13, after the step-8 checkpoint")
        return real_step(cfg, plan, env, student, opt_s, generator, opt_g, teacher, step, chunk_seed)

    monkeypatch.setattr(dpdfd_mod, "_datafree_step", crash_at_step_10)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_npz, tmp_path / "a", *args)
    assert len(secure_draws) == 10, "one OpenDP draw per step, steps 0-9"
    monkeypatch.setattr(dpdfd_mod, "_datafree_step", real_step)
    s = run(tiny_npz, tmp_path / "a", *args, resume=True)
    assert s["noise_secure"] is True and s["steps"] == 20 and len(secure_draws) == 10 + 12  # steps 8-19 redrawn
    spends = [json.loads(x) for x in (tmp_path / "a" / "ledger.jsonl").read_text().splitlines()]
    spends = [x for x in spends if x["kind"] == "spend"]
    assert all(x["answers"]["values"] == [-1] for x in spends), "no seed that could regenerate the noise is recorded"
    assert [(x["key"], x["event"]["steps"]) for x in spends] == [
        ("dpdfd-steps-000000000-000000007", 7), ("dpdfd-steps-000000007-000000014", 7),
        ("dpdfd-steps-000000007-000000014-redrawn-from-000000008-1", 6), ("dpdfd-steps-000000014-000000020", 6)]
    expected = both([NormalisedGaussian(clip_norm=5e-3, sigma=2, batch_size=32, steps=26, num_classes=10)], delta=1e-5)
    assert math.isclose(s["epsilon_strict"], expected["strict"].value, rel_tol=1e-5), "26 noisy steps paid for"


def test_end_to_end_mode_is_dpdfd_as_it_stands_and_refuses_what_it_cannot_cover(tiny_npz, tmp_path, cache):
    s = run(tiny_npz, tmp_path / "e2e", "budget.accounting=strict", "budget.privacy=end-to-end", "budget.epsilon=null",
            "dpdfd.steps=10", "dpdfd.sigma=200")
    assert s["not_covered"] == [] and s["privacy_scope"] == "end-to-end"
    for bad in (["dpdfd.generator_init=teacher"], ["dpdfd.algorithm=3"]):
        with pytest.raises(ConfigError, match="end-to-end"):
            run(tiny_npz, tmp_path / "refused", "budget.accounting=strict", "budget.privacy=end-to-end",
                "budget.epsilon=null", "dpdfd.steps=10", "dpdfd.sigma=200", *bad)
    with pytest.raises(ConfigError, match="accounting strict"):
        run(tiny_npz, tmp_path / "paper", "budget.privacy=end-to-end", "dpdfd.steps=10", "dpdfd.sigma=200")


def test_a_conditional_generators_classes_are_what_l_g_aims_at():
    from privdistill.methods.dkd import generator_loss

    logits, feats = torch.randn(8, 4), torch.randn(8, 16)
    targets = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    weights = {"one_hot_weight": 1.0, "entropy_weight": 0.0, "activation_weight": 0.0}
    aimed, _ = generator_loss(logits, feats, targets=targets, **weights)
    own, _ = generator_loss(logits, feats, **weights)
    assert aimed == pytest.approx(float(torch.nn.functional.cross_entropy(logits, targets)))
    assert own == pytest.approx(float(torch.nn.functional.cross_entropy(logits, logits.argmax(1))))


def test_a_class_absent_from_the_students_answers_takes_its_fair_share_of_l_g_targets():
    from privdistill.methods.dkd import absent_class_targets, generator_loss

    logits = torch.zeros(12, 3)
    logits[:, 0] = 5.0  # every sample is a 0 to the student, 2 rated above 1 on the last four
    logits[8:, 2] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    logits[:4, 1] = 0.5
    targets, absent = absent_class_targets(logits, logits.argmax(1))
    assert absent == 2  # classes 1 and 2
    assert set(targets[8:].tolist()) == {2}  # the four rated most likely to be a 2 (12 // 3 = 4 of them)
    assert set(targets[:4].tolist()) == {1} and set(targets[4:8].tolist()) == {0}
    present = torch.eye(3).repeat(4, 1)  # every class answered: the argmax stays the target
    assert torch.equal(absent_class_targets(present, present.argmax(1))[0], present.argmax(1))

    weights = {"one_hot_weight": 1.0, "entropy_weight": 0.0, "activation_weight": 0.0}
    feats = torch.randn(12, 16)
    paper, parts = generator_loss(logits, feats, **weights)
    counted, counted_parts = generator_loss(logits, feats, revive_absent=False, **weights)
    revived, revived_parts = generator_loss(logits, feats, revive_absent=True, **weights)
    assert "lg_absent_classes" not in parts and counted == paper and counted_parts["lg_absent_classes"] == 2
    assert float(revived) == pytest.approx(float(torch.nn.functional.cross_entropy(logits, targets)))
    assert revived > paper and revived_parts["lg_absent_classes"] == 2
    with pytest.raises(ConfigError, match="revive_classes_from"):
        DPDFDConfig(revive_classes_from=-1).validate()
