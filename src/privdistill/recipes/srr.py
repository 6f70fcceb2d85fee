"""srr's recipes (recipes/__init__.py): `default` is the best measured one that keeps the paper's guarantee."""

from privdistill.recipes import Recipe

PAPER = Recipe(summary="the paper's recipe (the presets' own values)")

RECIPES = {"default": PAPER, "paper": PAPER}
