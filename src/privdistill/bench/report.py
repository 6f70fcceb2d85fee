"""Markdown tables regenerated from the committed `results/<preset>/*.json`, side by side with the papers.

`docs/results.md` and the research log beside it (`docs/research-log.md`) hold blocks delimited by
`<!-- NAME:start -->` / `<!-- NAME:end -->`; `update_results_doc` rewrites only those blocks, each in the document
that holds its markers, so prose around them stays hand-written.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any, Callable, Iterable

from privdistill.bench.matrix import load_matrix, recipe_options
from privdistill.config import PRESETS
from privdistill.data import dataset_slug
from privdistill.privacy.report import guarantee
from privdistill.recipes import METHODS, recipes

# Accuracy the papers print (fractions), by (method, dataset, ε). Sources: DGD Table I (δ = 1e-5) and its
# baselines; DPDFD Table 1; SRR Table I.
PAPER = {
    ("baseline", "mnist", None): 0.992, ("baseline", "fashion-mnist", None): 0.910,
    ("dgd", "mnist", 10.0): 0.974, ("dgd", "mnist", 1.0): 0.736,
    ("dgd", "fashion-mnist", 10.0): 0.882, ("dgd", "fashion-mnist", 1.0): 0.649,
    ("dpdfd", "mnist", 1.0): 0.9512, ("dpdfd", "mnist", 10.0): 0.9751,
    ("dpdfd", "fashion-mnist", 1.0): 0.8386, ("dpdfd", "fashion-mnist", 10.0): 0.8988,
    ("srr", "mnist", 1.0): 0.9762, ("srr", "mnist", 10.0): 0.9856,
    ("srr", "fashion-mnist", 1.0): 0.8917, ("srr", "fashion-mnist", 10.0): 0.9074,
    # DP-SGD as reported by DPDFD (Table 4, MNIST; Table 2 gives 0.9500 at ε = 2). No paper prints DP-SGD on
    # Fashion-MNIST at these ε, nor PATE numbers at ε 1 / 10 (DGD's Fig. 7 plots PATE without a table).
    ("dpsgd", "mnist", 1.0): 0.9247,
}

# Ablations and variants the papers print as numbers, by (method, dataset, ε, variant): DPDFD Table 7
# (multi-teacher), Table 4 (direct training on private data), Table 5 (one L_G term removed); DGD Fig. 3's
# text (750 queries: 95.2 %). Figures read only from plots (DGD Fig. 3's other points, DPDFD Fig. 2) are left out.
PAPER_VARIANTS = {
    ("dpdfd", "mnist", 1.0, "multi-teacher"): 0.9321, ("dpdfd", "mnist", 10.0, "multi-teacher"): 0.9556,
    ("dpdfd", "fashion-mnist", 1.0, "multi-teacher"): 0.7993, ("dpdfd", "fashion-mnist", 10.0, "multi-teacher"): 0.8750,
    ("dpdfd", "mnist", 0.5, "direct"): 0.9377, ("dpdfd", "mnist", 0.7, "direct"): 0.9447,
    ("dpdfd", "mnist", 1.0, "direct"): 0.9762,
    ("dpdfd", "mnist", 10.0, "no-ce"): 0.9691, ("dpdfd", "mnist", 10.0, "no-ie"): 0.5463,
    ("dpdfd", "mnist", 10.0, "no-norm"): 0.9496,
    ("dpdfd", "fashion-mnist", 10.0, "no-ce"): 0.7649, ("dpdfd", "fashion-mnist", 10.0, "no-ie"): 0.5463,
    ("dpdfd", "fashion-mnist", 10.0, "no-norm"): 0.8806,
    ("dgd", "mnist", None, "q750"): 0.952,
}


def load_results(results_dir: str | Path = "results", preset: str | None = None) -> list[dict[str, Any]]:
    out = []
    for path in sorted(Path(results_dir).glob(f"{preset or '*'}/*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "method" in data:
            data["_file"] = str(path)
            out.append(data)
    return out


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.2f}"


def _eps(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return "∞" if x == float("inf") else f"{float(x):.3g}"


def _minutes(seconds: Any) -> str:
    return "-" if seconds is None else f"{float(seconds) / 60:.1f}"


def _cmd(r: dict) -> str:
    """The command that reproduces the row today: its bench cell's (a recorded command can change meaning when a
    default does, e.g. the budget's accounting), else the command the run recorded."""
    cell = _bench_cells(Path(r["_file"]).parent.name).get(Path(r["_file"]).stem) if "_file" in r else None
    if cell is not None:
        return "`" + " ".join(["privdistill", *(shlex.quote(a) for a in cell.args), "--record"]) + "`"
    return f"`{r.get('command', '')}`"


@functools.lru_cache(maxsize=None)
def _bench_cells(preset: str) -> dict[str, Any]:
    if preset not in PRESETS:
        return {}
    return {cell.name: cell for cell in load_matrix(preset).cells}


def table(rows: Iterable[Any], columns: list[tuple[str, Callable[[Any], str]]]) -> str:
    rows = list(rows)
    head = "| " + " | ".join(c for c, _ in columns) + " |\n| " + " | ".join("---" for _ in columns) + " |\n"
    return head + "".join("| " + " | ".join(f(r) for _, f in columns) + " |\n" for r in rows)


def _by_position(titles: tuple[str, ...]) -> list[tuple[str, Callable[[tuple], str]]]:
    """Columns showing a row tuple's items in order."""
    return [(title, lambda r, i=i: r[i]) for i, title in enumerate(titles)]


def _fmt(value, spec: str = "g") -> str:
    return "-" if value is None else format(value, spec)


def _col(title: str, key: str, fmt: Callable[[Any], str] = _fmt) -> tuple[str, Callable[[dict], str]]:
    """A column showing each row's `key` through `fmt`."""
    return title, lambda r: fmt(r.get(key))


def variant_label(r: dict) -> str:
    return r["method"] + (f" ({r['variant']})" if r.get("variant") else "")


def _file(r: dict) -> str:
    return f"[{Path(r['_file']).name}](../{r['_file']})"


# The columns most tables share.
DATASET, MODEL = ("dataset", lambda r: r["dataset"]), ("model", lambda r: r.get("model", "-"))
TARGET_EPS, ACCURACY = _col("target ε", "target_epsilon", _eps), _col("accuracy %", "test_accuracy", _pct)
EPS_PAPER, EPS_STRICT = _col("ε paper", "epsilon_paper", _eps), _col("ε strict", "epsilon_strict", _eps)
DELTA, MINUTES = _col("δ", "delta"), _col("minutes", "wall_seconds", _minutes)
COMMAND, FILE = ("command", _cmd), ("result file", _file)

# Per-method columns beside the common ones: what explains each number (evaluation-only statistics included).
METHOD_COLUMNS = {
    "dgd": [_col("queries", "queries"),
            ("query labels = baseline's % (eval only)",
             lambda r: _pct((r.get("query_agreement_with_baseline") or {}).get("noisy_label")))],
    "dpdfd": [_col("steps", "steps"), _col("σ", "sigma", lambda v: _fmt(v, ".3g")), _col("C", "clip_norm")],
    "srr": [("setting", lambda r: r.get("setting") or "-"), ("mechanism", lambda r: r.get("mechanism") or "-"),
            ("stages T", lambda r: _fmt(r.get("stages") if isinstance(r.get("stages"), int) else None)),
            ("correct labels % (eval only)",
             lambda r: _pct(r.get("label_accuracy_vs_teacher", r.get("label_accuracy_vs_truth")))),
            _col("mean candidate set", "mean_candidate_set_size", lambda v: _fmt(v, ".2f"))],
}


def _paper_pct(r: dict) -> str:
    """What the paper prints for this cell (a Table I cell, or a variant it reports as a number), or '-'."""
    key = (r["method"].rstrip("+"), r["dataset"], r.get("target_epsilon"))
    if r["method"] == "dpdfd" and r.get("algorithm") == 2:  # the paper's Table 7, whatever the run's label
        return _pct(PAPER_VARIANTS.get((*key, "multi-teacher")))
    if r.get("variant"):
        return _pct(PAPER_VARIANTS.get((*key, r["variant"])))
    return _pct(PAPER.get(key))


def method_table(results: list[dict], methods: tuple[str, ...]) -> str:
    rows = [r for r in results if r.get("method") in methods]
    rows.sort(key=lambda r: (r.get("method"), r.get("dataset"), -(r.get("target_epsilon") or 0),
                             r.get("variant") or ""))

    return table(rows, [("method", variant_label), DATASET, TARGET_EPS, ACCURACY, ("paper %", _paper_pct), EPS_PAPER,
                        EPS_STRICT, DELTA, MINUTES, *METHOD_COLUMNS.get(methods[0], []), FILE])


def update_block(text: str, name: str, content: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{content.rstrip()}\n{end}"
    if start in text and end in text:
        return re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    placeholder = f"<!-- {name} -->"
    if placeholder in text:
        return text.replace(placeholder, block)
    return text.rstrip() + f"\n\n{block}\n"


def _holds(text: str, name: str) -> bool:
    return f"<!-- {name}:start -->" in text or f"<!-- {name} -->" in text


def update_results_doc(doc: str | Path, blocks: dict[str, str], *, others: Iterable[str | Path] = ()) -> None:
    """Rewrite `blocks` in `doc`, except those whose markers only one of the existing `others` holds, rewritten
    there; a block no document holds is appended to `doc`."""
    path = Path(doc)
    texts = {path: path.read_text() if path.exists() else "# Results\n"}
    texts.update({Path(o): Path(o).read_text() for o in others if Path(o).exists() and Path(o) != path})
    for name, content in blocks.items():
        home = path if _holds(texts[path], name) else next((p for p, text in texts.items() if _holds(text, name)),
                                                           path)
        texts[home] = update_block(texts[home], name, content)
    for p, text in texts.items():
        if p == path or p.read_text() != text:
            p.write_text(text)


def baseline_table(results: list[dict]) -> str:
    rows = [r for r in results if r.get("method") == "baseline"]
    return table(rows, [
        DATASET, MODEL, ACCURACY, ("paper %", lambda r: _pct(PAPER.get(("baseline", r["dataset"], None)))),
        _col("training minutes", "wall_seconds", _minutes), ("device", lambda r: r.get("device", "-")), COMMAND, FILE,
    ])


def generator_table(results: list[dict]) -> str:
    rows = [r for r in results if r.get("method") == "generator"]
    return table(rows, [
        DATASET, ("loss", lambda r: r.get("loss", "-") + (f" ({r['variant']})" if r.get("variant") else "")),
        ("samples", lambda r: str(r.get("num_samples", "-"))),
        _col("student on synthetic only %", "test_accuracy", _pct), _col("teacher %", "baseline_accuracy", _pct),
        ("class-histogram entropy (of max)",
         lambda r: str(r.get("synthetic_quality", {}).get("histogram_entropy_normalised", "-"))),
        ("mean teacher confidence", lambda r: str(r.get("synthetic_quality", {}).get("mean_confidence", "-"))),
        _col("minutes (generator + student)", "wall_seconds", _minutes), COMMAND, FILE,
    ])


def teachers_table(results: list[dict]) -> str:
    rows = sorted((r for r in results if r.get("method") == "teachers"),
                  key=lambda r: (r["dataset"], r.get("num_teachers", 0)))
    return table(rows, [
        DATASET, ("teachers", lambda r: str(r.get("num_teachers"))),
        _col("plurality vote %", "ensemble_accuracy", _pct),
        _col("Laplace b=40 vote %", "noisy_ensemble_accuracy", _pct),
        _col("mean single teacher %", "mean_teacher_accuracy", _pct),
        _col("training minutes", "training_seconds", _minutes),
        _col("teachers/min", "teachers_per_minute", lambda v: "-" if v is None else str(v)), COMMAND, FILE,
    ])


def _num(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{float(x):.{digits}f}"


# The methods whose records state an ε (their summaries carry `not_covered`), in the tables' order.
DP_METHODS = ("dpsgd", "pate", "dgd", "dgd+", "dpdfd", "srr")


def _order(r: dict) -> tuple:
    methods = ["audit-control", "baseline", *DP_METHODS]
    m = r.get("method")
    return (r.get("dataset") or "", methods.index(m) if m in methods else len(methods), m or "",
            -(r.get("target_epsilon") or 0), r.get("variant") or "")


def dpsgd_table(results: list[dict]) -> str:
    """DP-SGD: ε under Opacus's RDP and PRV accountants (add/remove-one) and replace-one (strict)."""
    rows = sorted((r for r in results if r.get("method") == "dpsgd"), key=_order)

    def acc(title: str, key: str) -> tuple[str, Callable[[dict], str]]:
        return title, lambda r: _eps((r.get("dpsgd_accounting") or {}).get(key))

    return table(rows, [
        DATASET, MODEL, TARGET_EPS,
        ("σ calibrated on", lambda r: "strict" if r.get("accounting") == "strict" else "Opacus RDP"), ACCURACY,
        ("paper %", lambda r: _pct(PAPER.get(("dpsgd", r["dataset"], r.get("target_epsilon")))
                                   if r.get("model", "paper-cnn") == "paper-cnn" else None)),
        acc("σ", "noise_multiplier"), acc("steps", "steps"), acc("ε Opacus RDP", "epsilon_opacus_rdp"),
        acc("ε Opacus PRV", "epsilon_opacus_prv"), _col("ε strict (replace-one)", "epsilon_strict", _eps), DELTA,
        MINUTES, COMMAND, FILE,
    ])


def pate_table(results: list[dict]) -> str:
    """PATE: data-independent ε (headline) with the data-dependent bound beside it (not releasable)."""
    rows = sorted((r for r in results if r.get("method") == "pate"), key=_order)
    return table(rows, [
        DATASET,
        ("aggregator", lambda r: r.get("aggregation", "-") + (", RDP filter" if r.get("filter_budget") else "")),
        TARGET_EPS, ACCURACY,
        ("queries", lambda r: str(r.get("queries", "-")) + (f" (budget {r['filter_budget']})"
                                                            if r.get("filter_budget") else "")),
        ("answered", lambda r: str(r.get("answered", "-"))), _col("label accuracy %", "label_accuracy", _pct),
        EPS_PAPER, EPS_STRICT,
        _col("ε strict, answered only (odometer, not a guarantee)", "epsilon_realised_answered_only", _eps),
        _col("ε data-dependent (not releasable)", "epsilon_data_dependent", _eps), DELTA, MINUTES, COMMAND, FILE,
    ])


def audit_table(results: list[dict]) -> str:
    """Membership inference and inversion numbers of every audited model."""
    rows = sorted((r for r in results if r.get("mia_auc") is not None or (r.get("audit") or {}).get("inversion")),
                  key=_order)

    def attack(r: dict, name: str, key: str) -> str:
        a = (((r.get("audit") or {}).get("mia") or {}).get("attacks") or {}).get(name) or {}
        v = a.get(key)
        if v is None:
            return "-"
        ci = a.get(f"{key}_ci95")
        return f"{v:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    return table(rows, [
        ("model", variant_label), DATASET, TARGET_EPS, ACCURACY,
        ("LiRA AUC [95% CI]", lambda r: attack(r, "lira-online", "auc")),
        ("LiRA TPR@1%FPR [95% CI]", lambda r: attack(r, "lira-online", "tpr_at_1pct_fpr")),
        ("LiRA offline AUC", lambda r: attack(r, "lira-offline", "auc")),
        ("loss AUC", lambda r: attack(r, "loss", "auc")),
        ("loss TPR@1%FPR", lambda r: attack(r, "loss", "tpr_at_1pct_fpr")),
        ("inversion: corr. with class mean", lambda r: _num(((r.get("audit") or {}).get("inversion") or {})
                                                            .get("mean_correlation_with_class_mean"))),
        FILE,
    ])


def _covered(r: dict) -> str:
    """Whether every declared pathway from the private data to the released model is covered by the ε:
    from the summary's `not_covered`, else from the run's privacy.json (when the run directory is here)."""
    if r.get("method") == "baseline":
        return "no (no DP)"
    if "not_covered" in r:
        return "no" if r["not_covered"] else "yes"
    try:
        doc = json.loads((Path(r.get("run_dir") or "") / "privacy.json").read_text())
    except (OSError, ValueError):
        return "-"
    arts = doc.get("artifacts") or {}
    pathways = arts.get("student") or arts.get("model")
    if not pathways:
        return "-"
    return "yes" if all(p.get("covered") for p in pathways) else "no"


def bench_table(results: list[dict]) -> str:
    """The reproduction matrix side by side with the papers: every method, dataset and ε in one table."""
    rows = sorted((r for r in results if r.get("method") == "baseline" or r.get("method") in DP_METHODS),
                  key=_order)

    return table(rows, [
        DATASET, ("method", variant_label), TARGET_EPS, ACCURACY, ("paper %", _paper_pct), EPS_PAPER, EPS_STRICT,
        ("released model fully covered by ε", _covered), _col("MIA AUC", "mia_auc", _num),
        _col("MIA TPR@1%FPR", "mia_tpr_at_1pct_fpr", _num), MINUTES, FILE,
    ])


def strict_end_to_end_table(results: list[dict]) -> str:
    """Every method's best released model that is DP as a whole (privacy.report.guarantee: its strict ε covers
    every pathway from the private data to it), at strict ε <= 1, 3 and 10, one row per dataset and method."""
    whole = [r for r in results if r.get("method") in DP_METHODS and guarantee(r)[0]
             and isinstance(r.get("epsilon_strict"), (int, float))]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in whole:
        label = variant_label(r)
        if r.get("privacy_scope") == "end-to-end" and "end-to-end" not in label:
            label += " [end-to-end]"
        groups.setdefault((r["dataset"], label), []).append(r)

    def best(rs: list[dict], eps: float) -> dict | None:
        fits = [r for r in rs if r["epsilon_strict"] <= eps * 1.0005]
        return max(fits, key=lambda r: r.get("test_accuracy") or 0.0) if fits else None

    rows = []
    for (dataset, label), rs in sorted(groups.items()):
        top = best(rs, 10)
        if top is None:  # only runs above ε = 10 (DPDFD as the paper counts it): not a useful guarantee
            continue
        cells = []
        for eps in (1, 3, 10):
            r = best(rs, eps)
            cells.append("-" if r is None else f"{_pct(r.get('test_accuracy'))} (ε {_eps(r['epsilon_strict'])})")
        rows.append((dataset, label, *cells, _num(top.get("mia_auc"))))
    return table(rows, _by_position(("dataset", "method", "ε ≤ 1", "ε ≤ 3", "ε ≤ 10", "MIA AUC (at ε ≤ 10)")))


HEADLINE_DATASETS, HEADLINE_EPSILONS = ("mnist", "fashion-mnist"), (1.0, 10.0)


def _short_command(method: str, name: str, recipe, dataset: str, epsilon: float) -> str:
    """A recipe cell's command as a user types it (the bench matrix's recipe cells run the same options)."""
    return f"`{' '.join(['privdistill', method, '-d', dataset, '-e', f'{epsilon:g}', *recipe_options(name, recipe)])}`"


def _recipe_runs(results: list[dict]) -> dict[tuple[str, str, str, float], dict]:
    """{(method, recipe, dataset, ε): run} of the runs made by a recipe's own short command (a run with a variant
    label changed the recipe with --set)."""
    return {(r["method"].rstrip("+"), r["recipe"], dataset_slug(str(r["dataset"])), float(r["target_epsilon"])): r
            for r in results
            if r.get("recipe") is not None and r.get("target_epsilon") is not None and not r.get("variant")}


def headline_table(results: list[dict]) -> str:
    """Every recipe but the paper's × MNIST / Fashion-MNIST × ε 1 and 10 (the cells a recipe measured at another ε,
    e.g. DGD's strict 9.34, at that ε): the run recorded with the recipe's own short command where there is one (a
    summary naming its recipe), else the recipe's recorded best from before recipes existed, said so."""
    recorded = _recipe_runs(results)
    rows = []
    for method in METHODS:
        for name, recipe in recipes(method).items():
            if name == "paper":
                continue
            cells = {(d, float(e)) for d, e in recipe.measured} | {(d, e) for d in HEADLINE_DATASETS
                                                                  for e in HEADLINE_EPSILONS}
            for dataset, epsilon in sorted(cells, key=lambda c: (HEADLINE_DATASETS.index(c[0])
                                                                  if c[0] in HEADLINE_DATASETS else 9, c[1])):
                command = _short_command(method, name, recipe, dataset, epsilon)
                cell = (method, name, dataset, f"{epsilon:g}")
                r = recorded.get((method, name, dataset, epsilon))
                if r is not None:
                    rows.append((*cell, _pct(r.get("test_accuracy")) + _missed(r), _eps(r.get("epsilon_strict")),
                                 _eps(r.get("epsilon_paper")), f"whole model: {_covered(r)}",
                                 f"re-run with the recipe ({Path(r['_file']).name})", command))
                elif (dataset, epsilon) in recipe.measured or (dataset, int(epsilon)) in recipe.measured:
                    text = recipe.measured.get((dataset, epsilon), recipe.measured.get((dataset, int(epsilon))))
                    rows.append((*cell, text, "", "", recipe.guarantee,
                                 "recorded by a longer command (research log); not re-run with this one", command))
                elif name == "default" and not any(d == dataset and e != epsilon and abs(e / epsilon - 1) < 0.1
                                                   for d, e in cells):
                    # a hole in the headline matrix is shown, never skipped (a cell measured at a nearby ε, e.g.
                    # DGD's strict 9.34, stands for ε 10)
                    rows.append((*cell, "not measured", "", "", recipe.guarantee, "not run yet", command))
    return table(rows, _by_position(("method", "recipe", "dataset", "ε", "accuracy %", "strict ε", "paper ε",
                                     "what ε covers", "record", "command")))


def _missed(run: dict) -> str:
    """' (misses class 1)' where the run's chance check named classes its model misses (methods/chance.py)."""
    missed = (run.get("chance_check") or {}).get("missed_classes") or []
    return f" (misses class{'es' if len(missed) > 1 else ''} {', '.join(map(str, missed))})" if missed else ""


#: README's table: its methods in the order a reader meets them, each named as the papers write it
README_METHODS = {"dpsgd": "DP-SGD", "srr": "SRR", "dgd": "DGD", "pate": "PATE", "dpdfd": "DPDFD"}


def _recipe_cells(method: str, name: str, recipe, recorded: dict) -> list[tuple[str, float, str, dict | None]]:
    """(dataset, ε, accuracy %, run) of each headline cell (ε 1 and 10; a cell measured within 10 % of it, e.g.
    DGD's strict 9.34, stands for it): the recipe's own recorded run, else the leading number of its `measured`."""
    cells = []
    for dataset in HEADLINE_DATASETS:
        for nominal in HEADLINE_EPSILONS:
            run = next((r for (m, n, d, e), r in recorded.items()
                        if (m, n, d) == (method, name, dataset) and abs(e / nominal - 1) < 0.1), None)
            if run is not None:  # † marks a model that misses a class (README says so below the table)
                accuracy = _pct(run.get("test_accuracy")) + ("†" if _missed(run) else "")
                cells.append((dataset, float(run["target_epsilon"]), accuracy, run))
                continue
            measured = next(((float(e), text) for (d, e), text in recipe.measured.items()
                             if d == dataset and abs(float(e) / nominal - 1) < 0.1), None)
            number = re.match(r"\s*(\d+\.\d+) %", measured[1]) if measured else None
            cells.append((dataset, measured[0] if measured else nominal, number.group(1) if number else "–", None))
    return cells


def _pair(a: str, b: str) -> str:
    """'98.42 / 98.81 %', '97.60 % / –', '–'."""
    if a == b == "–":
        return "–"
    return f"{a} / {b} %" if "–" not in (a, b) else " / ".join(x if x == "–" else f"{x} %" for x in (a, b))


def readme_table(results: list[dict]) -> str:
    """README's recipe table: every recipe with a measured cell, its accuracy at ε 1 / 10 on MNIST and
    Fashion-MNIST, what its ε covers (with the strict ε where the cells are sized by the paper's), one command."""
    recorded = _recipe_runs(results)
    rows = []
    for method, title in README_METHODS.items():
        for name, recipe in recipes(method).items():
            cells = _recipe_cells(method, name, recipe, recorded)
            if all(acc == "–" for _, _, acc, _ in cells):
                continue
            pairs = [_pair(cells[i][2], cells[i + 1][2]) for i in (0, 2)]
            covers = recipe.covers
            runs = [run for _, _, _, run in cells[:2] if run is not None]
            if recipe.accounting == "paper":
                strict = " / ".join(f"{r['epsilon_strict']:.3g}" if r["epsilon_strict"] < 1000
                                    else f"{r['epsilon_strict']:.2g}".replace("e+0", "e") for r in runs)
                covers += f" (paper ε; strict {strict})" if runs else " (paper ε)"
            elif any(e not in HEADLINE_EPSILONS for _, e, acc, _ in cells if acc != "–"):
                covers += f" (strict ε {' / '.join(f'{e:g}' for _, e, acc, _ in cells[:2] if acc != '–')})"
            dataset, epsilon = next((d, e) for d, e, acc, _ in cells if acc != "–")
            rows.append((title, name, covers, *pairs, _short_command(method, name, recipe, dataset, epsilon)))
    return table(rows, _by_position(("method", "recipe", "what its ε covers", "MNIST ε 1 / 10",
                                     "Fashion-MNIST ε 1 / 10", "command")))


def regenerate(results_dir: str | Path = "results", doc: str | Path = "docs/results.md") -> list[str]:
    """Rewrite every generated block of docs/results.md and of the research log beside it (research-log.md)
    from results/*/*.json; returns the block names."""
    blocks = {}
    # only results/<preset>/ of a known preset: other folders (results/superseded/, numbers a later fix made
    # obsolete and cited by hand in the research log) are not tables
    for preset in sorted(p for p in PRESETS if (Path(results_dir) / p).is_dir()):
        results = load_results(results_dir, preset)
        blocks[f"baseline-{preset}"] = baseline_table(results)
        blocks[f"generator-{preset}"] = generator_table(results)
        blocks[f"teachers-{preset}"] = teachers_table(results)
        for method in ("dgd", "dpdfd", "srr"):
            blocks[f"{method}-{preset}"] = method_table(results, (method, f"{method}+"))
        blocks[f"dpsgd-{preset}"] = dpsgd_table(results)
        blocks[f"pate-{preset}"] = pate_table(results)
        blocks[f"audits-{preset}"] = audit_table(results)
        blocks[f"bench-{preset}"] = bench_table(results)
        blocks[f"strict-e2e-{preset}"] = strict_end_to_end_table(results)
    quick = load_results(results_dir, "quick")
    blocks["headline"] = headline_table(quick)
    readme = Path(doc).parent.parent / "README.md"
    if readme.exists() and _holds(readme.read_text(), "readme-recipes"):  # the repository's README, not a copy's
        blocks["readme-recipes"] = readme_table(quick)
    update_results_doc(doc, blocks, others=[Path(doc).with_name("research-log.md"), readme])
    regenerate_benchmarks(results_dir, Path(doc).parent / "benchmarks.md")
    return sorted(blocks)


def teacher_speed_table(bench_json: str | Path) -> str:
    """The `privdistill bench teachers` result as a table (docs/benchmarks.md)."""
    r = json.loads(Path(bench_json).read_text())
    intro = (f"{r['num_teachers']} {r['model']} teachers on {r['dataset']}, {r['steps_measured']} steps of batch "
             f"{r['batch_size']} each, on {r['device']}; projected to the paper's {r['full_steps']}-step schedule.\n\n")
    return intro + table(r["rows"], [
        ("trainer", lambda x: x["trainer"]), ("wall s", lambda x: str(x["wall_seconds"])),
        ("samples/s", lambda x: str(x["samples_per_second"])),
        ("teacher-steps/s", lambda x: str(x["teacher_steps_per_second"])),
        ("teachers/min at the full schedule", lambda x: str(x["teachers_per_minute_at_full_schedule"])),
        ("full schedule, projected", lambda x: f"{x['projected_full_schedule_minutes'] / 60:.1f} h"),
    ])


def regenerate_benchmarks(results_dir: str | Path = "results", doc: str | Path = "docs/benchmarks.md") -> None:
    blocks = {}
    for path in sorted(Path(results_dir).glob("*/bench/teachers-*.json")):
        blocks[f"teachers-bench-{path.parts[-3]}-{path.stem}"] = teacher_speed_table(path)
    if blocks:
        text = Path(doc).read_text() if Path(doc).exists() else "# Benchmarks\n"
        marker = "<!-- teachers-bench -->"
        for name, content in blocks.items():
            if f"<!-- {name}:start -->" not in text and marker in text:
                text = text.replace(marker, f"<!-- {name} -->\n\n{marker}")
            text = update_block(text, name, content)
        Path(doc).write_text(text)
