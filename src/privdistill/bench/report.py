"""Markdown tables regenerated from the committed `results/<preset>/*.json`, side by side with the papers.

`docs/results.md` holds blocks delimited by `<!-- NAME:start -->` / `<!-- NAME:end -->`; `update_results_doc`
rewrites only those blocks, so prose around them stays hand-written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

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
    return f"`{r.get('command', '')}`"


def table(rows: Iterable[dict], columns: list[tuple[str, Callable[[dict], str]]]) -> str:
    rows = list(rows)
    head = "| " + " | ".join(c for c, _ in columns) + " |\n| " + " | ".join("---" for _ in columns) + " |\n"
    return head + "".join("| " + " | ".join(f(r) for _, f in columns) + " |\n" for r in rows)


def method_table(results: list[dict], methods: tuple[str, ...]) -> str:
    rows = [r for r in results if r.get("method") in methods]
    rows.sort(key=lambda r: (r.get("method"), r.get("dataset"), -(r.get("target_epsilon") or 0), r.get("variant") or ""))

    def paper(r: dict) -> str:
        if r.get("variant"):
            return "-"
        key = (r["method"].rstrip("+"), r["dataset"], r.get("target_epsilon"))
        return _pct(PAPER.get(key))

    return table(rows, [
        ("method", lambda r: r["method"] + (f" ({r['variant']})" if r.get("variant") else "")),
        ("dataset", lambda r: r["dataset"]),
        ("target ε", lambda r: _eps(r.get("target_epsilon"))),
        ("accuracy %", lambda r: _pct(r.get("test_accuracy"))),
        ("paper %", paper),
        ("ε paper", lambda r: _eps(r.get("epsilon_paper"))),
        ("ε strict", lambda r: _eps(r.get("epsilon_strict"))),
        ("δ", lambda r: "-" if r.get("delta") is None else f"{r['delta']:g}"),
        ("minutes", lambda r: _minutes(r.get("wall_seconds"))),
        ("result file", lambda r: f"[{Path(r['_file']).name}](../{r['_file']})"),
    ])


def update_block(text: str, name: str, content: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{content.rstrip()}\n{end}"
    if start in text and end in text:
        return re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    placeholder = f"<!-- {name} -->"
    if placeholder in text:
        return text.replace(placeholder, block)
    return text.rstrip() + f"\n\n{block}\n"


def update_results_doc(doc: str | Path, blocks: dict[str, str]) -> None:
    path = Path(doc)
    text = path.read_text() if path.exists() else "# Results\n"
    for name, content in blocks.items():
        text = update_block(text, name, content)
    path.write_text(text)


def baseline_table(results: list[dict]) -> str:
    rows = [r for r in results if r.get("method") == "baseline"]
    return table(rows, [
        ("dataset", lambda r: r["dataset"]), ("model", lambda r: r.get("model", "-")),
        ("accuracy %", lambda r: _pct(r.get("test_accuracy"))),
        ("paper %", lambda r: _pct(PAPER.get(("baseline", r["dataset"], None)))),
        ("training minutes", lambda r: _minutes(r.get("wall_seconds"))), ("device", lambda r: r.get("device", "-")),
        ("command", _cmd), ("result file", lambda r: f"[{Path(r['_file']).name}](../{r['_file']})"),
    ])


def generator_table(results: list[dict]) -> str:
    rows = [r for r in results if r.get("method") == "generator"]
    return table(rows, [
        ("dataset", lambda r: r["dataset"]), ("loss", lambda r: r.get("loss", "-")),
        ("samples", lambda r: str(r.get("num_samples", "-"))),
        ("student on synthetic only %", lambda r: _pct(r.get("test_accuracy"))),
        ("teacher %", lambda r: _pct(r.get("baseline_accuracy"))),
        ("class-histogram entropy (of max)", lambda r: str(r.get("synthetic_quality", {}).get("histogram_entropy_normalised", "-"))),
        ("mean teacher confidence", lambda r: str(r.get("synthetic_quality", {}).get("mean_confidence", "-"))),
        ("minutes (generator + student)", lambda r: _minutes(r.get("wall_seconds"))),
        ("command", _cmd), ("result file", lambda r: f"[{Path(r['_file']).name}](../{r['_file']})"),
    ])


def teachers_table(results: list[dict]) -> str:
    rows = sorted((r for r in results if r.get("method") == "teachers"), key=lambda r: (r["dataset"], r.get("num_teachers", 0)))
    return table(rows, [
        ("dataset", lambda r: r["dataset"]), ("teachers", lambda r: str(r.get("num_teachers"))),
        ("plurality vote %", lambda r: _pct(r.get("ensemble_accuracy"))),
        ("Laplace b=40 vote %", lambda r: _pct(r.get("noisy_ensemble_accuracy"))),
        ("mean single teacher %", lambda r: _pct(r.get("mean_teacher_accuracy"))),
        ("training minutes", lambda r: _minutes(r.get("training_seconds"))),
        ("teachers/min", lambda r: str(r.get("teachers_per_minute", "-"))),
        ("command", _cmd), ("result file", lambda r: f"[{Path(r['_file']).name}](../{r['_file']})"),
    ])


def regenerate(results_dir: str | Path = "results", doc: str | Path = "docs/results.md") -> list[str]:
    """Rewrite every generated block of docs/results.md from results/*/*.json; returns the block names."""
    blocks = {}
    for preset in sorted(p.name for p in Path(results_dir).iterdir() if p.is_dir()) if Path(results_dir).is_dir() else []:
        results = load_results(results_dir, preset)
        blocks[f"baseline-{preset}"] = baseline_table(results)
        blocks[f"generator-{preset}"] = generator_table(results)
        blocks[f"teachers-{preset}"] = teachers_table(results)
        for method in ("dgd", "dpdfd", "srr"):
            blocks[f"{method}-{preset}"] = method_table(results, (method, f"{method}+"))
    update_results_doc(doc, blocks)
    return sorted(blocks)
