"""The reproduction matrix: expansion, skip/resume logic with fake cells, audits queued, the packaged matrices'
names agree with what --record writes, tables, figures, run reports, and `privdistill bench` without a
sub-command."""

import json
from pathlib import Path

import pytest
import yaml

from privdistill.bench.matrix import load_matrix, run_matrix
from privdistill.bench.report import DP_METHODS
from privdistill.errors import ConfigError
from privdistill.recipes import METHODS, recipes

MATRIX = {
    "preset": "quick",
    "datasets": ["mnist", "fashion-mnist"],
    "cells": [
        {"name": "baseline-{dataset}", "args": ["train", "baseline", "-d", "{dataset}"]},
        {"name": "dgd-{dataset}-eps{epsilon}", "args": ["dgd", "-d", "{dataset}", "--epsilon", "{epsilon}",
                                                         "--queries", "{queries}", "--preset", "{preset}"],
         "grid": [{"epsilon": 10, "queries": 1300}, {"epsilon": 1, "queries": 27}]},
        {"name": "placeholder-{dataset}", "args": ["nothing"], "disabled": True},
        {"name": "pate-mnist-eps{epsilon}", "args": ["pate"], "datasets": ["mnist"], "grid": [{"epsilon": 0.5}],
         "audit": False},
    ],
}


def _matrix(tmp_path, doc=MATRIX, **kw):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_matrix(str(path), results_dir=tmp_path / "results", runs_dir=tmp_path / "runs", **kw)


def test_expansion_names_and_arguments(tmp_path):
    m = _matrix(tmp_path)
    names = [c.name for c in m.cells]
    assert names == ["baseline-mnist", "baseline-fashion-mnist", "dgd-mnist-eps10", "dgd-mnist-eps1",
                     "dgd-fashion-mnist-eps10", "dgd-fashion-mnist-eps1", "pate-mnist-eps0.5"]
    dgd = m.cells[3]
    assert dgd.args == ["dgd", "-d", "mnist", "--epsilon", "1", "--queries", "27", "--preset", "quick"]
    assert dgd.result == tmp_path / "results" / "quick" / "dgd-mnist-eps1.json"
    assert dgd.command(["privdistill"], resume=True)[-5:] == ["--record", "--no-progress", "--run-dir",
                                                             str(tmp_path / "runs" / "dgd-mnist-eps1"), "--resume"]
    assert [c.name for c in _matrix(tmp_path, datasets=["fashion-mnist"], only=["dgd"]).cells] == [
        "dgd-fashion-mnist-eps10", "dgd-fashion-mnist-eps1"]
    # a substring matches every cell containing it; =NAME exactly one
    assert [c.name for c in _matrix(tmp_path, only=["dgd-mnist-eps1"]).cells] == ["dgd-mnist-eps10", "dgd-mnist-eps1"]
    assert [c.name for c in _matrix(tmp_path, only=["=dgd-mnist-eps1"]).cells] == ["dgd-mnist-eps1"]
    with pytest.raises(ConfigError, match="no cell .* matches --only zzzz"):
        _matrix(tmp_path, only=["zzzz"])
    # another preset's matrix may borrow this one's cells
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(MATRIX))
    borrowed = tmp_path / "other.yaml"
    borrowed.write_text(yaml.safe_dump({"preset": "paper", "datasets": ["mnist"],
                                        "cells_from": str(tmp_path / "m.yaml")}))
    other = load_matrix(str(borrowed), results_dir=tmp_path / "results")
    assert [c.name for c in other.cells][:3] == ["baseline-mnist", "dgd-mnist-eps10", "dgd-mnist-eps1"]
    assert other.cells[1].args[-1] == "paper" and other.cells[1].result.parent.name == "paper"
    bad = {"preset": "quick", "cells": [{"name": "x-{nope}", "args": []}]}
    with pytest.raises(ConfigError, match="nope"):
        _matrix(tmp_path, bad)
    dup = {"preset": "quick", "cells": [{"name": "same", "args": []}, {"name": "same", "args": []}]}
    with pytest.raises(ConfigError, match="two cells"):
        _matrix(tmp_path, dup)


class FakeRunner:
    """Pretends to be the method CLIs: writes the run's summary and the recorded result (or fails)."""

    def __init__(self, results=None, fail=()):
        self.calls, self.fail, self.results = [], set(fail), results

    def __call__(self, cmd, log, fds):
        self.calls.append(cmd)
        assert fds, "the CPU and cell locks are handed to the child"
        if cmd[1] == "audit":
            result = Path(cmd[cmd.index("--result-name") + 1])
            run_dir = Path(cmd[2])
            s = json.loads((run_dir / "summary.json").read_text())
            s.update(mia_auc=0.5, mia_tpr_at_1pct_fpr=0.01, audit={"inversion": {"grid": "x.png"}})
            (run_dir / "summary.json").write_text(json.dumps(s))
            (self.results / "quick" / f"{result}.json").write_text(json.dumps(s))
            return 0
        run_dir = Path(cmd[cmd.index("--run-dir") + 1])
        if run_dir.name in self.fail:
            (run_dir).mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text("config: {}\n")  # started, then crashed
            return 3
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = {"method": run_dir.name.split("-")[0], "dataset": "mnist", "preset": "quick", "test_accuracy": 0.9,
                   "run_dir": str(run_dir)}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        out = self.results / "quick" / f"{run_dir.name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary))
        return 0


def test_skips_recorded_cells_resumes_partial_ones_and_audits(tmp_path):
    m = _matrix(tmp_path)
    # one cell recorded before the bench (its run dir elsewhere), one finished but not recorded
    (tmp_path / "results" / "quick").mkdir(parents=True)
    done_run = tmp_path / "elsewhere"
    done_run.mkdir()
    (done_run / "summary.json").write_text(json.dumps({"method": "baseline", "run_dir": str(done_run)}))
    (tmp_path / "results" / "quick" / "baseline-mnist.json").write_text(json.dumps({"method": "baseline",
                                                                                     "run_dir": str(done_run)}))
    finished = tmp_path / "runs" / "dgd-mnist-eps10"
    finished.mkdir(parents=True)
    (finished / "config.yaml").write_text("config: {}\n")
    (finished / "summary.json").write_text(json.dumps({"method": "dgd", "dataset": "mnist", "preset": "quick",
                                                       "target_epsilon": 10.0, "run_dir": str(finished)}))
    runner = FakeRunner(tmp_path / "results", fail={"dgd-fashion-mnist-eps1"})
    lock = tmp_path / "cpu.lock"
    out = run_matrix(m, lock=lock, runner=runner, privdistill=["privdistill"], say=lambda s: None)
    st = out["statuses"]
    assert st["baseline-mnist"] == "skipped (recorded)"
    assert st["dgd-mnist-eps10"] == "recorded from its finished run"
    assert (tmp_path / "results" / "quick" / "dgd-mnist-eps10.json").is_file()
    assert st["dgd-fashion-mnist-eps1"].startswith("failed")
    ran = [c for c in runner.calls if c[1] != "audit"]
    assert len(ran) == 5  # baseline-fashion-mnist, dgd-mnist-eps1, dgd-fashion-mnist-eps10 and -eps1 (fails), pate
    audited = {c[c.index("--result-name") + 1] for c in runner.calls if c[1] == "audit"}
    assert "baseline-mnist" in audited and "pate-mnist-eps0.5" not in audited, "audit: false is respected"
    assert [c for c in runner.calls if c[1] == "audit" and c[c.index("--result-name") + 1] == "baseline-mnist"][0][2] \
        == str(done_run), "audits the run directory the result came from"
    # second pass: only the failed cell runs again, resumed; nothing is audited twice
    runner2 = FakeRunner(tmp_path / "results")
    out = run_matrix(m, lock=lock, runner=runner2, privdistill=["privdistill"], say=lambda s: None)
    assert [c[-1] for c in runner2.calls if c[1] != "audit"] == ["--resume"]
    assert all(c[c.index("--result-name") + 1] == "dgd-fashion-mnist-eps1" for c in runner2.calls if c[1] == "audit")
    assert (tmp_path / "runs" / "bench.jsonl").is_file()


def test_a_cell_running_in_another_process_is_skipped(tmp_path):
    from privdistill.bench.matrix import file_lock

    m = _matrix(tmp_path, only=["pate"])
    cell = m.cells[0]
    cell.run_dir.parent.mkdir(parents=True)
    with file_lock(cell.run_dir.parent / f".{cell.name}.lock"):
        out = run_matrix(m, lock=None, runner=FakeRunner(tmp_path / "results"), privdistill=["privdistill"],
                         say=lambda s: None)
    assert out["statuses"][cell.name] == "skipped: running in another process"


RESEARCH = str(Path(__file__).resolve().parents[1] / "experiments" / "research-matrix.yaml")


@pytest.mark.parametrize("preset", ["quick", "paper", RESEARCH])
def test_matrices_name_cells_as_record_does(preset, tmp_path):
    """Each cell's name must be the file its command's --record writes (engine/run.py: record_result, given the
    summary the command's run writes), or the bench would rerun it forever."""
    from privdistill.engine.run import record_result
    from privdistill.methods.pate import PATEConfig, _variant

    m = load_matrix(preset)
    assert m.cells
    for c in m.cells:
        v = c.values
        method = c.args[1] if c.args[0] == "train" else c.args[0]  # train baseline | train audit-control
        recipe = c.args[c.args.index("-r" if "-r" in c.args else "--recipe") + 1] \
            if {"-r", "--recipe"} & set(c.args) else "default" if method in METHODS else None
        if method == "dgd" and ("gaussian" in c.args or recipe != "paper"):
            method = "dgd+"  # DGD+ = DGD with Gaussian votes (every DGD recipe but the paper's)
        summary = {"method": method, "dataset": v["dataset"], "preset": "quick", "recipe": recipe,
                   "target_epsilon": float(v["epsilon"]) if "epsilon" in v else None, "variant": None}
        if method == "pate" and recipe == "paper":
            summary["variant"] = _variant(PATEConfig(aggregation=c.args[c.args.index("--aggregation") + 1],
                                                     filter="pate.filter=true" in c.args))
        if "--variant" in c.args:
            summary["variant"] = c.args[c.args.index("--variant") + 1]
        assert c.name == record_result(summary, results_dir=tmp_path).stem, c.args
        assert "--preset" in c.args and c.args[c.args.index("--preset") + 1] == m.preset


def test_the_packaged_matrix_is_the_headline_and_the_papers_cells():
    """The packaged matrix runs every recipe's measured cell by its short command and the paper-literal cells; the
    research cells live in experiments/ (the same names would otherwise be run twice)."""
    cells = {c.name: c for c in load_matrix("quick").cells}
    for method in METHODS:
        for name, recipe in recipes(method).items():
            for dataset, epsilon in recipe.measured if name != "paper" else ():
                cell = cells[f"{method}-{dataset}-eps{float(epsilon):g}-{name}"]
                assert cell.args[:5] == [method, "-d", dataset, "-e", f"{float(epsilon):g}"]
                assert ("--accounting" in cell.args) == (recipe.accounting == "paper")
    assert {"dgd-mnist-eps10", "dpdfd-fashion-mnist-eps1", "pate-mnist-eps1", "baseline-mnist"} <= set(cells)
    research = {c.name: c for c in load_matrix(RESEARCH).cells}
    assert len(research) > 50
    for name in research.keys() & cells.keys():  # a research cell a recipe took over: its file is the recipe's run
        recorded = json.loads(cells[name].result.read_text())
        assert name.endswith(f"-{recorded['recipe']}") and not recorded.get("variant"), name
    assert all(c.args[0] not in METHODS or "--recipe" in c.args or "-r" in c.args or c.name.endswith("-default")
               for c in cells.values())


def _fake_results(root: Path, run_root: Path) -> None:
    q = root / "quick"
    q.mkdir(parents=True)
    run = run_root / "dpsgd"
    (run / "audit").mkdir(parents=True)
    import numpy as np

    np.savez(run / "audit" / "mia_scores.npz", is_member=np.r_[np.ones(5, bool), np.zeros(5, bool)],
             lira_online=np.arange(10.0))
    rows = [
        {"method": "baseline", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.99, "model": "paper-cnn",
         "mia_auc": 0.6, "mia_tpr_at_1pct_fpr": 0.05, "audit": {"mia": {"attacks": {
             "lira-online": {"auc": 0.6, "tpr_at_1pct_fpr": 0.05, "auc_ci95": [0.58, 0.62]}}}}},
        {"method": "dpsgd", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.95, "target_epsilon": 1.0,
         "epsilon_paper": 0.999, "epsilon_strict": 1.1, "delta": 1e-5, "not_covered": [], "run_dir": str(run),
         "dpsgd_accounting": {"noise_multiplier": 1.1, "steps": 700, "epsilon_opacus_rdp": 0.999,
                              "epsilon_opacus_prv": 0.7}, "mia_auc": 0.51, "mia_tpr_at_1pct_fpr": 0.01,
         "audit": {"mia": {"attacks": {"lira-online": {"auc": 0.51, "tpr_at_1pct_fpr": 0.01}}}}},
        {"method": "pate", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.9, "target_epsilon": 10.0,
         "epsilon_paper": 10.5, "epsilon_strict": 9.9, "epsilon_realised_answered_only": 7.5,
         "epsilon_data_dependent": 3.2, "delta": 1e-5, "aggregation": "confident-gnmax", "queries": 2700,
         "answered": 1900, "label_accuracy": 0.98,
         "variant": "confident-gnmax", "not_covered": ["x"]},
        {"method": "pate", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.95, "target_epsilon": 10.0,
         "epsilon_paper": 11.0, "epsilon_strict": 9.9, "delta": 1e-5, "aggregation": "confident-gnmax",
         "queries": 4900, "answered": 2700, "filter_budget": 2700, "variant": "confident-gnmax-filter",
         "not_covered": ["x"]},
        # SRR's "stages" is a stage COUNT, DGD's a dict of stage references (the sample grid lives in one)
        {"method": "srr", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.97, "target_epsilon": 1.0,
         "stages": 20, "setting": "data-free", "mechanism": "srr", "label_accuracy_vs_teacher": 0.345,
         "mean_candidate_set_size": 6.5,
         "stage_trace": [{"stage": 1, "count": 10, "correct": 0.2, "mean_set_size": 10.0, "test_accuracy": None},
                         {"stage": 2, "count": 10, "correct": 0.5, "mean_set_size": 3.0, "test_accuracy": 0.9}]},
        {"method": "dgd", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.9, "target_epsilon": 10.0,
         "queries": 1300, "epsilon_strict": 9.3,
         "stages": {"generator": {"stage": "generator", "path": str(run_root / "generator-stage")}}},
        {"method": "dgd", "dataset": "mnist", "preset": "quick", "test_accuracy": 0.8, "queries": 750,
         "variant": "q750"},
    ]
    (run_root / "generator-stage").mkdir(parents=True)
    import matplotlib.pyplot as plt

    plt.imsave(run_root / "generator-stage" / "samples.png", np.zeros((8, 8)))
    for r in rows:
        name = f"{r['method']}-{r['dataset']}" + (f"-eps{r['target_epsilon']:g}" if "target_epsilon" in r else "")
        (q / f"{name}{'-' + r['variant'] if r.get('variant') else ''}.json").write_text(json.dumps(r))


def test_tables_and_figures_from_results(tmp_path):
    from privdistill.bench.plots import make_figures
    from privdistill.bench.report import regenerate

    _fake_results(tmp_path / "results", tmp_path / "runs")
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\n<!-- bench-quick -->\n")
    blocks = regenerate(tmp_path / "results", doc)
    text = doc.read_text()
    assert {"dpsgd-quick", "pate-quick", "audits-quick", "bench-quick"} <= set(blocks)
    assert "| mnist | dpsgd | 1 | 95.00 | 92.47 | 0.999 | 1.1 | yes | 0.510 | 0.010 |" in text
    assert "| mnist | confident-gnmax | 10 | 90.00 | 2700 | 1900 | 98.00 | 10.5 | 9.9 | 7.5 | 3.2 |" in text
    assert "| mnist | confident-gnmax, RDP filter | 10 | 95.00 | 4900 (budget 2700) | 2700 |" in text
    assert "0.600 [0.580, 0.620]" in text
    assert "| 97.62 | - | - | - | - | data-free | srr | 20 | 34.50 | 6.50 |" in text  # SRR's own columns
    files = {p.name for p in make_figures(tmp_path / "results", tmp_path / "fig")}
    assert {"privacy-vs-queries.png", "accuracy-vs-epsilon-quick.png", "mia-roc-quick-mnist.png",
            "samples-quick-mnist.png", "dgd-accuracy-vs-queries-quick.png", "srr-stages-quick-mnist.png"} <= files


def test_run_report_markdown_and_html(tmp_path):
    from privdistill.bench.run_report import render
    from privdistill.engine.run import RunDir
    from privdistill.methods.dpsgd import dpsgd_pathways
    from privdistill.privacy.report import write_privacy_json

    run = RunDir.open(tmp_path / "run", config={"method": "dpsgd"}, command="privdistill dpsgd")
    run.log(stage="dpsgd", epoch=1, test_accuracy=0.9)
    run.log(stage="dpsgd", epoch=2, test_accuracy=0.95)
    accounting = {"noise_multiplier": 1.0, "sample_rate": 0.004, "steps": 700, "max_grad_norm": 1.0,
                  "epsilon_opacus_rdp": 1.0, "epsilon_opacus_prv": 0.6, "epsilon_replace_one_pld": 1.1,
                  "headline": "Opacus RDP accountant (add/remove-one)"}
    write_privacy_json(run.path, dpsgd_pathways(), method="dpsgd",
                       extra={"dpsgd_accounting": accounting, "delta": 1e-5})
    run.write_summary(method="dpsgd", dataset="mnist", preset="quick", test_accuracy=0.95, epsilon_paper=1.0,
                      epsilon_strict=1.1, delta=1e-5, audit={"mia": {"attacks": {"loss": {
                          "auc": 0.5, "tpr_at_1pct_fpr": 0.01, "tpr_at_0.1pct_fpr": 0.0, "balanced_accuracy": 0.51}}}},
                      plan_notes=["sized to the data: dpsgd.epochs 3 -> 86: at least 500 optimiser steps"])
    md = render(run.path, fmt="md").read_text()
    assert "epsilon_opacus_rdp" in md and "[covered    ]" in md and "| loss | 0.500 |" in md
    assert "- sized to the data: dpsgd.epochs 3 -> 86" in md  # what the plan refitted, in the report
    assert "![Training curve](report-curve.png)" in md
    html = render(run.path, fmt="html").read_text()
    assert html.startswith("<!doctype html>") and "data:image/png;base64," in html
    assert "<li>sized to the data: dpsgd.epochs 3 -&gt; 86" in html


def test_bench_without_a_subcommand_runs_the_matrix(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from privdistill.cli import get_app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(MATRIX))
    r = CliRunner().invoke(get_app(), ["bench", "--matrix", "m.yaml", "--dry-run", "--no-lock", "--only", "pate"])
    assert r.exit_code == 0, r.output
    assert "would run: pate --record --no-progress" in " ".join(r.output.split())
    r = CliRunner().invoke(get_app(), ["bench", "teachers", "--help"])
    assert r.exit_code == 0 and "vectorised" in r.output


def test_shared_set_lines_are_spliced_into_a_cells_args(tmp_path):
    """A YAML alias of a `sets` entry among a cell's args stands for its --set lines, spliced in where it stands."""
    path = tmp_path / "m.yaml"
    path.write_text("preset: quick\nsets:\n  staged: &staged [--set, srr.stages=2, --set, srr.loss=likelihood]\n"
                    "cells:\n  - name: srr-{dataset}\n    args: [srr, -d, '{dataset}', *staged, --preset, '{preset}']\n"
                    "    datasets: [mnist]\n")
    assert load_matrix(str(path)).cells[0].args == ["srr", "-d", "mnist", "--set", "srr.stages=2", "--set",
                                                    "srr.loss=likelihood", "--preset", "quick"]


def test_the_packaged_matrix_sets_its_values_with_set_lines_and_recipes():
    """No packaged cell names a --config (a file of one's own); the shared adversarial generator of SRR's and DGD's
    cells is the recipes' (recipes/__init__.py), so the two cannot drift apart."""

    from privdistill.recipes import ADVERSARIAL_GENERATOR

    doc = yaml.safe_load(Path(RESEARCH).read_text())
    assert all("--config" not in c.args for m in ("quick", RESEARCH) for c in load_matrix(m).cells)
    expected = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in ADVERSARIAL_GENERATOR.items()}
    lines = doc["sets"]["adversarial_srr"]
    assert lines[::2] == ["--set"] * len(ADVERSARIAL_GENERATOR)
    assert dict(line.removeprefix("srr_generator.").split("=", 1) for line in lines[1::2]) == expected
    lines = doc["sets"]["adversarial"]  # DGD's: the generator fitted to the BN baseline
    values = dict(line.split("=", 1) for line in lines[1::2])
    assert values.pop("baseline.model") == "paper-cnn-bn"
    assert {k.removeprefix("generator."): v for k, v in values.items()} == expected


def test_every_packaged_cell_of_a_method_with_recipes_names_its_recipe():
    """Without --recipe a method runs its `default` recipe, which moves whenever a better configuration is measured:
    every cell names one (`paper`: the preset's own values), so that it re-makes the row it recorded
    (experiments/check_matrix_configs.py compares each recorded cell's configuration with its result's)."""
    for c in load_matrix(RESEARCH).cells:
        if c.args[0] in METHODS:
            assert "--recipe" in c.args, c.name


def test_malformed_matrix_file_is_a_clear_error(tmp_path):
    from privdistill.bench.matrix import load_matrix

    bad = tmp_path / "bad.yaml"
    bad.write_text("cells: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_matrix(str(bad))


def test_every_committed_dp_record_says_what_its_epsilon_leaves_uncovered():
    # The table's "released model fully covered by ε" column must not depend on run directories, which are
    # not committed: every recorded DP result carries its own `not_covered` list.
    results = Path(__file__).resolve().parents[1] / "results"
    records = sorted(results.glob("*/*.json"))
    if not records:
        pytest.skip("no results/ next to the tests (installed package)")
    loaded = {f"{p.parent.name}/{p.name}": json.loads(p.read_text()) for p in records}
    lacking = [name for name, r in loaded.items()
               if r.get("method") in DP_METHODS and "not_covered" not in r]
    assert not lacking, f"records without not_covered: {lacking}"


def test_accuracy_vs_epsilon_gives_every_curve_of_a_panel_its_own_colour(tmp_path, monkeypatch):
    # 21 series in all, more than tab20's colours: "a" and "z" are DP as a whole, the 19 "m.." between them in
    # sorted order are not. One colour list over all names would give "a" and "z" the same colour in one panel.
    from privdistill.bench import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, dpi=120: figures.append(fig) or path)
    names = {"a": True, "z": True} | {f"m{v:02d}": False for v in range(19)}
    rows = [{"method": "dpsgd", "variant": name, "dataset": "mnist", "target_epsilon": eps, "delta": 1e-5,
             "epsilon_strict": eps if whole else 9e3, "epsilon_paper": eps, "test_accuracy": 0.9,
             "not_covered": [] if whole else ["the generator"]}
            for name, whole in names.items() for eps in (1, 3)]
    plots.accuracy_vs_epsilon(rows, tmp_path / "a.png")
    (fig,) = figures
    counts = []
    for ax in fig.axes:
        colours = [tuple(line.get_color()) for line in ax.get_lines()]
        assert len(set(colours)) == len(colours)
        counts.append(len(colours))
    assert sorted(counts) == [2, 19]


def test_accuracy_vs_epsilon_names_instead_of_plots_runs_whose_strict_epsilon_says_nothing(tmp_path, monkeypatch):
    from privdistill.bench import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, dpi=120: figures.append(fig) or path)
    rows = [{"method": "dpsgd", "variant": "v", "dataset": "mnist", "target_epsilon": eps, "delta": 1e-5,
             "epsilon_strict": eps, "epsilon_paper": eps, "test_accuracy": 0.9, "not_covered": []}
            for eps in (1, 3)]
    rows += [{"method": "dpdfd", "variant": "strict", "dataset": "mnist", "target_epsilon": eps, "delta": 1e-5,
              "epsilon_strict": strict, "epsilon_paper": eps, "test_accuracy": 0.5, "not_covered": []}
             for eps, strict in ((1, 3e4), (10, 7e4))]
    plots.accuracy_vs_epsilon(rows, tmp_path / "a.png")
    (fig,) = figures
    top = fig.axes[0]
    xs = [x for line in top.get_lines() for x in line.get_xdata()]
    assert max(xs) <= plots.PLOTTED_MAX_EPSILON and sorted(xs) == [1, 3]
    assert any("dpdfd (strict)" in t.get_text() for t in top.texts)


def test_headline_shows_a_recorded_run_and_every_default_hole():
    from privdistill.bench.report import headline_table

    run = {"method": "pate", "recipe": "default", "dataset": "mnist", "target_epsilon": 1.0, "test_accuracy": 0.9,
           "epsilon_strict": 0.99, "epsilon_paper": 1.2, "_file": "results/quick/pate-mnist-eps1-default.json"}
    text = headline_table([run])
    rows = [line for line in text.splitlines() if line.startswith("| pate | default |")]
    assert any("| mnist | 1 | 90.00 |" in r and "pate-mnist-eps1-default.json" in r for r in rows)
    # nothing recorded for a cell the recipe never measured: shown as a hole, not skipped
    assert not any("| mnist | 1 |" in r and "not run yet" in r for r in rows)
    assert all(r.count("|") == 11 for r in rows)
    # DGD's strict 9.34 cell stands for ε 10 (no hole at 10 beside it)
    dgd = [line for line in text.splitlines() if line.startswith("| dgd | default | mnist |")]
    assert any("| 9.34 |" in r for r in dgd) and not any("| 10 |" in r for r in dgd)
    # a release that misses a class (methods/chance.py) says which beside its accuracy
    blind = {**run, "chance_check": {"missed_classes": [1]}}
    assert "| 90.00 (misses class 1) |" in headline_table([blind])


def test_headline_shows_a_default_cell_nobody_ran_as_a_hole(monkeypatch):
    from privdistill.bench import report
    from privdistill.recipes import Recipe

    only = Recipe(summary="s", measured={("mnist", 1): "1 %"})
    monkeypatch.setattr(report, "recipes", lambda method: {"default": only})
    text = report.headline_table([])
    holes = [line for line in text.splitlines() if "not run yet" in line]
    assert any("| mnist | 10 |" in h for h in holes) and any("| fashion-mnist | 1 |" in h for h in holes)
    assert not any("| mnist | 1 |" in h for h in holes)  # measured: its recorded text, no hole
