"""Every method's behaviour, pinned: tiny runs through the command line, compared with recorded fingerprints.

Each case runs one method end to end on fabricated data (as a user would, through `privdistill ...`) and
fingerprints what it released and spent:

* the privacy ledger: every spend's key and event, in order, and the ε both accountings give for them —
  compared exactly on every machine (they depend on the configuration alone);
* the released weights (student, generator, model) and the ledger's recorded answers (noisy labels, noise
  seeds): compared bit for bit when this machine computes like the one that recorded them (same torch
  version and CPU kernels), else up to a tolerance that float reordering stays inside but a changed
  algorithm does not (different batches, seeds or steps move the weights by their own size).

A refactoring that keeps these equal keeps the methods' behaviour. After an intended change of behaviour,
re-record with `python tests/test_method_behaviour.py --record` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "golden" / "method_fingerprints.json"

_DGD = ["baseline.model=small-cnn", "baseline.epochs=2", "baseline.batch_size=32",
        "teachers.num_teachers=5", "teachers.model=small-cnn", "teachers.steps=20", "teachers.batch_size=16",
        "teachers.lr=0.003", "generator.rounds=2", "generator.steps_per_round=4", "generator.batch_size=32",
        "generator.width=32", "vae.steps=20", "vae.batch_size=32", "student.model=small-cnn", "student.steps=12",
        "student.batch_size=16", "student.unlabeled_batch_size=16", "student.eval_every=6",
        "student.checkpoint_every=4",
        "dgd.laplace_scale=40", "dgd.gaussian_sigma=40"]  # chosen: sizing.py keeps the preset's noise for 5 teachers
_DPDFD = ["baseline.model=small-cnn", "baseline.epochs=3", "baseline.batch_size=32", "baseline.lr=0.003",
          "dpdfd.batch_size=32", "dpdfd.student_model=small-cnn", "dpdfd.eval_every=10", "dpdfd.checkpoint_every=4",
          "dpdfd.ledger_chunk=7", "dpdfd.student_lr=0.003", "dpdfd.max_steps=0", "dpdfd.calibrate_sigma=false",
          "dpdfd.sigma=2", "dpdfd_generator.width=16", "dpdfd_generator.rounds=3",
          "dpdfd_generator.steps_per_round=10", "dpdfd_generator.batch_size=32", "dpdfd_generator.lr=0.02",
          "dpdfd_teachers.num_teachers=3", "dpdfd_teachers.model=small-cnn", "dpdfd_teachers.steps=40",
          "dpdfd_teachers.batch_size=16"]
_SRR = ["srr_teacher.model=paper-cnn-bn", "srr_teacher.steps=40", "srr_teacher.batch_size=32",
        "srr_teacher.lr=0.003", "srr_teacher.eval_every_epochs=100",
        "srr_generator.rounds=2", "srr_generator.steps_per_round=5", "srr_generator.batch_size=32",
        "srr_generator.width=32", "srr.stages=4", "srr.num_samples=160", "srr.batch_size=32",
        "srr.epochs_per_stage=2", "srr.finetune_steps=2", "srr.finetune_batch_size=16"]
_PATE = ["teachers.num_teachers=5", "teachers.model=small-cnn", "teachers.steps=10", "teachers.batch_size=16",
         "teachers.lr=0.003", "pate.holdout=80", "pate_student.model=small-cnn", "pate_student.steps=8",
         "pate_student.batch_size=16", "pate_student.unlabeled_batch_size=16", "pate_student.eval_every=6",
         "pate_student.checkpoint_every=4", "pate.sigma=2", "pate.threshold=3", "pate.sigma1=1", "pate.sigma2=2",
         "pate.laplace_scale=2"]
_DPSGD = ["dpsgd.epochs=2", "dpsgd.batch_size=100", "dpsgd.model=small-cnn", "dpsgd.lr=0.1"]
_BASELINE = ["baseline.model=small-cnn", "baseline.epochs=2", "baseline.batch_size=32", "baseline.lr=0.003"]

# name -> (command words, dedicated options, --set overrides). Budgets are given explicitly (--accounting),
# so that a change of a default shows up as a change of configuration, not of behaviour.
CASES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "baseline": (["train", "baseline"], [], _BASELINE),
    "dgd": (["dgd"], ["--queries", "40", "--accounting", "strict"], _DGD),
    "dgd-gaussian": (["dgd"], ["--queries", "40", "--aggregation", "gaussian", "--accounting", "strict"], _DGD),
    "dpdfd-alg1": (["dpdfd"], ["--epsilon", "10", "--steps", "12", "--accounting", "paper"], _DPDFD),
    "dpdfd-alg1-clip-strict": (["dpdfd"], ["--epsilon", "1e6", "--steps", "9", "--accounting", "strict"],
                               _DPDFD + ["dpdfd.operation=clip"]),
    "dpdfd-alg2": (["dpdfd"], ["--epsilon", "10", "--steps", "8", "--algorithm", "2", "--accounting", "paper"],
                   _DPDFD),
    "dpdfd-alg3": (["dpdfd"], ["--epsilon", "10", "--steps", "8", "--algorithm", "3", "--accounting", "paper"],
                   _DPDFD),
    "srr-data-free": (["srr"], ["--epsilon", "2", "--accounting", "paper"], _SRR),
    "srr-label-dp-rr-prior": (["srr"], ["--epsilon", "1", "--setting", "label-dp", "--mechanism", "rr-prior",
                                        "--accounting", "paper"], _SRR),
    "pate-lnmax": (["pate"], ["--epsilon", "10", "--aggregation", "lnmax", "--accounting", "strict"], _PATE),
    "pate-confident-gnmax": (["pate"], ["--epsilon", "10", "--aggregation", "confident-gnmax",
                                        "--accounting", "strict"], _PATE),
    "dpsgd": (["dpsgd"], ["--epsilon", "5", "--accounting", "paper"], _DPSGD),  # Opacus calibration
}

RUN_OPTIONS = ["run.recipe=paper", "run.plan_check=warn",  # the mechanics on tiny data (test_recipes, test_plan_judge)
               "run.precision=fp32", "run.progress=false", "run.threads=1", "run.device=cpu",
               "run.noise=reproducible"]  # the fingerprints replay the noise: reproducible by name
WEIGHT_FILES = ("student", "generator", "model")


def machine_key() -> str:
    """What decides whether two machines compute the same bits for the same fp32 program."""
    from privdistill.engine.device import cpu_has_native_bf16

    return f"torch {torch.__version__}; cpu {torch.backends.cpu.get_cpu_capability()}; bf16 {cpu_has_native_bf16()}"


def run_case(name: str, root: Path, data: Path) -> Path:
    from typer.testing import CliRunner

    from privdistill.cli import get_app

    words, options, overrides = CASES[name]
    run_dir = root / name
    args = words + ["--dataset", f"npz:{data}", "--run-dir", str(run_dir), *options]
    for item in overrides + RUN_OPTIONS:
        args += ["--set", item]
    result = CliRunner().invoke(get_app(), args, catch_exceptions=False)
    assert result.exit_code == 0, f"{name}: exit {result.exit_code}\n{result.output}"
    return run_dir


def fingerprint(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    from privdistill.privacy import both
    from privdistill.privacy.accounting import merge_events
    from privdistill.privacy.events import event_from_dict

    out: dict = {"weights": {}, "spends": [], "answers": []}
    for name in WEIGHT_FILES:
        path = run_dir / f"{name}.safetensors"
        if not path.is_file():
            continue
        state = load_file(str(path))
        digest = hashlib.sha256()
        stats = {}
        for key in sorted(state):
            t = state[key].contiguous().reshape(-1)
            digest.update(key.encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            if t.is_floating_point() and t.numel():
                t64 = t.double()
                stats[key] = [float(t64.sum()), float(t64.norm())]
        out["weights"][name] = {"sha256": digest.hexdigest(), "stats": stats}
    ledger = run_dir / "ledger.jsonl"
    if ledger.is_file():
        events = []
        for line in ledger.read_text().splitlines():
            rec = json.loads(line)
            if rec["kind"] == "spend":
                out["spends"].append([rec["key"], rec["event"]])
                out["answers"].append(hashlib.sha256(json.dumps(rec["answers"], sort_keys=True).encode()).hexdigest())
                events.append(event_from_dict(rec["event"]))
        delta = json.loads((run_dir / "summary.json").read_text())["delta"]
        eps = both(merge_events(events), delta=delta, breakdown=False) if events else {}
        out["epsilon"] = {k: _num(r.value) for k, r in eps.items()}
    summary = json.loads((run_dir / "summary.json").read_text())
    out["test_accuracy"] = summary["test_accuracy"]
    out["summary_epsilon"] = [summary["epsilon_paper"], summary["epsilon_strict"]]  # DP-SGD: Opacus's, no ledger
    return out


def _num(x: float) -> float | str:
    return "inf" if math.isinf(x) else x


def _close(a: float, b: float, *, rel: float, abs_: float = 0.0) -> bool:
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory):
    from fabricate import write_npz

    root = tmp_path_factory.mktemp("behaviour")
    os.environ["PRIVDISTILL_CACHE"] = str(root / "cache")  # one stage cache for the module (built once)
    return root, write_npz(root / "tiny.npz", n=300)


@pytest.fixture(scope="module")
def golden() -> dict:
    if not GOLDEN.is_file():
        pytest.fail(f"{GOLDEN} is missing: record it with `python tests/test_method_behaviour.py --record`")
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_method_behaviour_matches_its_recorded_fingerprint(name, fabricated, golden):
    root, data = fabricated
    want = golden["cases"][name]
    got = fingerprint(run_case(name, root, data))
    # the budget: same mechanism uses, in the same order, priced the same (any machine)
    assert got["spends"] == want["spends"], f"{name}: the ledger's spends changed"
    for acc, value in want.get("epsilon", {}).items():
        assert got["epsilon"][acc] == value or _close(got["epsilon"][acc], value, rel=1e-9), (name, acc)
    for g, w in zip(got["summary_epsilon"], want["summary_epsilon"]):  # as printed: rounded
        assert g == w or _close(float(g), float(w), rel=1e-3, abs_=1e-3), f"{name}: summary ε {g} vs {w}"
    assert sorted(got["weights"]) == sorted(want["weights"]), f"{name}: different models were released"
    if golden["machine"] == machine_key():  # the recording machine's arithmetic: the very same bits
        assert got["answers"] == want["answers"], f"{name}: the released answers changed"
        for art, w in want["weights"].items():
            assert got["weights"][art]["sha256"] == w["sha256"], f"{name}: {art} weights changed"
        assert got["test_accuracy"] == want["test_accuracy"]
        return
    # another machine: float reordering moves weights by far less than a change of algorithm would. A pipeline
    # that trains a generator against a classifier amplifies it: on an AMD EPYC, against the Intel Xeon's
    # recording, DPDFD's and SRR's generators moved up to 3 % and DGD's (generator -> samples -> VAE -> student)
    # up to 10 %; a pipeline without a generator stays under 2 %. Such a case is held to its spends, ε, artifacts
    # and accuracy above, and to weights within 25 % (a changed algorithm moves them further)
    rel = 0.25 if "generator" in want["weights"] else 2e-2
    for art, w in want["weights"].items():
        for key, (total, norm) in w["stats"].items():
            g_total, g_norm = got["weights"][art]["stats"][key]
            assert _close(g_norm, norm, rel=rel, abs_=1e-3), f"{name}: {art}.{key} norm {g_norm} vs {norm}"
    assert abs(got["test_accuracy"] - want["test_accuracy"]) <= 0.1, name


def record() -> None:
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    torch.set_num_threads(1)
    os.environ["PRIVDISTILL_NO_PROGRESS"] = "1"
    from fabricate import write_npz

    root = Path(tempfile.mkdtemp(prefix="privdistill-golden-"))
    os.environ["PRIVDISTILL_CACHE"] = str(root / "cache")
    data = write_npz(root / "tiny.npz", n=300)
    cases = {name: fingerprint(run_case(name, root, data)) for name in CASES}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({"machine": machine_key(), "cases": cases}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(cases)} cases on {machine_key()} -> {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_method_behaviour.py --record")
    record()
