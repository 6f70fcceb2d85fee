"""PATE's recipes (recipes/__init__.py). Every recipe covers the teachers' votes on the private part; the held-out
public slice is used directly (as in the PATE papers).

default: Confident-GNMax with the filter (Papernot et al. 2018): the best sum over the four measured cells
(docs/research-log.md, "PATE"); at ε = 10 the aggregators are within a run's spread, at ε = 1 one seed moves a
student trained on ~48 labels by many points.
"""

from privdistill.recipes import Recipe

DEFAULT = Recipe(
    summary="Confident-GNMax under an RDP filter: only queries the teachers agree on are answered",
    values={"pate": {"aggregation": "confident-gnmax", "filter": True}},
    measured={("mnist", 10): "96.02 %, strict 9.999", ("mnist", 1): "57.49 %, strict 0.998",
              ("fashion-mnist", 10): "79.87 %", ("fashion-mnist", 1): "60.99 %, strict 0.998"},
)

PAPER = Recipe(summary="GNMax (σ 40) on every query",
               measured={("mnist", 10): "95.17 %", ("mnist", 1): "69.14 %", ("fashion-mnist", 10): "80.24 %",
                         ("fashion-mnist", 1): "46.68 %"})

RECIPES = {"default": DEFAULT, "paper": PAPER}
