"""SRR's recipes (recipes/__init__.py). Data-free SRR's ε covers the released labels; the teacher and the
generator fitted to it are not covered (as in the paper). `label-dp` is the paper's Table II setting (private
inputs used directly, labels protected); `end-to-end` covers the whole model.

default: the staged schedule measured best at ε = 1 (docs/research-log.md, "The ε = 1 cells with the staged
prior"): four stages, a quarter of the labels in the first (no prior), the student trained on every label drawn so
far by the mechanism's likelihood, its weights averaged (EMA 0.995).
"""

from privdistill.recipes import ADVERSARIAL_GENERATOR, Recipe

STAGED = {"stages": 4, "first_stage_fraction": 0.25, "student_data": "cumulative", "loss": "likelihood",
          "epochs_per_stage": 4, "student_ema": 0.995, "eval_every_stages": 1}

DEFAULT = Recipe(
    accounting="paper", covers="the labels, ε per label",
    summary="four stages, the student's own prior from the second, likelihood loss, weight average",
    values={"srr": STAGED},
    measured={("mnist", 1): "87.50 % (re-run on the Xeon, every stage rebuilt; on the AMD EPYC 94.16 % the same way, "
                            "recorded 94.73, seeds 94.74, 94.52), paper ε 1 per label, the labels only",
              ("mnist", 10): "98.50 %, paper ε 10 per label (the paper's schedule: 97.84 %)",
              ("fashion-mnist", 1): "73.04 % (re-run; recorded 74.61), paper ε 1 per label",
              ("fashion-mnist", 10): "84.57 % (re-run; recorded 84.45)"},
)

PAPER = Recipe(
    accounting="paper", covers="the labels, ε per label",
    summary="the paper's 20 equal stages, each student trained alone by cross-entropy",
    measured={("mnist", 1): "71.08 %", ("mnist", 10): "97.84 %", ("fashion-mnist", 1): "57.26 %",
              ("fashion-mnist", 10): "81.03 %"},
)

LABEL_DP = Recipe(
    summary="label-DP (Table II's setting): the private images used directly, each label released once by SRR",
    guarantee="the labels only: the private inputs are used directly (as in the paper's Table II)",
    covers="the labels; inputs used directly",
    values={"srr": {"setting": "label-dp", "mechanism": "srr", "stages": 2, "first_stage_fraction": 0.5,
                    "student_data": "cumulative", "loss": "likelihood", "epochs_per_stage": 4,
                    "eval_every_stages": 1}},
    measured={("mnist", 1): "97.03 % (re-run; recorded 97.02, seed 1: 97.12), ε 1 per label (strict = paper)",
              ("fashion-mnist", 1): "86.44 % (re-run; recorded 86.98)"},
)

END_TO_END = Recipe(
    summary="one ε for the whole model: a DP-SGD teacher on ScatterNet features and DP feature statistics",
    guarantee="the whole released model (no pathway left uncovered)",
    values={"budget": {"privacy": "end-to-end"}, "srr": {"loss": "soft", "num_samples": 180_000},
            "srr_generator": ADVERSARIAL_GENERATOR},
    by_dataset={"mnist": {"dp_source": {"model": "scatter-prior-linear", "augment": "affine", "augment_copies": 4,
                                        "batch_size": 512, "lr": 0.5}},
                "fashion-mnist": {"dp_source": {"model": "scatter-multiscale-prior-linear", "lr": 1.0}}},
    by_epsilon=((1.5, {"by_dataset": {"mnist": {"dp_source": {"epochs": 3}},
                                      "fashion-mnist": {"dp_source": {"epochs": 5}}}}),
                (float("inf"), {"by_dataset": {"mnist": {"dp_source": {"epochs": 8}},
                                               "fashion-mnist": {"dp_source": {"epochs": 10}}}})),
    measured={("mnist", 1): "97.60 % (the recipe's command; recorded 97.70), strict 0.9955, the whole model",
              ("mnist", 3): "98.24 % (the recipe's command; recorded 98.31), strict 2.994",
              ("fashion-mnist", 1): "84.52 % (the recipe's command; recorded 85.08), strict 0.9966",
              ("fashion-mnist", 3): "86.79 % (the recipe's command; recorded 86.80), strict 2.995"},
)

RECIPES = {"default": DEFAULT, "paper": PAPER, "label-dp": LABEL_DP, "end-to-end": END_TO_END}
