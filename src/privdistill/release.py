"""A release: what may leave the machine that holds the private data, and how to use it.

A run directory mixes what may be released (the classifier) with what must not (checkpoints, the ledger's vote
counts, config.yaml with the noise seed, a generator fitted to a non-private model). `export_run` writes only
the releasable part: model.safetensors (weights, with metadata enough to rebuild and use it), README.md (a model
card: method, data, accuracy, ε under each accounting, what it covers), privacy.json, and generator.safetensors
only when asked for and covered by the ε.

A model that is not DP as a whole is refused unless `allow_non_private=True` (its card's first line says so); a
label-DP model is exported, its card saying only the labels are protected; a model at chance (methods/chance.py) is
refused unless `allow_chance=True`. `load(path)` gives back the model, its preprocessing and its card.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from privdistill import __version__
from privdistill.data.dataset import known_class_names
from privdistill.engine.run import RunDir
from privdistill.errors import PrivacyError, RunError
from privdistill.methods.runner import generator_is_covered
from privdistill.privacy.report import fmt_num as _fmt
from privdistill.privacy.report import guarantee, is_label_dp

#: What every classifier here reads: images scaled from [0, 255] to [-1, 1] (data.dataset.to_float), NCHW.
PREPROCESSING = {"input": "uint8 images in [0, 255], or floats already in [-1, 1]",
                 "scale": "x / 127.5 - 1 (so 0 -> -1 and 255 -> 1)", "layout": "N x C x H x W",
                 "warning": "images scaled to [0, 1] are out of distribution: accuracy drops with no error (MNIST, "
                            "measured: a DGD student 61.6 % -> 37.0 %, a label-DP SRR student 97.0 % -> 93.4 %)"}

_WEIGHTS = ("student", "model")  # the released classifier's weights, by method (student: distillation methods)

_RELATION = "replace-one: substitute one record of the private training set"  # a summary that names none

# The card's fields that model.safetensors' metadata (strings only) holds as JSON, read back as such by `load`.
_JSON_FIELDS = ("dp_as_a_whole", "epsilon_strict", "epsilon_paper", "delta", "preprocessing", "classes",
                "test_accuracy", "at_chance", "data_value_range")


class NonPrivateReleaseWarning(UserWarning):
    """An artifact that is not differentially private as a whole was exported because the caller asked for it."""


@dataclass
class Release:
    """A loaded release: ``model`` (eval mode, CPU), ``preprocess`` (images -> the model's input), ``classes``,
    ``card`` (the metadata stored with the weights) and ``predict`` (images -> class indices)."""

    model: nn.Module
    classes: list[str]
    image_shape: tuple[int, int, int]  # C, H, W
    card: dict[str, Any] = field(default_factory=dict)

    def preprocess(self, images: Any) -> torch.Tensor:
        """uint8 images ([N, H, W], [N, H, W, C] or [N, C, H, W], or one image [H, W], [C, H, W], [H, W, C]; numpy or
        torch) -> float [N, C, H, W] in [-1, 1].
        Float input must already be in [-1, 1] (it is checked: [0, 1] floats are refused)."""
        x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
        c, h, w = self.image_shape
        if x.dim() == 2 and c == 1:  # one grey image [H, W]
            x = x[None, None]
        elif x.dim() == 3 and (tuple(x.shape) == (c, h, w) or tuple(x.shape) == (h, w, c)):  # one image
            x = x.unsqueeze(0)
        if x.dim() == 3:
            x = x.unsqueeze(1) if c == 1 else x.unsqueeze(0)
        if x.dim() == 4 and x.shape[1] != c and x.shape[-1] == c:
            x = x.permute(0, 3, 1, 2)
        if x.dim() != 4 or tuple(x.shape[1:]) != (c, h, w):
            raise ValueError(f"images of shape {tuple(x.shape)} do not fit this model, which reads {c} x {h} x {w}")
        if x.dtype == torch.uint8:
            return x.float().div(127.5).sub(1.0)
        x = x.float()
        if float(x.min()) >= 0 and float(x.max()) <= 1 and float(x.max()) > 0:
            raise ValueError("float images in [0, 1]: this model reads [-1, 1] (x / 127.5 - 1 from uint8); pass "
                             "uint8 images, or 2 * x - 1")
        if float(x.min()) < -1.0001 or float(x.max()) > 1.0001:
            raise ValueError(f"float images must lie in [-1, 1], got [{float(x.min()):.3g}, {float(x.max()):.3g}]; "
                             "pass uint8 images in [0, 255] instead")
        return x

    @torch.no_grad()
    def predict(self, images: Any) -> torch.Tensor:
        return self.model(self.preprocess(images)).argmax(dim=1)


def export_run(run_dir: str | os.PathLike, out: str | os.PathLike, *, allow_non_private: bool = False,
               generator: bool = False, overwrite: bool = False, allow_reproducible_noise: bool = False,
               allow_chance: bool = False) -> Path:
    """Write the releasable part of a finished run to `out` (see the module docstring); returns `out`. A model at
    chance (its summary's `at_chance`, methods/chance.py) is refused unless `allow_chance`."""
    run, out = Path(run_dir), Path(out)
    if not run.is_dir():
        raise RunError(f"{run} does not exist" if not run.exists() else f"{run} is not a directory (a run directory "
                       "holds summary.json, privacy.json and the weights)")
    summary = _read_json(run / "summary.json", f"{run} has no summary.json: only a finished run can be exported")
    privacy = _read_json(run / "privacy.json", f"{run} has no privacy.json (its privacy report): cannot export") \
        if (run / "privacy.json").is_file() else {}
    weights = next((run / f"{w}.safetensors" for w in _WEIGHTS if (run / f"{w}.safetensors").is_file()), None)
    if weights is None:
        raise RunError(f"{run} holds no released classifier (student.safetensors or model.safetensors)")
    is_dp, sentence = guarantee(summary)
    if not (is_dp or is_label_dp(summary)):
        if not allow_non_private:
            raise PrivacyError(f"refusing to export {run}, whose released model is {sentence} "
                               "Pass --allow-non-private (Python: allow_non_private=True) to export it anyway; its "
                               "model card will then say so first.")
        warnings.warn(f"exporting a model that is not differentially private as a whole: {sentence}",
                      NonPrivateReleaseWarning, stacklevel=2)
    if summary.get("noise_secure") is False and summary.get("epsilon_strict") is not None \
            and not allow_reproducible_noise:
        raise PrivacyError(f"refusing to export {run}: its privacy noise is reproducible (drawn from generators "
                           "seeded with the run's seed), so its ε holds only while that seed stays secret. Train "
                           "again without --seed (secure noise, the default) for a release, or pass "
                           "--allow-reproducible-noise (Python: allow_reproducible_noise=True) to export it anyway; "
                           "its model card will then say so first.")
    if summary.get("at_chance") and not allow_chance:
        why = (summary.get("chance_check") or {}).get("finding") or "AT CHANCE: its model answers at chance"
        raise RunError(f"refusing to export {run}: {why}. Pass "
                       "--allow-chance (Python: allow_chance=True) to export it anyway; its model card will then say "
                       "so first.")
    gen_path = run / "generator.safetensors"
    if generator:
        if not gen_path.is_file():
            raise RunError(f"{run} has no generator.safetensors to export")
        if not generator_is_covered(privacy) and not allow_non_private:
            raise PrivacyError(f"refusing to export the generator of {run}: its privacy report lists pathways the "
                               "epsilon does not cover (privacy.json, artifact 'generator'). Pass allow_non_private "
                               "to export it anyway.")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise RunError(f"{out} exists and is not empty; choose a new directory or pass --overwrite")
    source = RunDir(run)
    meta = source.weights_metadata(weights.stem)
    model = source.load_weights(weights.stem)  # the release must load: checked before anything is written

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    classes = _classes(summary, meta)
    card = {"privdistill_version": __version__, "method": str(summary.get("method")),
            "dataset": str(summary.get("dataset")), "dp_as_a_whole": is_dp, "guarantee": sentence,
            "epsilon_strict": summary.get("epsilon_strict"), "epsilon_paper": summary.get("epsilon_paper"),
            "delta": summary.get("delta"), "relation": str(summary.get("relation") or _RELATION),
            "preprocessing": PREPROCESSING, "classes": classes, "test_accuracy": summary.get("test_accuracy"),
            "at_chance": bool(summary.get("at_chance")), "test_split": str(summary.get("test_split") or ""),
            "data_value_range": summary.get("data_value_range")}
    card_meta = {k: json.dumps(v) if k in _JSON_FIELDS else v for k, v in card.items()}
    RunDir(partial).save_weights("model", model, metadata={**meta, **card_meta})
    if generator:
        shutil.copy2(gen_path, partial / "generator.safetensors")
    if privacy:
        (partial / "privacy.json").write_text(json.dumps(privacy, indent=1, ensure_ascii=False) + "\n")
    (partial / "README.md").write_text(model_card(summary, privacy, sentence, is_dp, classes, meta,
                                                  generator=generator))
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    return out


_SEED = re.compile(r"(--seed[= ]\s*|run\.seed=|\bseed=)[^\s,)]+")


def withhold_seed(command: str) -> str:
    """The command that made a run, with any seed it names withheld: a card never carries one."""
    return _SEED.sub(lambda m: m.group(1) + "(withheld)", command)


def _read_json(path: Path, missing: str) -> dict[str, Any]:
    if not path.is_file():
        raise RunError(missing)
    return json.loads(path.read_text())


def _classes(summary: dict[str, Any], meta: dict[str, str]) -> list[str]:
    k = int(json.loads(meta.get("registry_kwargs", "{}")).get("num_classes", 10))
    given = summary.get("classes")  # the data's own class names, or its labels as given when they were renumbered
    if isinstance(given, list) and len(given) == k:
        return [str(c) for c in given]
    return known_class_names(str(summary.get("dataset")), k)


def _scale_sentence(summary: dict[str, Any]) -> str:
    """What scale the training data were on, and how to bring images on that scale to the model's 0..255."""
    given = summary.get("data_value_range")
    if not (isinstance(given, list) and len(given) == 2):
        return ""
    lo, hi = float(given[0]), float(given[1])
    if (lo, hi) == (0.0, 255.0):
        return " The training data were uint8 images on this 0..255 scale."
    if (lo, hi) == (0.0, 1.0):
        return (" The training data were floats on a 0..1 scale, read as x * 255: give this model uint8 = round(255 "
                "* x) (or 2 * x - 1 as floats).")
    offset = f"(x - {lo:g})" if lo else "x"
    return (f" The training data were on a {lo:g}..{hi:g} scale, mapped to 0..255 as {offset} * 255 / {hi - lo:g}: "
            f"give this model images on that scale the same way, uint8 = round({offset} * 255 / {hi - lo:g}); fed "
            f"{lo:g}..{hi:g} values as they are, it sees nearly black images.")


def model_card(summary: dict[str, Any], privacy: dict[str, Any], sentence: str, is_dp: bool, classes: list[str],
               meta: dict[str, str], *, generator: bool = False) -> str:
    """The model card, in the Hugging Face README.md format (YAML front matter, then markdown)."""
    method, dataset = summary.get("method"), summary.get("dataset")
    kwargs = json.loads(meta.get("registry_kwargs", "{}"))
    relation = summary.get("relation") or _RELATION
    size, channels = kwargs.get("image_size", "?"), kwargs.get("in_channels", "?")
    acc = summary.get("test_accuracy")
    front = ["---", "library_name: privdistill", "pipeline_tag: image-classification",
             f"tags: [differential-privacy, privdistill, {method}]", f"datasets: [{dataset}]", "metrics: [accuracy]",
             "model-index:", f"- name: {method}-{dataset}", "  results:",
             "  - task: {type: image-classification}", f"    dataset: {{name: {dataset}, type: {dataset}}}",
             "    metrics:", f"    - {{type: accuracy, value: {acc}}}", "---", ""]
    title = "differentially private" if is_dp else "label-DP" if is_label_dp(summary) else "NOT differentially private"
    if summary.get("at_chance"):
        title += ", AT CHANCE"
    lines = [f"# {meta.get('registry_name')} on {dataset}, trained by {method} ({title})", ""]
    chance = summary.get("chance_check") or {}
    if summary.get("at_chance"):
        finding = chance.get("finding") or "AT CHANCE: it has learned (almost) nothing"
        lines += [f"**{finding}** (rule: {chance.get('rule', 'see privdistill.methods.chance')}).", ""]
    elif chance.get("missed_classes"):
        lines += [f"**{chance['finding']}** (rule: {chance['missed_rule']}).", ""]
    if summary.get("noise_secure") is False:
        lines += ["**Reproducible noise: the guarantee below holds only while the seed of the run that made this "
                  "model stays secret** (its privacy noise was drawn from generators seeded with it; the seed is "
                  "not part of this release).", ""]
    lines += [f"**Privacy: {sentence}**", ""]
    if summary.get("epsilon_sampling") is not None:
        lines += [f"The secure noise samplers follow the exact laws the accountant prices to within a bounded factor "
                  f"(float rounding of their acceptance probabilities): that adds {summary['epsilon_sampling']:.1e} "
                  f"to epsilon and {summary.get('delta_sampling') or 0:.1e} to delta (privacy.json, noise).", ""]
    lines += ["## Privacy", "", "| accounting | epsilon | delta | what it is |", "| --- | --- | --- | --- |",
              f"| strict (dp-accounting) | {_fmt(summary.get('epsilon_strict'))} | {_fmt(summary.get('delta'))} | "
              "the guarantee: composes every recorded use of the private data |",
              f"| {'Opacus (add/remove-one)' if method == 'dpsgd' else 'paper'} | "
              f"{_fmt(summary.get('epsilon_paper'))} | {_fmt(summary.get('delta'))} | "
              + ("Opacus's own figure, for neighbours that add or remove a record |" if method == "dpsgd" else
                 "the method's paper's own formula, for comparison; not a guarantee where it differs |"), "",
              f"Neighbouring relation: {relation}.", ""]
    for artifact, pathways in (privacy.get("artifacts") or {}).items():
        if artifact == "generator" and not generator:
            continue
        lines += [f"What the epsilon covers for the {artifact}:", ""]
        lines += [f"- {'covered' if p.get('covered') else 'NOT covered'}: {p.get('source')} -> {p.get('via')} -> "
                  f"{p.get('to')}" for p in pathways]
        lines.append("")
    split = summary.get("test_split") or f"the {dataset} test split"
    lines += ["## Accuracy", "", f"- test accuracy: {_fmt(acc)}, on {split}"]
    if summary.get("baseline_accuracy") is not None:
        what = ("the DP-SGD source model inside the guarantee (not released)" if summary.get("privacy_scope") ==
                "end-to-end" else "a non-private model trained on the same data (not released)")
        lines.append(f"- {what}: {_fmt(summary['baseline_accuracy'])}")
    lines.append("")
    audit = [(k, summary[k]) for k in ("mia_attack", "mia_auc", "mia_tpr_at_1pct_fpr", "mia_loss_auc",
                                        "mia_loss_tpr_at_1pct_fpr") if summary.get(k) is not None]
    lines += ["## Audits", ""]
    lines += ([f"- {k}: {_fmt(v)}" for k, v in audit] + ["", "Membership inference on the released model (AUC 0.5: "
              "the attack does no better than chance)."] if audit else
              ["No membership-inference audit was run on this model (`privdistill audit RUN_DIR`)."])
    lines += ["", "## Intended use", "",
              f"Classifying {size} x {size} images like those of "
              f"{dataset} into {len(classes)} classes ({', '.join(classes)}), where the people in the training data "
              "need the stated protection. Out of scope: data unlike the training distribution (accuracy then "
              "drops with no warning), and any use that relies on a guarantee stronger than the one stated above."
              + (f" The data's labels {', '.join(summary['label_map'])} were renumbered "
                 f"0..{len(summary['label_map']) - 1} in that order: the model's class i is the i-th of them "
                 "(`release.classes`)." if summary.get("label_map") else ""),
              "", "## Preprocessing", "",
              f"Input: {PREPROCESSING['input']}, shape {channels} x {size} x {size}; scale {PREPROCESSING['scale']}; "
              f"layout {PREPROCESSING['layout']}.{_scale_sentence(summary)} "
              f"Warning: {PREPROCESSING['warning']}.", "", "## How to load", "", "```python", "import privdistill", "",
              'release = privdistill.load("THIS_DIRECTORY")', "labels = release.predict(uint8_images)  # or:",
              "logits = release.model(release.preprocess(uint8_images))  # a plain torch.nn.Module", "```", "",
              f"The architecture is `{meta.get('registry_name')}` from privdistill's model registry, built with "
              f"{json.dumps(kwargs)}; model.safetensors carries these and everything above as metadata.", "",
              "## How it was made", "", f"- command: `{withhold_seed(str(summary.get('command')))}`",
              f"- privdistill {__version__}, git commit {summary.get('git_commit')}",
              f"- wall time {_fmt(summary.get('wall_seconds'))} s on {summary.get('device')}", ""]
    return "\n".join(front + lines)


def load(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> Release:
    """Load an exported release (a directory from `export_run`, or its model.safetensors)."""
    path = Path(path)
    directory, name = (path, "model") if path.is_dir() else (path.parent, path.stem)
    if not (directory / f"{name}.safetensors").is_file():
        raise RunError(f"{path} is not a privdistill release (no model.safetensors)")
    release = RunDir(directory)
    meta = release.weights_metadata(name)
    kwargs = json.loads(meta.get("registry_kwargs", "{}"))
    model = release.load_weights(name, device=device).eval()
    classes = json.loads(meta["classes"]) if "classes" in meta else [str(i) for i in range(kwargs["num_classes"])]
    card = {k: json.loads(v) if k in _JSON_FIELDS else v for k, v in meta.items()}
    size = kwargs.get("image_size", 28)
    return Release(model=model, classes=classes, card=card, image_shape=(kwargs.get("in_channels", 1), size, size))
