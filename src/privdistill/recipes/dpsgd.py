"""DP-SGD's recipes (recipes/__init__.py). Every recipe covers the whole model.

default: a linear head on ScatterNet features (Tramèr & Boneh 2021) projected onto directions whitened on images of
a random process (no data, no ε), trained with SGD at a constant rate (docs/research-log.md, "DP-SGD on ScatterNet
features"); on MNIST each example's gradient averaged over four affine copies before clipping (De et al. 2022), on
Fashion-MNIST the two-scale features. Seconds once the features are cached.
"""

from privdistill.recipes import Recipe

SCATTERNET = {"max_grad_norm": 0.1, "optimizer": "sgd", "momentum": 0.9, "lr_schedule": "constant"}
# the quickstart's head: ScatterNet features, no prior, no copies, ghost clipping (Opacus's: the same per-example
# clipping without per-example gradients, docs/benchmarks.md)
QUICKSTART = {**SCATTERNET, "model": "scatter-linear", "batch_size": 1024, "epochs": 5, "lr": 4.0, "augment": "none",
              "grad_sample_mode": "ghost"}

DEFAULT = Recipe(
    summary="ScatterNet features and a linear head, SGD at a constant rate (MNIST / Fashion-MNIST: their measured "
            "prior projections, MNIST with 4 affine copies)",
    values={"dpsgd": QUICKSTART},  # any other data: the quickstart's head (docs/results.md, "Data of your own")
    by_dataset={"mnist": {"dpsgd": {"model": "scatter-prior-linear", "augment": "affine", "augment_copies": 4,
                                    "batch_size": 512, "lr": 0.5, "grad_sample_mode": "hooks"}},
                "fashion-mnist": {"dpsgd": {"model": "scatter-multiscale-prior-linear", "augment": "none",
                                            "batch_size": 1024, "lr": 1.0, "grad_sample_mode": "hooks"}}},
    by_epsilon=((1.5, {"by_dataset": {"mnist": {"dpsgd": {"epochs": 3}}, "fashion-mnist": {"dpsgd": {"epochs": 5}}}}),
                (5.0, {"by_dataset": {"mnist": {"dpsgd": {"epochs": 8}}, "fashion-mnist": {"dpsgd": {"epochs": 10}}}}),
                (float("inf"), {"by_dataset": {"mnist": {"dpsgd": {"epochs": 5}},
                                               "fashion-mnist": {"dpsgd": {"epochs": 10}}}})),
    measured={("mnist", 1): "98.42 % (re-run; recorded 98.56, seed 1: 98.57), strict 0.998 / Opacus RDP 0.81, the "
                            "whole model",
              ("mnist", 10): "98.81 % (re-run; recorded 98.79), strict 9.998",
              ("fashion-mnist", 1): "88.31 % (re-run; recorded 88.18, five seeds: mean 87.94)",
              ("fashion-mnist", 10): "89.86 % (re-run; recorded 89.72), strict 9.996"},
)

SCATTERNET_PLAIN = Recipe(
    summary="the quickstart's: ScatterNet features and a linear head (no prior, no copies), batches of 1,024",
    values={"dpsgd": QUICKSTART},
    measured={("mnist", 1): "97.37 % (the recipe's command; 97.27-97.75 % over ten secure-noise runs, mean "
                            "97.47), strict 0.996"},
)

PAPER = Recipe(summary="Opacus on the paper CNN (the papers' DP-SGD baseline)",
               measured={("mnist", 1): "93.79 %", ("mnist", 10): "94.34 %", ("fashion-mnist", 1): "79.77 %",
                         ("fashion-mnist", 10): "79.84 %"})

RECIPES = {"default": DEFAULT, "paper": PAPER, "scatternet": SCATTERNET_PLAIN}
