"""ROC curves, AUC and TPR at a fixed FPR for membership scores (higher score = "member"), with bootstrap
intervals. Ties are handled exactly (one ROC point per distinct score)."""

from __future__ import annotations

import numpy as np
from sklearn import metrics


def roc_curve(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) at every distinct threshold, from (0, 0) to (1, 1). `labels`: 1 member, 0 non-member."""
    scores = np.asarray(scores, dtype=float)
    labels = np.asarray(labels).astype(bool)
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError("scores and labels must be 1-d arrays of the same length")
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        raise ValueError("need at least one member and one non-member")
    if not np.all(np.isfinite(scores)):
        # NaN ranks below every score (-inf); sklearn takes finite scores only, so pass the ranks (order and ties
        # kept, and with them the curve)
        scores = np.unique(np.nan_to_num(scores, nan=-np.inf), return_inverse=True)[1]
    fpr, tpr, _ = metrics.roc_curve(labels, scores, drop_intermediate=False)
    return fpr, tpr


def auc(scores, labels) -> float:
    """Area under the ROC curve (= P[member score > non-member score] + P[tie] / 2)."""
    return float(metrics.auc(*roc_curve(scores, labels)))


def tpr_at_fpr(scores, labels, fpr_target: float = 0.01) -> float:
    """Highest TPR over thresholds whose FPR is at most `fpr_target` (no interpolation)."""
    fpr, tpr = roc_curve(scores, labels)
    ok = fpr <= fpr_target + 1e-12
    return float(tpr[ok].max())


def attack_metrics(scores, labels, *, bootstrap: int = 0, seed: int = 0) -> dict[str, float]:
    """AUC, TPR at 1 % and 0.1 % FPR, balanced accuracy; 95 % bootstrap intervals (members and non-members
    resampled separately) when `bootstrap` > 0."""
    scores = np.asarray(scores, dtype=float)
    labels = np.asarray(labels).astype(bool)
    fpr, tpr = roc_curve(scores, labels)
    out = {"auc": float(metrics.auc(fpr, tpr)),
           "tpr_at_1pct_fpr": float(tpr[fpr <= 0.01 + 1e-12].max()),
           "tpr_at_0.1pct_fpr": float(tpr[fpr <= 0.001 + 1e-12].max()),
           "balanced_accuracy": float(np.max(0.5 * (tpr + 1 - fpr)))}
    if bootstrap > 0:
        rng = np.random.default_rng(seed)
        pos, neg = np.nonzero(labels)[0], np.nonzero(~labels)[0]
        aucs, tprs = [], []
        for _ in range(bootstrap):
            idx = np.r_[rng.choice(pos, len(pos)), rng.choice(neg, len(neg))]
            f, t = roc_curve(scores[idx], labels[idx])
            aucs.append(metrics.auc(f, t))
            tprs.append(t[f <= 0.01 + 1e-12].max())
        out["auc_ci95"] = [round(float(np.percentile(aucs, 2.5)), 4), round(float(np.percentile(aucs, 97.5)), 4)]
        out["tpr_at_1pct_fpr_ci95"] = [round(float(np.percentile(tprs, 2.5)), 4),
                                       round(float(np.percentile(tprs, 97.5)), 4)]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}
