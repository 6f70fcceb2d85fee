"""Recipes (recipes/): the default is what a bare `privdistill METHOD -d D -e ε` runs, `--recipe` / `recipe=` pick
another, dataset- and ε-specific values apply where they should, and the user's own values still win."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from privdistill.cli import get_app
from privdistill.config import RunOptions, resolve_sections
from privdistill.errors import ConfigError
from privdistill.methods.dpsgd import DPSGDConfig
from privdistill.recipes import METHODS, recipe_layers, recipes


def _dpsgd(dataset, epsilon, name=None, overrides=None):
    layers = recipe_layers("dpsgd", name, dataset, epsilon)
    return resolve_sections({"run": RunOptions, "dpsgd": DPSGDConfig}, preset="quick", dataset=dataset,
                            overrides=overrides, recipe=layers)["dpsgd"]


def test_every_method_has_a_default_and_a_paper_recipe_and_the_paper_one_is_the_presets():
    for method in METHODS:
        known = recipes(method)
        assert {"default", "paper"} <= set(known), method
        assert known["paper"].values == {} and known["paper"].by_dataset == {}, "paper = the presets' own values"
        for name, recipe in known.items():
            assert recipe.summary and recipe.guarantee, (method, name)
        # a recipe that leaves a further pathway uncovered is never the default
        assert known["default"].guarantee == "the same pathways as the paper's recipe", method


def test_the_default_recipe_sets_dataset_and_epsilon_specific_values():
    mnist1, mnist10 = _dpsgd("mnist", 1.0), _dpsgd("mnist", 10.0)
    fashion1 = _dpsgd("fashion-mnist", 1.0)
    assert mnist1.model == "scatter-prior-linear" and mnist1.augment_copies == 4 and mnist1.epochs == 3
    assert mnist10.epochs == 5
    assert fashion1.model == "scatter-multiscale-prior-linear" and fashion1.epochs == 5
    paper = _dpsgd("mnist", 1.0, "paper")
    assert paper.model == "paper-cnn", "the paper recipe leaves the preset's values"
    assert _dpsgd("mnist", 1.0, overrides=["dpsgd.epochs=7"]).epochs == 7, "--set beats the recipe"


def test_dgd_names_clusters_of_a_batchnorm_statistics_pool_on_fashion_mnist_at_every_epsilon():
    from privdistill.methods.dgd import DGDMethod

    def dgd(dataset, epsilon):
        return resolve_sections({"run": RunOptions, **DGDMethod.sections}, preset="quick", dataset=dataset,
                                recipe=recipe_layers("dgd", None, dataset, epsilon))

    for epsilon, pool, steps in ((1.0, 60_000, 1500), (9.34, 240_000, 6000)):
        fashion = dgd("fashion-mnist", epsilon)
        assert fashion["generator"].adversarial_weight == 0 and not fashion["generator"].class_targets
        assert fashion["generator"].alpha is None and fashion["baseline"].epochs == 5
        assert fashion["dgd"].query_selection == "clusters" and fashion["dgd"].spread_pool == pool
        assert fashion["student"].steps == steps and fashion["student"].model == "paper-cnn-bn"
    mnist1, mnist10 = dgd("mnist", 1.0), dgd("mnist", 9.34)
    assert mnist1["generator"].adversarial_weight == 3.0 and mnist1["dgd"].query_selection == "clusters"
    assert mnist10["dgd"].query_selection == "diverse", "MNIST above ε 2: the k-center cover and its histograms"


def test_dpdfd_releases_the_students_weight_average_by_default_and_the_last_iterate_as_the_paper():
    from privdistill.methods.dpdfd import DPDFDMethod

    def dpdfd(dataset, name=None):
        return resolve_sections({"run": RunOptions, **DPDFDMethod.sections}, preset="quick", dataset=dataset,
                                recipe=recipe_layers("dpdfd", name, dataset, 10.0))["dpdfd"]

    for dataset in ("mnist", "fashion-mnist", None):  # None: data of one's own (Algorithm 1, still averaged)
        assert dpdfd(dataset).student_ema == 0.98
    assert dpdfd("mnist").algorithm == 2 and dpdfd(None).algorithm == 1
    assert dpdfd("mnist", "paper").student_ema == 0.0 and dpdfd("mnist", "teacher-generator").student_ema == 0.0


def test_an_unknown_recipe_names_the_ones_there_are():
    with pytest.raises(ConfigError, match="default, paper"):
        recipe_layers("dpsgd", "best", "mnist", 1.0)


def test_the_command_line_and_the_python_api_take_the_recipe(tiny_npz, tmp_path):
    runner = CliRunner()
    run_dir = tmp_path / "dry"
    result = runner.invoke(get_app(), ["pate", "-d", f"npz:{tiny_npz}", "-e", "10", "--dry-run", "--recipe",
                                       "nonsense"])
    assert result.exit_code != 0 and "no recipe 'nonsense'" in str(result.exception or result.output)
    from privdistill.methods.pate import PATE

    request = PATE(f"npz:{tiny_npz}", recipe="paper", run_dir=str(run_dir)).request()
    assert request.overrides["run.recipe"] == "paper"
    from privdistill.methods.common import prepare_run
    from privdistill.methods.pate import PATEConfig

    prep = prepare_run("pate", request, {"pate": PATEConfig})
    config = yaml.safe_load((run_dir / "config.yaml").read_text())["config"]
    assert config["run"]["recipe"] == "paper" and prep.sections["pate"].aggregation == "gnmax"
    default = PATE(f"npz:{tiny_npz}", run_dir=str(tmp_path / "default")).request()
    assert prepare_run("pate", default, {"pate": PATEConfig}).sections["pate"].aggregation == "confident-gnmax"
