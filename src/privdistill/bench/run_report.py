"""`privdistill report RUN_DIR --format md|html`: one run as a short, self-standing report.

Sections: the summary (accuracy, ε under both accountings with δ and what it covers), the privacy report
(`privacy.report.run_report` + `render_text` when the run has a ledger or Opacus's accounting (DP-SGD); its
pathways otherwise; "no guarantee" for the baseline), the audit numbers when the run was
audited, the training curve (from metrics.jsonl) and the run's figures (synthetic samples, model inversion,
MIA ROC). Markdown links the figures by relative path; HTML embeds them (one file to send around).
"""

from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path
from typing import Any

from privdistill.engine.run import RunDir
from privdistill.errors import ConfigError
from privdistill.privacy.report import guarantee, has_run_report, pathway_line, render_text, run_report

SUMMARY_ROWS = ("method", "variant", "dataset", "preset", "test_accuracy", "test_split", "baseline_accuracy",
                "target_epsilon", "epsilon_paper", "epsilon_strict", "epsilon_data_dependent", "delta",
                "epsilon_covers", "not_covered", "privacy", "queries", "answered", "wall_seconds", "device",
                "git_commit", "command", "run_dir")
FIGURES = (("samples.png", "Synthetic samples"), ("audit/inversion.png", "Model inversion (one column per class)"),
           ("audit/mia_roc.png", "Membership inference ROC"), ("report-curve.png", "Training curve"))


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "; ".join(str(x) for x in v) or "(none)"
    return str(v)


def privacy_text(run: RunDir, summary: dict[str, Any]) -> str:
    """The privacy report as plain text, whatever kind of run this is."""
    if has_run_report(run.path):
        return render_text(run_report(run.path))
    lines = []
    pj = run.path / "privacy.json"
    doc = json.loads(pj.read_text()) if pj.is_file() else {}
    if summary.get("method") == "baseline" or (not doc and summary.get("epsilon_strict") is None):
        lines.append("No differential-privacy guarantee: " + str(summary.get("privacy") or
                                                                "the model is trained directly on the private data."))
    if summary.get("epsilon_strict") is not None:
        lines.append(f"epsilon (paper): {_fmt(summary.get('epsilon_paper'))}   epsilon (strict): "
                     f"{_fmt(summary.get('epsilon_strict'))}   delta: {_fmt(summary.get('delta'))}")
    for name, pathways in (doc.get("artifacts") or {}).items():
        lines.append(f"{name}:")
        lines += ["  " + pathway_line(p) for p in pathways]
    return "\n".join(lines) + "\n"


def training_curve(run: RunDir, out: Path) -> Path | None:
    points: dict[str, list[tuple[float, float]]] = {}
    units = set()
    for m in run.metrics():
        if m.get("test_accuracy") is None:
            continue
        unit = "step" if "step" in m else "epoch" if "epoch" in m else None
        if unit is None:
            continue
        value = m[unit]
        if m.get("stage") == "srr" and unit == "step":  # SRR logs one line per stage, numbered under `step`
            unit = "SRR stage"
        units.add(unit)
        points.setdefault(f"{m.get('stage', 'train')} ({unit}s)", []).append(
            (float(value), 100 * float(m["test_accuracy"])))
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for stage, pts in points.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, label=stage)
    names = [u if u.startswith("SRR") else f"training {u}" for u in sorted(units)]
    ax.set(xlabel=" / ".join(names) + (" (see the legend)" if len(units) > 1 else ""), ylabel="test accuracy %")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, epochs and stages are whole numbers
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def audit_rows(summary: dict[str, Any]) -> list[list[str]]:
    attacks = (((summary.get("audit") or {}).get("mia") or {}).get("attacks") or {})
    rows = []
    for name, a in attacks.items():
        ci = a.get("auc_ci95")
        rows.append([name, f"{a['auc']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""),
                     f"{a['tpr_at_1pct_fpr']:.3f}", f"{a['tpr_at_0.1pct_fpr']:.3f}", f"{a['balanced_accuracy']:.3f}"])
    return rows


def render(run_dir: str | Path, *, fmt: str = "md", output: str | Path | None = None) -> Path:
    """Write the report (default RUN_DIR/report.md or report.html); returns its path."""
    if fmt not in ("md", "html"):
        raise ConfigError(f"--format must be md or html, got {fmt!r}")
    run = RunDir.existing(run_dir)
    summary = run.summary()
    training_curve(run, run.path / "report-curve.png")
    out = Path(output) if output else run.path / f"report.{fmt}"
    title = f"{summary.get('method')} on {summary.get('dataset')} ({summary.get('preset')})"
    rows = [("privacy, in words", guarantee(summary)[1])]
    rows += [(k, _fmt(summary.get(k))) for k in SUMMARY_ROWS if summary.get(k) is not None]
    privacy = privacy_text(run, summary)
    audit = audit_rows(summary)
    inversion = (summary.get("audit") or {}).get("inversion")
    figures = [(run.path / f, caption) for f, caption in FIGURES if (run.path / f).is_file()]
    notes = list(summary.get("plan_notes") or [])  # what was sized, calibrated or refitted before training
    if fmt == "md":
        text = _markdown(title, rows, privacy, notes, audit, inversion, figures, out.parent, summary.get("warning"))
    else:
        text = _html(title, rows, privacy, notes, audit, inversion, figures, summary.get("warning"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


PLAN = "The plan (sized, calibrated and checked before anything trained)"


def _markdown(title, rows, privacy, notes, audit, inversion, figures, base: Path, warning=None) -> str:
    md = ([f"**WARNING: {warning}**", ""] if warning else []) + [f"# {title}", "", "| | |", "| --- | --- |"]
    md += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
    md += ["", "## Privacy", "", "```", privacy.rstrip(), "```", ""]
    if notes:
        md += [f"## {PLAN}", ""] + [f"- {n}" for n in notes] + [""]
    if audit:
        md += ["## Membership inference (members: training data, non-members: test data)", "",
               "| attack | AUC [95% CI] | TPR @ 1% FPR | TPR @ 0.1% FPR | best balanced accuracy |",
               "| --- | --- | --- | --- | --- |"]
        md += ["| " + " | ".join(r) + " |" for r in audit]
        md.append("")
    if inversion:
        md += ["## Model inversion", "",
               f"Mean confidence {inversion['mean_confidence']}, mean correlation with the class-mean "
               f"training image {inversion['mean_correlation_with_class_mean']} ({inversion['restarts']} restarts, "
               f"{inversion['steps']} steps).", ""]
    if figures:
        md += ["## Figures", ""]
        md += [f"![{caption}]({os.path.relpath(path.resolve(), base.resolve())})\n\n*{caption}*\n"
               for path, caption in figures]
    return "\n".join(md) + "\n"


def _html(title, rows, privacy, notes, audit, inversion, figures, warning=None) -> str:
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:960px;margin:2em auto}td,th{border:1px solid #ccc;"
             "padding:3px 8px;text-align:left}table{border-collapse:collapse}pre{background:#f6f6f6;padding:8px;"
             "white-space:pre-wrap}</style></head><body>",
             *([f"<p style='color:#b00'><b>WARNING: {esc(warning)}</b></p>"] if warning else []),
             f"<h1>{esc(title)}</h1><table>"]
    parts += [f"<tr><th>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in rows]
    parts += ["</table><h2>Privacy</h2>", f"<pre>{esc(privacy)}</pre>"]
    if notes:
        parts.append(f"<h2>{esc(PLAN)}</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    if audit:
        parts.append("<h2>Membership inference</h2><table><tr><th>attack</th><th>AUC [95% CI]</th><th>TPR @ 1% FPR</th>"
                     "<th>TPR @ 0.1% FPR</th><th>best balanced accuracy</th></tr>")
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in audit]
        parts.append("</table>")
    if inversion:
        parts.append(f"<h2>Model inversion</h2><p>Mean confidence {inversion['mean_confidence']}, "
                     f"mean correlation with the class-mean training image "
                     f"{inversion['mean_correlation_with_class_mean']}.</p>")
    if figures:
        parts.append("<h2>Figures</h2>")
    for path, caption in figures:
        data = base64.b64encode(path.read_bytes()).decode()
        # grids of small images: scaled up by the browser pixel for pixel, never smoothed into a blur
        parts.append(f"<figure><img src='data:image/png;base64,{data}' style='max-width:100%;min-width:320px;"
                     "image-rendering:pixelated'>"
                     f"<figcaption>{esc(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
