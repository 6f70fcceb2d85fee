"""`privdistill audit RUN_DIR`: membership inference and model inversion against a run's released model.

Writes audit/mia.json (every attack's AUC and TPR at 1 % / 0.1 % FPR with 95 % bootstrap intervals), mia_scores.npz,
mia_roc.png and inversion.png into the run directory, and adds `mia_auc`, `mia_tpr_at_1pct_fpr` (LiRA online),
`mia_attack` and an `audit` block to its summary.json (with `record=True`, also under results/<preset>/).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from privdistill.atomic import atomic_write_json
from privdistill.audits.inversion import InversionConfig, inversion_audit
from privdistill.audits.membership import AuditConfig, audit_split, load_shadows, membership_audit, shadow_stage
from privdistill.audits.metrics import roc_curve
from privdistill.config import ClassifierTraining, RunOptions, resolve_sections
from privdistill.data import load_data
from privdistill.engine.cache import StageCache
from privdistill.engine.context import Env
from privdistill.engine.holdout import public_indices
from privdistill.engine.run import RunDir, record_result
from privdistill.errors import RunError

SECTIONS = {"run": RunOptions, "audit": AuditConfig, "shadow": ClassifierTraining, "inversion": InversionConfig}
#: weights a run releases, in order of preference
RELEASED = ("student", "model")


def released_model(run: RunDir, device="cpu"):
    for name in RELEASED:
        if run.has_weights(name):
            return name, run.load_weights(name, device=device)
    raise RunError(f"{run.path} holds no released model ({' or '.join(n + '.safetensors' for n in RELEASED)})")


def _public_slice_overlap(summary: dict, config: dict, members, n_train: int) -> int | None:
    """Members that a run used directly as public data (PATE, DGD's held-out variant): should be 0."""
    method = summary.get("method")
    if method == "pate":
        holdout = (config.get("pate") or {}).get("holdout")
    elif str(method).startswith("dgd") and (config.get("dgd") or {}).get("inputs") == "private-holdout":
        holdout = (config.get("dgd") or {}).get("holdout")
    else:
        return None
    seed = (config.get("run") or {}).get("seed", 0)
    public = set(public_indices(n_train, int(holdout), int(seed)).tolist())
    return sum(int(i) in public for i in members.tolist())


def audit_run(run_dir: str | Path, *, preset: str | None = None, config_file: str | None = None,
              overrides: list[str] | dict | None = None, record: bool = False, results_dir: str | Path = "results",
              cache: bool = True, result_name: str | None = None) -> dict[str, Any]:
    """Audit one finished run; returns the `audit` block added to its summary."""
    started = time.perf_counter()
    run = RunDir.existing(run_dir)
    summary = run.summary()
    dataset = summary.get("dataset")
    if not dataset:
        raise RunError(f"{run.path}/summary.json names no dataset")
    preset = preset or summary.get("preset") or "quick"
    s = resolve_sections(SECTIONS, preset=preset, dataset=dataset, config_file=config_file, overrides=overrides)
    cfg: AuditConfig = s["audit"]
    options: RunOptions = s["run"]
    env = Env.from_options(options)
    data = load_data(dataset, options.data_root, seed=options.seed)
    weights, model = released_model(run, device=env.device)
    split = audit_split(data, cfg)
    out_dir = run.path / "audit"
    out_dir.mkdir(exist_ok=True)
    block: dict[str, Any] = {"released_weights": weights, "preset": preset, "members": len(split.members),
                             "nonmembers": len(split.nonmembers), "split": split.digest(),
                             "split_rule": "members: seeded subset of the training set outside the held-out public "
                                           "slice; non-members: seeded subset of the test set"}
    overlap = _public_slice_overlap(summary, run.config(), split.members, len(data.train))
    if overlap is not None:
        block["members_in_public_slice"] = overlap
    fields: dict[str, Any] = {}

    if cfg.mia:
        shadows, stage_ref = None, None
        if cfg.shadows > 0:
            stage = shadow_stage(data, split, cfg, s["shadow"], env, StageCache(enabled=cache), run.path / "stages")
            shadows, stage_ref = load_shadows(stage), {**stage.ref(), **{k: v for k, v in stage.info().items()
                                                                         if k in ("mean_test_accuracy", "wall_seconds",
                                                                                  "mean_train_size")}}
        mia = membership_audit(model, data, split, cfg, shadows, device=env.device)
        np.savez_compressed(out_dir / "mia_scores.npz", is_member=mia["is_member"],
                            **{k.replace("-", "_"): v for k, v in mia["scores"].items()})
        _roc_figure(mia, out_dir / "mia_roc.png", title=f"{summary.get('method')} on {dataset}")
        head = mia["attacks"][mia["headline_attack"]]
        block["mia"] = {k: mia[k] for k in ("headline_attack", "attacks", "accuracy_members", "accuracy_nonmembers",
                                            "mean_loss_members", "mean_loss_nonmembers")}
        block["mia"].update(shadows=cfg.shadows, fix_variance=cfg.fix_variance, shadow_stage=stage_ref,
                            roc=str(out_dir / "mia_roc.png"))
        loss = mia["attacks"]["loss"]
        fields.update(mia_auc=head["auc"], mia_tpr_at_1pct_fpr=head["tpr_at_1pct_fpr"],
                      mia_attack=mia["headline_attack"], mia_loss_auc=loss["auc"],
                      mia_loss_tpr_at_1pct_fpr=loss["tpr_at_1pct_fpr"])
        atomic_write_json(out_dir / "mia.json", block["mia"])

    if cfg.inversion:
        inv_env = Env(device=env.device, precision="fp32", seed=options.seed, progress=False)
        block["inversion"] = inversion_audit(model, data.train, s["inversion"], inv_env, out_dir / "inversion.png")
        fields["inversion_grid"] = block["inversion"]["grid"]

    block["seconds"] = round(time.perf_counter() - started, 1)
    summary.update(fields)
    summary["audit"] = block
    atomic_write_json(run.path / "summary.json", summary)
    if record:
        name = result_name or (Path(summary["recorded_as"]).stem if summary.get("recorded_as") else None)
        summary["recorded_as"] = str(record_result(summary, results_dir=results_dir, name=name))
        atomic_write_json(run.path / "summary.json", summary)
    return {**block, **fields}


def _roc_figure(mia: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 4))
    for name, scores in mia["scores"].items():
        fpr, tpr = roc_curve(scores, mia["is_member"])
        ax.plot(np.maximum(fpr, 1e-4), np.maximum(tpr, 1e-4), label=f"{name} (AUC {mia['attacks'][name]['auc']:.3f})")
    ax.plot([1e-4, 1], [1e-4, 1], "k:", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=(1e-4, 1), ylim=(1e-4, 1), xlabel="false positive rate",
           ylabel="true positive rate", title=title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
