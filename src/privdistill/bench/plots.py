"""Figures of the reproduction benchmark (matplotlib, Agg), written to docs/figures/: accuracy against ε per method
(`accuracy-vs-epsilon-<preset>.png`: models DP as a whole at their strict ε on top, the others at their target ε),
DGD's accuracy against queries (Fig. 3), ε against answered queries (Fig. 8, from the accountants alone), LiRA ROC
curves, model-inversion grids, synthetic-sample grids, and SRR's stage-by-stage runs at ε <= 1.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np

from privdistill.audits.metrics import roc_curve
from privdistill.bench.report import load_results, variant_label
from privdistill.privacy.accounting import epsilon
from privdistill.privacy.events import GaussianQueries, LaplaceOnSyntheticCodes, LaplaceQueries
from privdistill.privacy.report import guarantee


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path, dpi: int = 120) -> Path:
    """Lay out, write (creating the folder) and close a figure."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)
    return path


def _colours(names) -> dict[str, tuple]:
    """One distinct colour per series name, the same in every panel (tab20 has 20; more names repeat)."""
    cmap = _plt().get_cmap("tab20")
    return {name: cmap(i % 20) for i, name in enumerate(sorted(set(names)))}


# A guarantee at a strict ε above this bounds the odds ratio by more than e^100: it says nothing. Such runs (DPDFD's
# single teacher, 3e4-7e4) would squash the axis that DP-SGD and the end-to-end methods share near ε = 1-10, so the
# top panels name them instead of plotting them (their numbers stay in the tables).
PLOTTED_MAX_EPSILON = 100.0


def accuracy_vs_epsilon(results: list[dict], path: str | Path) -> Path | None:
    """Two rows of panels, one column per dataset, never one ε axis for two kinds of ε:
    top, the models that are DP as a whole (privacy.report.guarantee), at their strict ε; bottom, the others
    (DGD, data-free SRR, label-DP, paper-accounting runs) at the target ε they were sized for, which is not a
    guarantee for the whole model."""
    rows = [r for r in results if r.get("test_accuracy") is not None and r.get("target_epsilon") is not None]
    # the Table I cells, plus variants that form a curve (e.g. DPDFD direct at three ε); one-point ablations
    # would only clutter the legend (they are in the tables)
    points = Counter((variant_label(r), r["dataset"]) for r in rows)
    rows = [r for r in rows if not r.get("variant") or points[(variant_label(r), r["dataset"])] > 1]
    baselines = {r["dataset"]: r["test_accuracy"] for r in results if r.get("method") == "baseline"}
    datasets = sorted({r["dataset"] for r in rows} | set(baselines))
    if not rows or not datasets:
        return None
    whole = [guarantee(r)[0] and isinstance(r.get("epsilon_strict"), (int, float)) for r in rows]
    # one colour per series within a row of panels (the same in both datasets' panels): over both rows there are
    # more series than tab20 has colours, and a repeated colour within one panel would mislabel a curve
    colours = {w: _colours(variant_label(r) for r, rw in zip(rows, whole) if rw == w) for w in (True, False)}
    plt = _plt()
    fig, axes = plt.subplots(2, len(datasets), figsize=(5 * len(datasets) + 2.6, 8), squeeze=False)
    panels = (("DP as a whole: strict ε (replace-one, δ = 1e-5)", True),
              ("NOT DP as a whole (or label-DP): target ε it was sized for", False))
    for row, (what, is_whole) in enumerate(panels):
        for ax, ds in zip(axes[row], datasets):
            series: dict[str, list[tuple[float, float]]] = {}
            vacuous: set[str] = set()
            for r, w in zip(rows, whole):
                if r["dataset"] == ds and w == is_whole:
                    eps = float(r["epsilon_strict"] if is_whole else r["target_epsilon"])
                    if is_whole and eps > PLOTTED_MAX_EPSILON:
                        vacuous.add(variant_label(r))
                        continue
                    series.setdefault(variant_label(r), []).append((eps, 100 * float(r["test_accuracy"])))
            if vacuous:
                ax.text(0.02, 0.12, f"not plotted, strict ε > {PLOTTED_MAX_EPSILON:g}: " + ", ".join(sorted(vacuous)),
                        transform=ax.transAxes, fontsize=7, va="bottom", wrap=True)
            for name, pts in sorted(series.items()):
                pts.sort()
                colour = colours[is_whole][name]
                ax.plot(*zip(*pts), "o-" if is_whole else "s--", label=name, color=colour,
                        mfc=colour if is_whole else "white")
            if ds in baselines:
                ax.axhline(100 * baselines[ds], color="k", ls=":", lw=1, label="non-private baseline")
            ax.set(xscale="log", xlabel=what, ylabel="test accuracy %", title=ds)
            ax.grid(alpha=0.3)
            if series or ds in baselines:
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)


def dgd_accuracy_vs_queries(results: list[dict], path: str | Path) -> Path | None:
    """DGD Fig. 3: student accuracy against the number of labelled queries (generator inputs, no ablation)."""
    rows = [r for r in results if r.get("method") == "dgd" and r.get("queries") and r.get("test_accuracy") is not None
            and (not r.get("variant") or str(r["variant"]).startswith("q"))]
    if len(rows) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for ds in sorted({r["dataset"] for r in rows}):
        pts = sorted((int(r["queries"]), 100 * float(r["test_accuracy"]), r.get("epsilon_strict")) for r in rows
                     if r["dataset"] == ds)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=ds)
        for q, acc, eps in pts:
            if eps is not None:
                ax.annotate(f"ε {eps:.3g}", (q, acc), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set(xscale="log", xlabel="labelled queries |D̂s| (ε: strict, vote channel only)", ylabel="test accuracy %",
           title="DGD: accuracy vs queries (Fig. 3)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def privacy_vs_queries(path: str | Path, *, max_queries: int = 1500, delta: float = 1e-5,
                       laplace_scale: float = 40.0, sigma: float = 40.0) -> Path:
    """DGD Fig. 8 (bottom right): privacy cost against the number of queries, from the accountants."""
    qs = np.unique(np.r_[1, np.linspace(10, max_queries, 40).astype(int), 27, 1300])
    curves = {
        f"DGD paper formula (LNMax b={laplace_scale:g}, + ε1 = 0.01)":
            [epsilon([LaplaceQueries(scale=laplace_scale, count=int(q)), LaplaceOnSyntheticCodes(epsilon1=0.01)],
                     delta=delta, accounting="paper", breakdown=False).value for q in qs],
        f"strict RDP, LNMax b={laplace_scale:g}":
            [epsilon(LaplaceQueries(scale=laplace_scale, count=int(q)), delta=delta, breakdown=False).value
             for q in qs],
        f"strict RDP, GNMax σ={sigma:g}":
            [epsilon(GaussianQueries(sigma=sigma, count=int(q)), delta=delta, breakdown=False).value for q in qs],
        f"PATE 2018 conversion, GNMax σ={sigma:g}":
            [epsilon(GaussianQueries(sigma=sigma, count=int(q)), delta=delta, accounting="paper", breakdown=False).value
             for q in qs],
    }
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, eps in curves.items():
        ax.plot(qs, eps, label=name)
    for q, e in ((27, 1.0), (1300, 10.0)):
        ax.plot([q], [e], "k*", ms=9)
    ax.annotate("DGD Table I: ε=1 at 27, ε=10 at 1300 queries", (1300, 10), textcoords="offset points",
                xytext=(-230, 20), fontsize=7)
    ax.set(xlabel="number of answered queries", ylabel=f"ε (δ = {delta:g})",
           title="Privacy cost vs queries (DGD Fig. 8, bottom right)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _with_epsilon(r: dict) -> str:
    """A run's label with its target ε, if it has one."""
    eps = r.get("target_epsilon")
    return variant_label(r) + ("" if eps is None else f" ε={eps:g}")


def _audited(results: list[dict], dataset: str) -> list[tuple[dict, Path]]:
    out = []
    for r in results:
        run = Path(r.get("run_dir") or "")
        if r.get("dataset") == dataset and r.get("audit") and run.is_dir():
            out.append((r, run))
    out.sort(key=lambda t: (t[0]["method"], -(t[0].get("target_epsilon") or 0), t[0].get("variant") or ""))
    return out


def mia_roc(results: list[dict], dataset: str, path: str | Path, attack: str = "lira_online") -> Path | None:
    runs = [(r, run) for r, run in _audited(results, dataset) if (run / "audit" / "mia_scores.npz").is_file()]
    if not runs:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    colours = _colours(f"{variant_label(r)} {r.get('target_epsilon')}" for r, _ in runs)
    for r, run in runs:
        z = np.load(run / "audit" / "mia_scores.npz")
        if attack not in z:
            continue
        fpr, tpr = roc_curve(z[attack], z["is_member"])
        label = f"{_with_epsilon(r)} (AUC {r.get('mia_auc', float('nan')):.3f})"
        ax.plot(np.maximum(fpr, 1e-4), np.maximum(tpr, 1e-4), label=label, lw=1,
                color=colours[f"{variant_label(r)} {r.get('target_epsilon')}"])
    ax.plot([1e-4, 1], [1e-4, 1], "k:", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=(1e-4, 1), ylim=(1e-4, 1), xlabel="false positive rate",
           ylabel="true positive rate", title=f"LiRA ({attack.replace('_', ' ')}) on {dataset}")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)


def _compose(images: list[tuple[str, Path]], path: str | Path, title: str) -> Path | None:
    if not images:
        return None
    plt = _plt()
    cols = min(4, len(images))
    rows = math.ceil(len(images) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.0 * rows + 0.6), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (label, img) in zip(axes.flat, images):
        ax.imshow(plt.imread(str(img)), cmap="gray")
        ax.set_title(label, fontsize=7)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path, dpi=130)


def inversion_grids(results: list[dict], dataset: str, path: str | Path) -> Path | None:
    images = []
    for r, run in _audited(results, dataset):
        grid = run / "audit" / "inversion.png"
        if grid.is_file():
            images.append((_with_epsilon(r), grid))
    return _compose(images, path, f"Model inversion on {dataset} (columns: classes 0-9; rows: restarts)")


def sample_grids(results: list[dict], dataset: str, path: str | Path) -> Path | None:
    images, seen = [], set()
    for r in results:
        if r.get("dataset") != dataset:
            continue
        candidates = [Path(r.get("run_dir") or "") / "samples.png"]
        refs = r.get("stages")  # stage references: a dict (DGD), a list (DPDFD); SRR's is a stage COUNT
        if isinstance(refs, dict):
            refs = list(refs.values())
        for ref in refs if isinstance(refs, list) else []:
            if isinstance(ref, dict) and ref.get("path"):
                candidates.append(Path(ref["path"]) / "samples.png")
        for c in candidates:
            if c.is_file() and c.resolve() not in seen:
                seen.add(c.resolve())
                images.append((f"{variant_label(r)} ({c.parent.name})", c))
    return _compose(images, path, f"Synthetic samples on {dataset} (one row per class, as labelled by the teacher)")


def srr_stage_traces(results: list[dict], dataset: str, path: str | Path, max_epsilon: float = 1.0) -> Path | None:
    """Each SRR-family run's `stage_trace` at target ε <= `max_epsilon`: how the candidate sets, the released
    labels' correctness and the student evolve (x: share of the labels drawn so far, so that runs with
    different T line up)."""
    rows = [r for r in results if r.get("method") == "srr" and r.get("dataset") == dataset and r.get("stage_trace")
            and r.get("target_epsilon") is not None and float(r["target_epsilon"]) <= max_epsilon
            and not r.get("dp_source")]  # end to end: no label mechanism, nothing to trace
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = [("mean_set_size", "mean candidate-set size |I|", 1), ("correct", "released labels correct %", 100),
              ("test_accuracy", "student test accuracy % (after the stage)", 100)]
    for r in sorted(rows, key=variant_label):
        trace = r["stage_trace"]
        total = sum(t["count"] for t in trace)
        x = [sum(t["count"] for t in trace[:i + 1]) / total for i in range(len(trace))]
        for ax, (key, _, scale) in zip(axes, panels):
            pts = [(xi, scale * t[key]) for xi, t in zip(x, trace) if t.get(key) is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=_with_epsilon(r))
    for ax, (_, title, _) in zip(axes, panels):
        ax.set(xlabel="share of the labels drawn", title=title)
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.suptitle(f"SRR stage by stage on {dataset} (label statistics read the protected labels: evaluation only)")
    return _save(fig, path)


def make_figures(results_dir: str | Path = "results", out_dir: str | Path = "docs/figures",
                 presets: list[str] | None = None) -> list[Path]:
    """Every figure above, for every preset with results; returns the files written."""
    out_dir = Path(out_dir)
    written = [privacy_vs_queries(out_dir / "privacy-vs-queries.png")]
    root = Path(results_dir)
    if presets is None:
        presets = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    for preset in presets:
        results = load_results(root, preset)
        written.append(accuracy_vs_epsilon(results, out_dir / f"accuracy-vs-epsilon-{preset}.png"))
        written.append(dgd_accuracy_vs_queries(results, out_dir / f"dgd-accuracy-vs-queries-{preset}.png"))
        for ds in sorted({r["dataset"] for r in results if r.get("dataset")}):
            written.append(mia_roc(results, ds, out_dir / f"mia-roc-{preset}-{ds}.png"))
            written.append(inversion_grids(results, ds, out_dir / f"inversion-{preset}-{ds}.png"))
            written.append(sample_grids(results, ds, out_dir / f"samples-{preset}-{ds}.png"))
            written.append(srr_stage_traces(results, ds, out_dir / f"srr-stages-{preset}-{ds}.png"))
    return [p for p in written if p is not None]

