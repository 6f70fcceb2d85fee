"""DGD: manifold perturbations, privacy plan and ledger, end to end on fabricated data."""

import json

import pytest
import torch

from privdistill.engine.manifold import (
    ManifoldPerturber,
    PerturbationConfig,
    _unit,
    decoder_tangent_basis,
    feature_distance,
    project_normal,
)
from privdistill.errors import BudgetExceededError, ConfigError
from privdistill.methods.common import RunRequest
from privdistill.methods.dgd import DGD, run_dgd
from privdistill.methods.dgd_plan import DGDConfig, plan_queries
from privdistill.methods.runner import Budget
from privdistill.models import create_model
from privdistill.privacy.events import SubsampledGaussian

TINY = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
        "baseline.model=small-cnn", "baseline.epochs=2", "baseline.batch_size=32",
        "teachers.num_teachers=5", "teachers.model=small-cnn", "teachers.steps=20", "teachers.batch_size=16",
        "teachers.lr=0.003", "generator.rounds=2", "generator.steps_per_round=4", "generator.batch_size=32",
        "generator.width=32", "vae.steps=20", "vae.batch_size=32", "student.model=small-cnn", "student.steps=12",
        "student.batch_size=16", "student.unlabeled_batch_size=16", "student.eval_every=6",
        "student.checkpoint_every=4", "run.precision=fp32", "run.progress=false",
        "dgd.laplace_scale=40"]  # chosen: sizing.py would lower the noise for 5 teachers


def test_normal_perturbations_are_orthogonal_to_the_decoder_tangent_space():
    torch.manual_seed(0)
    vae = create_model("conv-vae", in_channels=1, image_size=28, latent_dim=8).eval()
    z = torch.randn(3, 8)
    basis = decoder_tangent_basis(vae, z)
    assert basis.shape == (3, 784, 8)
    assert torch.allclose(basis.transpose(1, 2) @ basis, torch.eye(8).expand(3, 8, 8), atol=1e-4), "orthonormal"
    # The basis spans the decoder's Jacobian: a small latent move is (to first order) inside the span.
    eta = torch.randn(3, 8) * 1e-3
    move = (vae.decode(z + eta) - vae.decode(z)).flatten(1)
    inside = (basis @ (basis.transpose(1, 2) @ move.unsqueeze(2))).squeeze(2)
    assert (move - inside).norm() < 0.05 * move.norm()
    d = project_normal(torch.randn(3, 1, 28, 28), basis)
    assert (basis.transpose(1, 2) @ d.flatten(1).unsqueeze(2)).abs().max() < 1e-4, "normal ⟂ tangent"


def test_perturbations_have_the_requested_size():
    torch.manual_seed(1)
    vae = create_model("conv-vae", in_channels=1, image_size=28, latent_dim=8).eval()
    student = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28)
    perturber = ManifoldPerturber(vae, PerturbationConfig(tangent_eps=0.5, normal_eps=1.5))
    z = torch.randn(4, 8)
    x_hat = vae.decode(z).detach()
    gen = torch.Generator().manual_seed(0)
    x_perp = perturber.normal(student, z, x_hat, gen)
    assert torch.allclose((x_perp - x_hat).flatten(1).norm(dim=1), torch.full((4,), 1.5), atol=1e-4)
    x_par = perturber.tangent(student, z, x_hat, gen)
    assert x_par.shape == x_hat.shape and not torch.allclose(x_par, x_hat)
    assert all(p.grad is None for p in student.parameters()), "probing must not touch the student's gradients"


def test_adversarial_directions_change_the_features_more_than_random_ones():
    """One power iteration (TNAR) must find a normal direction of larger feature change than a random one.
    (Through this untrained decoder the tangent directions barely differ, 1.04x: not asserted.)"""
    torch.manual_seed(1)
    vae = create_model("conv-vae", in_channels=1, image_size=28, latent_dim=8).eval()
    student = create_model("paper-cnn", in_channels=1, num_classes=10, image_size=28)
    x, y = torch.rand(64, 1, 28, 28) * 2 - 1, torch.randint(0, 10, (64,))
    opt = torch.optim.Adam(student.parameters(), 1e-3)
    for _ in range(10):  # a partly trained student, not the initialisation
        opt.zero_grad()
        torch.nn.functional.cross_entropy(student(x), y).backward()
        opt.step()
    z = torch.randn(16, 8)
    x_hat = torch.sign(vae.decode(z).detach())  # saturated, like the synthetic samples
    perturber = ManifoldPerturber(vae, PerturbationConfig(tangent_eps=0.5, normal_eps=1.5))
    adversarial = perturber.normal(student, z, x_hat, torch.Generator().manual_seed(0))
    basis = decoder_tangent_basis(vae, z)
    random = x_hat + 1.5 * _unit(project_normal(torch.randn(x_hat.shape, generator=torch.Generator().manual_seed(0)),
                                                basis))
    with torch.no_grad():
        assert (feature_distance(student, x_hat, adversarial).mean()
                > 1.5 * feature_distance(student, x_hat, random).mean())


def test_query_count_from_a_target_epsilon():
    # Strict (dp-accounting RDP of Laplace noisy argmax, b = 40): 1300 queries cost 9.34, 27 cost 0.98.
    assert 1300 <= plan_queries(DGDConfig(), Budget(epsilon=10.0)) < 1500
    assert 27 <= plan_queries(DGDConfig(), Budget(epsilon=1.0)) < 30
    assert plan_queries(DGDConfig(), Budget(epsilon=10.0, accounting="paper")) < 1300, "the printed formula is looser"
    assert plan_queries(DGDConfig(queries=750), Budget(epsilon=1.0)) == 750
    with pytest.raises(ConfigError, match="allows no laplace query"):
        plan_queries(DGDConfig(), Budget(epsilon=0.01))
    with pytest.raises(ConfigError, match="either dgd.queries"):
        plan_queries(DGDConfig(), Budget())


def test_dgd_refuses_to_start_beyond_max_epsilon(tiny_npz, tmp_path):
    # 250 LNMax queries at b = 40 cost 3.55 (strict)
    request = RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / "r"),
                         overrides=TINY + ["dgd.queries=250", "budget.max_epsilon=2.0", "budget.accounting=strict"])
    with pytest.raises(BudgetExceededError):
        run_dgd(request)
    assert not any((tmp_path / "r").glob("student*")), "nothing was trained"


def test_dgd_refuses_more_queries_than_samples_before_training(tiny_npz, tmp_path):
    request = RunRequest(dataset=f"npz:{tiny_npz}", overrides=TINY + ["dgd.queries=100000"],
                         run_dir=str(tmp_path / "r"))
    with pytest.raises(ConfigError, match="leave no unlabelled samples"):
        run_dgd(request)
    # nothing was trained: only the config (and the run directory's lock file) is there
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".lock", "config.yaml"], "nothing was trained"


@pytest.mark.slow
def test_dgd_end_to_end_and_resume_reuses_recorded_answers(tiny_npz, tmp_path):
    run_dir = tmp_path / "run"
    # bit-for-bit replay is what the CPU guarantees; on CUDA cuDNN's default kernels differ in the last bits (H100)
    result = DGD(f"npz:{tiny_npz}", queries=40, overrides=TINY + ["run.device=cpu", "run.noise=reproducible"],
                 run_dir=str(run_dir)).fit()
    s = result.summary
    assert s["queries"] == 40 and s["method"] == "dgd"
    # 40 LNMax queries with b = 40 (ε0 = 0.05 each): strict via RDP, paper via advanced composition + ε1.
    assert 0.5 < s["epsilon_strict"] < 2.0 and s["epsilon_paper"] > s["epsilon_strict"]
    assert any("generator" in p for p in s["not_covered"])
    agree = s["query_agreement_with_baseline"]  # evaluation-only diagnostic of the label channel
    assert 0.0 <= agree["noisy_label"] <= 1.0 and 0.0 <= agree["plurality"] <= 1.0
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert "student" in privacy["artifacts"] and "generator" in privacy["artifacts"]
    assert s["noise_secure"] is False and "only while that seed" in privacy["noise"]["statement"]
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    spends = [r for r in ledger if r.get("kind") == "spend"]
    assert [r["key"] for r in spends] == ["dgd/queries", "dgd/latent-codes"]

    # Resuming the finished run spends nothing more and reproduces the student exactly; a budget just above
    # what was spent lets it resume (the recorded uses are not planned a second time).
    again = run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(run_dir), resume=True,
                               overrides=TINY + ["dgd.queries=40", "run.device=cpu", "run.noise=reproducible",
                                                 "budget.accounting=strict",
                                                 f"budget.max_epsilon={1.01 * s['epsilon_strict']}"]))
    ledger2 = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert len([r for r in ledger2 if r.get("kind") == "spend"]) == 2, "no budget spent twice"
    assert again.summary["epsilon_strict"] == s["epsilon_strict"]
    # the recorded answers carry no fresh votes: the resumed summary keeps the label agreement only
    assert again.summary["query_agreement_with_baseline"]["noisy_label"] == agree["noisy_label"]
    for a, b in zip(result.student.state_dict().values(), again.student.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_secure_noise_is_the_default_for_the_votes_and_codes(tiny_npz, tmp_path, secure_draws):
    run_dir = tmp_path / "run"
    s = DGD(f"npz:{tiny_npz}", queries=40, overrides=TINY, run_dir=str(run_dir)).fit().summary
    assert s["noise_secure"] is True and s["queries"] == 40 and s["epsilon_sampling"] > 0
    assert "ChaCha20" in json.loads((run_dir / "privacy.json").read_text())["noise"]["statement"]
    # two draws: the vote counts (40 queries x 10 classes, integers: discrete Laplace), then the latent codes
    assert len(secure_draws) == 2 and secure_draws[0] == ("add", 400) and secure_draws[1][0] == "add"


@pytest.mark.slow
def test_a_run_interrupted_in_the_student_resumes_to_the_uninterrupted_result(tiny_npz, tmp_path, crash_student_at):
    from safetensors.torch import load_file

    from privdistill.privacy.ledger import PrivacyLedger

    def fit(name, resume=False):  # CPU: bit-for-bit replay (cuDNN's kernels differ in the last bits)
        return run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / name), resume=resume,
                                  overrides=TINY + ["dgd.queries=40", "run.device=cpu", "run.noise=reproducible"])
                       ).summary

    whole = fit("whole")
    restore = crash_student_at(6)  # after the step-4 checkpoint, the votes and codes already in the ledger
    with pytest.raises(KeyboardInterrupt):
        fit("cut")
    assert PrivacyLedger(tmp_path / "cut").keys() == ["dgd/queries", "dgd/latent-codes"]
    restore()
    resumed = fit("cut", resume=True)
    a, b = (load_file(tmp_path / d / "student.safetensors") for d in ("whole", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed student equals the uninterrupted one"
    assert resumed["test_accuracy"] == whole["test_accuracy"]
    assert (resumed["epsilon_strict"], resumed["epsilon_paper"]) == (whole["epsilon_strict"], whole["epsilon_paper"])
    la, lb = (PrivacyLedger(tmp_path / d) for d in ("whole", "cut"))
    assert [r["answers"] for r in la.records() if r["kind"] == "spend"] == \
        [r["answers"] for r in lb.records() if r["kind"] == "spend"], "same released labels, nothing spent twice"


def test_dgd_checks_its_teacher_partitions_before_training(tiny_npz, tmp_path):
    from privdistill.errors import DataError

    request = RunRequest(dataset=f"npz:{tiny_npz}", overrides=TINY + ["dgd.queries=40", "teachers.num_teachers=5000"],
                         run_dir=str(tmp_path / "r"))
    with pytest.raises(DataError, match="5000 teachers need at least 5000"):
        run_dgd(request)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".lock", "config.yaml"], "nothing was trained"


E2E = ["budget.privacy=end-to-end", "dp_source.model=small-cnn", "dp_source.epochs=2", "dp_source.batch_size=64",
       "dp_source.lr=0.5", "dgd.latent_noise=false"]


@pytest.mark.slow
def test_end_to_end_mode_covers_every_pathway_within_the_target(tiny_npz, tmp_path):
    import warnings

    from privdistill.methods.common import ReproducibleNoiseWarning
    from privdistill.privacy import both
    from privdistill.privacy.ledger import PrivacyLedger

    run_dir = tmp_path / "e2e"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        s = run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(run_dir),
                               overrides=TINY + E2E + ["budget.epsilon=8", "dgd.laplace_scale=4"])).summary
    # secure noise throughout: the DP source (a nested DP-SGD run given the parent's seed) says nothing else
    assert not [w for w in seen if issubclass(w.category, ReproducibleNoiseWarning)]
    assert json.loads((run_dir / "dp-source" / "summary.json").read_text())["noise_secure"] is True
    assert s["not_covered"] == [] and s["privacy_scope"] == "end-to-end"
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert all(p["covered"] for art in privacy["artifacts"].values() for p in art), "generator covered too"
    ledger = PrivacyLedger(run_dir)
    assert sorted(ledger.keys()) == ["dgd/queries", "dp-source"]
    total = both(ledger.events(), delta=1e-5)["strict"].value
    assert s["epsilon_strict"] == pytest.approx(total, rel=1e-6) and total <= 8 + 1e-9, "one ε, within the target"
    source = json.loads((run_dir / "dp-source" / "summary.json").read_text())
    assert source["epsilon_strict"] <= 4 + 1e-6 and source["dpsgd_accounting"]["steps"] == 2 * 5  # half ε, 270/64
    assert s["queries"] >= 1 and s["stages"]["dp_source"]["run_dir"].endswith("dp-source")
    with pytest.raises(Exception, match="end-to-end"):  # a held-out private slice cannot be covered
        run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / "refused"),
                           overrides=TINY + E2E + ["budget.epsilon=8", "dgd.inputs=private-holdout"]))
    for extra, reason in ((["generator.loss=srr"], "ScatterNet DP source"),  # statistics of the scattering
                          ([], "BN-statistics generator loss"),  # the paper's DAFL loss would not read them
                          (["dp_source.share=0.9", "dp_source.statistics_share=0.1"], "nothing of ε")):
        with pytest.raises(ConfigError, match=reason):
            run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / "refused-statistics"),
                               overrides=TINY + E2E + ["budget.epsilon=8", "dp_source.statistics_share=0.2", *extra]))


@pytest.mark.slow
def test_source_labels_are_free_only_with_a_dp_source(tiny_npz, tmp_path):
    run_dir = tmp_path / "labels"
    s = run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(run_dir), overrides=TINY + E2E + [
        "budget.epsilon=8", "dgd.laplace_scale=4", "dgd.source_labels=true"])).summary
    assert s["not_covered"] == [] and s["student_training"]["steps"] == 12
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert any("labels of the unqueried" in p["via"] and p["covered"] for p in privacy["artifacts"]["student"])
    with pytest.raises(ConfigError, match="only a DP source"):
        run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / "refused"),
                           overrides=TINY + ["dgd.queries=40", "dgd.source_labels=true"]))


def test_histogram_release_records_the_noisy_histogram_at_the_argmax_s_epsilon(tiny_npz, tmp_path):
    """`dgd.release=histogram`: the ledger records each query's whole noisy vote histogram, whose argmax is the
    label the default release gives for the same noise; the ε is the same; the student fits the noisy vote share
    (its own loss in the history); the privacy report says what was released; a resume replays the histogram."""
    common = TINY + ["run.device=cpu", "run.noise=reproducible", "dgd.aggregation=gaussian", "dgd.gaussian_sigma=2",
                     "student.unsupervised=false"]
    runs = {}
    for release in ("argmax", "histogram"):
        run_dir = tmp_path / release
        runs[release] = (run_dir, DGD(f"npz:{tiny_npz}", queries=40, overrides=common + [f"dgd.release={release}"],
                                      run_dir=str(run_dir)).fit())

    def answers(run_dir):  # the recorded answers, as a resumed run reads them back
        from privdistill.privacy.ledger import LedgerView, PrivacyLedger

        event = dict(LedgerView.read(run_dir).spends)["dgd/queries"]
        return torch.as_tensor(PrivacyLedger(run_dir).spend("dgd/queries", event, lambda: pytest.fail()))

    labels, histogram = answers(runs["argmax"][0]), answers(runs["histogram"][0])
    assert labels.shape == (40,) and histogram.shape == (40, 10) and histogram.is_floating_point()
    assert torch.equal(histogram.argmax(1), labels), "the same noise: the histogram's argmax is GNMax's label"
    assert bool((histogram != histogram.round()).any()), "the noisy counts themselves, not the votes"
    from privdistill.privacy.ledger import PrivacyLedger

    # PATE's data-dependent bound prices an argmax only: a histogram run keeps no votes for it
    assert PrivacyLedger(runs["argmax"][0]).vote_stats()[0] is not None
    assert PrivacyLedger(runs["histogram"][0]).vote_stats()[0] is None
    a, h = runs["argmax"][1].summary, runs["histogram"][1].summary
    assert h["epsilon_strict"] == a["epsilon_strict"] and h["epsilon_paper"] == a["epsilon_paper"]
    assert h["release"] == "histogram" and a["release"] == "argmax"
    history = h["student_training"]["history"]
    assert "share_sq_error" in history[-1] and "ce" not in history[-1]
    privacy = json.loads((runs["histogram"][0] / "privacy.json").read_text())
    assert "noisy vote histograms" in json.dumps(privacy)
    again = run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(runs["histogram"][0]), resume=True,
                               overrides=common + ["dgd.release=histogram", "dgd.queries=40"]))
    for x, y in zip(runs["histogram"][1].student.state_dict().values(), again.student.state_dict().values()):
        assert torch.equal(x, y)
    with pytest.raises(ConfigError, match="dgd.release"):
        DGDConfig(release="logits").validate()


@pytest.mark.slow
def test_end_to_end_with_dp_feature_statistics_prices_three_events_within_the_target(tiny_npz, tmp_path):
    from privdistill.privacy import both
    from privdistill.privacy.ledger import PrivacyLedger

    run_dir = tmp_path / "e2e-statistics"
    s = run_dgd(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(run_dir), overrides=TINY + E2E + [
        "budget.epsilon=8", "dgd.laplace_scale=4", "dp_source.model=scatter-linear", "generator.loss=srr",
        "dp_source.share=0.6", "dp_source.statistics_share=0.2"])).summary
    assert s["not_covered"] == [] and s["privacy_scope"] == "end-to-end"
    ledger = PrivacyLedger(run_dir)
    assert sorted(ledger.keys()) == ["dgd/queries", "dp-source", "dp-source/statistics"]
    deltas = [e.delta for e in ledger.events() if isinstance(e, SubsampledGaussian)]  # the source's, the statistics'
    assert len(deltas) == 2 and sum(deltas) == pytest.approx(1e-5 / 2)
    total = both(ledger.events(), delta=1e-5)["strict"].value
    assert s["epsilon_strict"] == pytest.approx(total, rel=1e-6) and total <= 8 + 1e-9, "one ε, within the target"
    assert any("mean and variance" in p["via"] for p in json.loads((run_dir / "privacy.json").read_text())
               ["artifacts"]["generator"]), "the report names the statistics"
