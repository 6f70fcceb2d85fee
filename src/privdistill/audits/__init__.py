"""Audits of a released model: membership inference (loss threshold, LiRA with shadow models) and model
inversion. `audit_run(RUN_DIR)` runs both and records the numbers in the run's summary (see `audit.py`)."""

from privdistill.audits.audit import audit_run
from privdistill.audits.metrics import attack_metrics, auc, roc_curve, tpr_at_fpr

__all__ = ["attack_metrics", "audit_run", "auc", "roc_curve", "tpr_at_fpr"]

