"""Issue 64, part 5: your data stays yours. Arrays passed to fit stay in memory (nothing written to disk, not even
for a call then refused); summaries and model cards name them by the name given (or a content hash); the test split
is stated and may be the user's own; labels that skip class numbers are renumbered with the mapping recorded; the
card states the scale the data had."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fabricate import pattern_images
from privdistill.data import load_data
from privdistill.data.custom import LabelRemapWarning
from privdistill.errors import DataError
from privdistill.methods.dpsgd import DPSGD, DPSGDMethod
from privdistill.methods.runner import DryRunPlan
from privdistill.release import export_run

TINY = ["run.recipe=paper", "dpsgd.epochs=4", "dpsgd.batch_size=100", "dpsgd.model=small-cnn", "dpsgd.lr=0.5",
        "run.progress=false", "run.precision=fp32", "run.device=cpu"]


def _digits(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """8 x 8 images on a 0..16 scale, labels 0..8 and 12 (no 9, 10, 11)."""
    x, y = pattern_images(n, num_classes=10, size=8, seed=seed)
    y[y == 9] = 12
    return (x[:, 0].astype(np.int64) * 16) // 255, y


@pytest.fixture
def no_disk_writes(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("arrays passed to fit were written to disk")

    for name in ("save", "savez", "savez_compressed"):
        monkeypatch.setattr(np, name, refuse)


def test_fit_keeps_arrays_in_memory_names_them_and_states_split_labels_and_scale(tmp_path, no_disk_writes):
    x, y = _digits(400, seed=0)
    xt, yt = _digits(120, seed=1)
    with pytest.warns(LabelRemapWarning, match=r"0\.\.8, 12"):
        result = DPSGD(overrides=TINY, epsilon=8, run_dir=str(tmp_path / "run")).fit(
            x, y, value_range=(0, 16), name="digits", test=(xt, yt))
    s = result.summary
    # no cache path anywhere (the stage cache's, nor the array cache an earlier version copied private arrays to)
    assert s["dataset"] == "arrays:digits" and os.environ["PRIVDISTILL_CACHE"] not in str(s)
    assert ".cache/privdistill" not in str(s) and "arrays/" not in str(s)
    assert s["test_split"] == "120 images: the test arrays passed to fit (test=...)"
    assert s["label_map"] == {**{str(k): k for k in range(9)}, "12": 9}
    assert s["classes"] == [str(k) for k in range(9)] + ["12"] and s["data_value_range"] == [0.0, 16.0]
    assert any(n.startswith("labels renumbered") for n in s["plan_notes"])
    assert any(n.startswith("test accuracy is measured on 120 images") for n in s["plan_notes"])

    card = (export_run(tmp_path / "run", tmp_path / "out", allow_chance=True) / "README.md").read_text()
    assert "arrays:digits" in card and "on 120 images: the test arrays passed to fit" in card
    assert "The training data were on a 0..16 scale" in card and "round(x * 255 / 16)" in card
    assert "(0, 1, 2, 3, 4, 5, 6, 7, 8, 12)" in card and "labels 0, 1, 2, 3, 4, 5, 6, 7, 8, 12 were renumbered" in card

    # no name: a content hash; no test split: 10 % held out, and the plan says so (a dry run: nothing trains)
    request = DPSGD(overrides=TINY, epsilon=8, run_dir=str(tmp_path / "hash")).request(np.asarray(x, np.uint8) * 15,
                                                                                        y % 9)
    assert request.dataset.startswith("arrays:sha256-")
    data = load_data(request.dataset)
    assert data.test_from.startswith("held out at random from the 400 labelled records given (10%, seeded")
    assert data.label_map is None and data.value_range == (0.0, 255.0)
    request.dry_run = True
    with pytest.raises(DryRunPlan) as plan:
        DPSGDMethod().run(request)
    assert any(n.startswith("test accuracy is measured on 40 images: held out at random") and
               "give your own test split" in n for n in plan.value.info["notes"])


def test_a_refused_fit_writes_nothing_and_other_processes_are_told_where_the_data_is(tmp_path, no_disk_writes):
    x, y = _digits(60, seed=0)
    with pytest.raises(DataError, match=r"value_range=\(LO, HI\)"):
        DPSGD(overrides=TINY, epsilon=8, run_dir=str(tmp_path / "r")).fit(x, y)
    with pytest.raises(DataError, match="a dataset name is 1 to 64 letters"):
        DPSGD(overrides=TINY, epsilon=8).fit(x, y, value_range=(0, 16), name="my data/../x")
    with pytest.raises(DataError, match="kept in memory only, never on disk.*npz:data.npz"):
        load_data("arrays:never-given")


def test_the_python_api_does_not_pass_on_opacus_hook_warnings(tmp_path):
    """The default recipe's ghost clipping ran two backward passes a step, each warning "Full backward hook is
    firing ..." (a model whose inputs need no gradient): 80 identical warnings for 40 epochs through the Python API
    (the command line filters them). The training loop now silences that one message where it arises."""
    import warnings

    x, y = _digits(300, seed=0)
    y[y == 12] = 9
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = DPSGD(overrides=["dpsgd.epochs=2", "run.progress=false", "run.precision=fp32", "run.device=cpu"],
                       epsilon=8, run_dir=str(tmp_path / "run")).fit(x, y, value_range=(0, 16))
    assert result.summary["epsilon_strict"] <= 8
    assert not [w for w in seen if "backward hook" in str(w.message)], [str(w.message)[:80] for w in seen]
