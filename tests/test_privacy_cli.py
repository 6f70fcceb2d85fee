"""`privdistill privacy estimate` and `privdistill privacy report`, and the report module."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from privdistill.cli.privacy import app
from privdistill.errors import PrivacyError, RunError
from privdistill.methods.dgd_plan import dgd_pathways
from privdistill.methods.dpdfd_plan import dpdfd_pathways
from privdistill.methods.srr_plan import srr_pathways
from privdistill.privacy.events import (
    LaplaceOnSyntheticCodes,
    LaplaceQueries,
    NormalisedGaussian,
    RandomizedResponseWithPrior,
)
from privdistill.privacy.ledger import PrivacyLedger
from privdistill.privacy.report import (
    Pathway,
    noise_source,
    privacy_report,
    render_text,
    run_report,
    write_privacy_json,
)

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def run_json(*args):
    res = run(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_estimate_lnmax_prints_both_accountings():
    res = run("estimate", "--mechanism", "lnmax", "--laplace-scale", "40", "--queries", "1300", "--delta", "1e-5")
    assert res.exit_code == 0, res.output
    assert "paper" in res.output and "strict" in res.output
    assert "11.9" in res.output and "9.342" in res.output
    assert "NOT covered" in res.output  # the generator pathway of DGD


def test_estimate_json_dgd_golden():
    doc = run_json("estimate", "-m", "lnmax", "--epsilon0", "0.05", "-q", "1000", "--latent-epsilon", "0.01")
    assert round(doc["epsilon"]["paper"], 1) == 10.1
    assert round(doc["epsilon"]["strict"], 2) == 7.98
    assert doc["artifacts"]["generator"]["fully_covered"] is False
    assert doc["relation"].startswith("replace-one")


def test_estimate_dpdfd_with_calibration():
    doc = run_json("estimate", "-m", "dpdfd", "--clip-norm", "1e-3", "--sigma", "100", "--batch-size", "256",
                   "--steps", "1000", "--target-epsilon", "1")
    cal = doc["calibration"]
    assert cal["paper"]["max_steps"] == 596808 and cal["strict"]["max_steps"] == 0
    assert doc["artifacts"]["student"]["fully_covered"] is True


def test_estimate_dpdfd_alg3_flags_not_dp():
    doc = run_json("estimate", "-m", "dpdfd", "-C", "1e-3", "--sigma", "100", "-B", "256", "--steps", "100",
                   "--algorithm", "3", "--dataset-size", "60000")
    assert doc["epsilon"]["strict"] == "inf"
    assert doc["mechanisms"][0]["details"]["gradient_channel_epsilon"] < 0.01
    assert doc["artifacts"]["student"]["fully_covered"] is False


def test_estimate_with_only_a_target_answers_how_many_queries_it_allows():
    r = run_json("estimate", "-m", "lnmax", "-b", "40", "--target-epsilon", "10")
    assert r["calibration"]["strict"]["max_count"] == 1454 and r["mechanisms"][0]["event"]["count"] == 1454
    assert 9.9 < r["epsilon"]["strict"] <= 10
    res = run("estimate", "-m", "lnmax", "-b", "40", "--target-epsilon", "0.01")
    assert isinstance(res.exception, PrivacyError) and "allows no lnmax query" in str(res.exception)


def test_estimate_other_mechanisms():
    srr = run_json("estimate", "-m", "srr", "--epsilon-per-label", "1", "-q", "60000", "-K", "10")
    assert srr["epsilon"]["paper"] == 1.0 and srr["epsilon"]["strict"] > 28000
    lab = run_json("estimate", "-m", "srr", "--epsilon-per-label", "1", "-q", "60000", "-K", "10",
                   "--srr-setting", "label-dp")
    assert lab["epsilon"]["strict"] == pytest.approx(1.0, abs=1e-4)
    rr = run_json("estimate", "-m", "rr", "--epsilon-per-label", "2", "-q", "10", "-K", "10")
    assert rr["epsilon"]["strict"] <= 20
    gn = run_json("estimate", "-m", "gnmax", "--sigma", "40", "-q", "1000")
    assert gn["epsilon"]["strict"] > 0
    cg = run_json("estimate", "-m", "confident-gnmax", "--threshold", "200", "--sigma1", "150", "--sigma2", "40",
                  "-q", "1000", "--answered", "286")
    # strict prices all 1000 queries as answered (the count is chosen adaptively): GNMax's cost plus the checks
    assert cg["epsilon"]["strict"] > gn["epsilon"]["strict"]
    assert "odometer" in json.dumps(cg)
    # the same 1000 planned as a filter's budget: 1800 checks of which 900 answered fit it, and cost the same
    fg = run_json("estimate", "-m", "confident-gnmax", "--threshold", "200", "--sigma1", "150", "--sigma2", "40",
                  "-q", "1800", "--answered", "900", "--filter-budget", "1000")
    assert fg["epsilon"]["strict"] == pytest.approx(cg["epsilon"]["strict"]) and "RDP filter" in json.dumps(fg)
    mt = run_json("estimate", "-m", "dpdfd", "-C", "1e-3", "--sigma", "100", "-B", "256", "--steps", "10",
                  "-n", "100")
    assert "Alg. 2" in mt["mechanisms"][0]["description"]


@pytest.mark.parametrize("args,match", [
    (["-m", "lnmax", "-q", "10"], "--laplace-scale"),
    (["-m", "lnmax", "-q", "10", "-b", "0"], "Laplace scale"),
    (["-m", "lnmax", "-q", "10", "-b", "40", "--delta", "1"], "delta"),
    (["-m", "gnmax", "-q", "10", "--sigma", "-1"], "sigma"),
    (["-m", "srr", "-q", "10", "-K", "10", "--epsilon-per-label", "0"], "epsilon"),
    (["-m", "dpdfd", "--sigma", "100", "-B", "256", "--steps", "1"], "--clip-norm"),
    (["-m", "lnmax", "-b", "40"], "--queries"),
    (["-m", "lnmax", "-b", "40", "-q", "10", "--target-epsilon", "-1"], "target epsilon"),
])
def test_estimate_bad_input_raises_privacy_error(args, match):
    res = run("estimate", *args)
    assert res.exit_code != 0
    assert isinstance(res.exception, PrivacyError), res.output
    assert match in str(res.exception)


def test_command_line_prints_clean_error():
    proc = subprocess.run([sys.executable, "-c", "from privdistill.cli import main; main()",
                           "privacy", "estimate", "-m", "lnmax", "-q", "5", "-b", "-3"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "Laplace scale must be > 0" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------- reports
def test_report_on_a_ledger_alone(tmp_path):
    led = PrivacyLedger(tmp_path, max_epsilon=10)
    for i in range(3):
        led.spend(f"q{i}", LaplaceQueries(40, 100), lambda: [0] * 5)
    res = run("report", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "Laplace queries (LNMax): 300 queries" in res.output  # merged
    assert "no artifact pathways" in res.output
    doc = run_json("report", str(tmp_path))
    assert doc["ledger"]["records"] == 3 and doc["ledger"]["max_epsilon"] == 10


def test_report_with_pathways(tmp_path):
    led = PrivacyLedger(tmp_path)
    led.spend("labels", LaplaceQueries(40, 1000), lambda: [1])
    led.spend("latent", LaplaceOnSyntheticCodes(0.01, dim=32), lambda: None)
    write_privacy_json(tmp_path, dgd_pathways(), method="DGD")
    doc = run_report(tmp_path)
    assert doc["method"] == "DGD"
    assert round(doc["epsilon"]["paper"], 1) == 10.1
    assert doc["artifacts"]["student"]["fully_covered"] is False
    assert "not covered: the generator is fitted to models trained without noise" in json.dumps(doc)
    text = render_text(doc)
    assert "NOT covered" in text and "strict" in text and "paper" in text
    assert "noise:" not in text, "no noise source recorded, none claimed"


@pytest.mark.parametrize("secure,expected", [(False, "only while that seed"), (True, "ChaCha20")])
def test_report_states_where_the_noise_came_from(tmp_path, secure, expected):
    PrivacyLedger(tmp_path).spend("labels", LaplaceQueries(40, 10), lambda: [1])
    noise = noise_source(secure, "run.noise", draws=10, rho=1e-13, tail=1e-30, epsilon=1.0, delta=1e-5)
    write_privacy_json(tmp_path, dgd_pathways(), method="dgd", noise=noise)
    text = render_text(run_report(tmp_path))
    assert expected in text and ("without --seed" in text) == (not secure)
    assert ("adds 2.0e-13 to ε" in text) == secure  # 2 rho


def test_report_errors(tmp_path):
    res = run("report", str(tmp_path / "missing"))
    assert isinstance(res.exception, RunError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="ledger"):
        run_report(tmp_path / "empty")



def test_report_of_a_dpsgd_run_comes_from_its_privacy_json(tmp_path):
    accounting = {"noise_multiplier": 1.0, "sample_rate": 0.004, "steps": 700, "max_grad_norm": 1.0,
                  "epsilon_opacus_rdp": 0.99, "epsilon_opacus_prv": 0.61, "epsilon_replace_one_pld": 0.9,
                  "headline": "Opacus RDP accountant (add/remove-one), calibrated by make_private_with_epsilon"}
    pathway = Pathway("private training data", "noisy clipped gradients", "model weights", True)
    write_privacy_json(tmp_path, {"model": [pathway]}, method="dpsgd",
                       extra={"dpsgd_accounting": accounting, "delta": 1e-5})
    doc = run_report(tmp_path)
    assert doc["epsilon"] == {"paper": 0.99, "strict": 0.9} and doc["artifacts"]["model"]["fully_covered"]
    text = render_text(doc)
    assert "700 steps" in text and "replace-one" in text and "(0.9, 1e-05)-DP under strict" in text


def test_pathway_helpers_and_statements():
    for arts in (dgd_pathways(), dgd_pathways(aggregation="gaussian", inputs="held-out-private"),
                 dpdfd_pathways(algorithm=1), dpdfd_pathways(algorithm=2), dpdfd_pathways(algorithm=3),
                 srr_pathways(), srr_pathways(setting="label-dp")):
        for pws in arts.values():
            assert all(isinstance(p, Pathway) for p in pws)
            assert all(Pathway.from_dict(p.to_dict()) == p for p in pws)
    rep = privacy_report([NormalisedGaussian(1e-3, 100, 256, 10)], delta=1e-5, artifacts=dpdfd_pathways(algorithm=1))
    assert rep["artifacts"]["student"]["fully_covered"] is True
    assert "under strict" in rep["artifacts"]["student"]["statement"]
    rep = privacy_report([RandomizedResponseWithPrior(1.0, 60000, 10)], delta=1e-5, artifacts=srr_pathways())
    assert rep["artifacts"]["generator"]["fully_covered"] is False
    with pytest.raises(PrivacyError):
        dpdfd_pathways(algorithm=4)
