"""Recipes: a method's named, measured configurations, one file per method (recipes/<method>.py).

A recipe is the configuration values that made a recorded result, on top of a preset (the scale: `quick`, `paper`).
`privdistill METHOD -d D -e ε` runs the `default` recipe: the best measured one that keeps the guarantee the method's
paper claims. `paper` is the paper-literal recipe (an empty one); others are named for what they add, and one that
leaves a further pathway uncovered says so in its `guarantee` and is never the default. `--recipe NAME` picks one.

Resolution order, later winning: dataclass defaults < preset < preset's `by_dataset` block < recipe < recipe's
`by_dataset` block < recipe's `by_epsilon` block for the target ε < the user's --config file < --set.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from privdistill.errors import ConfigError

#: the methods with recipes, each in recipes/<name>.py as RECIPES = {name: Recipe}
METHODS = ("dgd", "dpdfd", "srr", "pate", "dpsgd")
DEFAULT, PAPER = "default", "paper"


#: adversarial synthesis (DeepInversion's BN statistics of a BN baseline, class targets, the student in the loop:
#: docs/research-log.md, "Samples that teach"), the generator DGD's default and SRR's end-to-end recipes fit
ADVERSARIAL_GENERATOR = {"loss": "srr", "alpha": 0.0, "beta": 3.0, "class_targets": True, "adversarial_weight": 3.0,
                         "width": 64, "batch_size": 128, "lr": 0.001, "lr_decay": 1.0, "rounds": 12,
                         "steps_per_round": 100}


@dataclass(frozen=True)
class Recipe:
    """`values`: {section: {key: value}}; `by_dataset`: {dataset: {section: {key: value}}}; `by_epsilon`: a list of
    (ε_upper, {section: {key: value}, by_dataset: ...}), the first whose ε_upper >= the target ε applies (sizes
    that depend on the budget, e.g. DP-SGD's epochs); `summary`: one line; `guarantee`: what its ε covers against
    the paper's recipe; `covers`: the same in a few words (README's table; tests/test_report.py holds it to the
    recorded runs' uncovered pathways); `measured`: {(dataset, ε): "accuracy, ε under both accountings, where it is
    recorded"};
    `accounting`: the one its measured ε are targets of (the paper's for a method whose strict ε is no guarantee)."""

    summary: str
    guarantee: str = "the same pathways as the paper's recipe"
    covers: str = "the whole model"
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_dataset: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    by_epsilon: tuple[tuple[float, dict[str, dict[str, Any]]], ...] = ()
    measured: dict[tuple[str, float], str] = field(default_factory=dict)
    accounting: str = "strict"  # the accounting its measured cells were sized under (their command says so)

    def layers(self, dataset: str | None, epsilon: float | None, *,
               dataset_only: bool = False) -> list[dict[str, dict[str, Any]]]:
        """The recipe's configuration layers for this dataset and target ε, in the order they apply (an ε block
        may hold its own `by_dataset`); `dataset_only`: only the blocks written for this dataset (measured on it)."""
        out = [] if dataset_only else [self.values]
        if dataset:
            out.append(self.by_dataset.get(dataset, {}))
        if epsilon is not None:
            for upper, block in self.by_epsilon:
                if epsilon <= upper:
                    if not dataset_only:
                        out.append({k: v for k, v in block.items() if k != "by_dataset"})
                    if dataset:
                        out.append((block.get("by_dataset") or {}).get(dataset, {}))
                    break
        return out


def recipes(method: str) -> dict[str, Recipe]:
    """The method's recipes by name ({} for a command without recipes: baseline training, stages)."""
    if method not in METHODS:
        return {}
    return importlib.import_module(f"privdistill.recipes.{method}").RECIPES


def recipe_layers(method: str, name: str | None, dataset: str | None, epsilon: float | None, *,
                  dataset_only: bool = False) -> list[dict[str, dict[str, Any]]]:
    """The configuration layers of `method`'s recipe `name` (None: the default), or a ConfigError naming the
    recipes there are. `dataset_only`: the layers written for `dataset` alone (Recipe.layers)."""
    known = recipes(method)
    if not known:  # baseline training, the shared stages: their presets are all there is
        if name not in (None, DEFAULT, PAPER):
            raise ConfigError(f"{method} has no recipes (--recipe {name}): its presets are its paper's values")
        return []
    name = name or DEFAULT  # run.recipe's own default is "default"
    if name not in known:
        raise ConfigError(f"{method} has no recipe {name!r}; its recipes: {', '.join(known)} "
                          f"(privdistill recipes {method})")
    return known[name].layers(dataset, epsilon, dataset_only=dataset_only)
