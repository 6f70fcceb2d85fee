"""Are the rules that refit a preset to a dataset's size N (methods/sizing.py, `fit_to_data`) measured, not assumed?
Part 3 of "Your own data, honestly planned": each rule must not lower accuracy against the unrefitted preset at
the same ε.

Data: stratified subsets (class shares kept, nested: 1k ⊂ 5k ⊂ 20k, seed 0) of the MNIST and Fashion-MNIST training
sets, written as npz files of one's own (uint8 28 x 28). Test set: a fixed stratified 2,000-image slice of the
official test set (seed 1), to keep evaluation cheap; the same slice for every size. Optionally the issue's small
dataset (MNIST at 8 x 8 on 0..16, experiments/small_digits.py) as dataset `digits`.

Each cell (dataset, size, study, ε) runs the method twice through the CLI, as a user would:
  refitted    the preset as it is (the rules refit the values the user did not choose);
  unrefitted  the same command with every key the refitted plan's 'sized to the data' notes changed pinned to the
              preset's value with --set (a value given with --set is never refitted). The pins are read from the
              refitted plan's own notes (`--dry-run`), so they are exactly the rule's keys and the preset's values.
Both runs are recorded: test accuracy, strict (and paper) ε, wall seconds, the plan's notes, or the refusal (an
unrefitted plan that cannot start, a plan the judge refuses). Rows go to docs/diagnostics/sizing-study.json
(resumable: a (cell, arm) already there is skipped); a markdown table is printed.

    python experiments/sizing_study.py data                      # write the npz subsets (~/.cache/privdistill/sizing)
    python experiments/sizing_study.py run --study dpsgd-steps --size 1000 --dataset mnist --epsilon 1
    python experiments/sizing_study.py table
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "diagnostics" / "sizing-study.json"
DATA_DIR = Path(os.environ.get("SIZING_DATA", Path.home() / ".cache" / "privdistill" / "sizing"))
RUNS_DIR = Path(os.environ.get("SIZING_RUNS", "/tmp/sizing-runs"))
SIZES = (1000, 5000, 20000)
# also written: 40k, where DGD's cluster-vote threshold was located (nested: the smaller subsets are unchanged)
DATA_SIZES = (*SIZES, 40000)
TEST_SIZE = 2000
DATASETS = {"mnist": "mnist", "fashion-mnist": "fashion-mnist"}

#: study: (method, the extra CLI arguments, the rule(s) it exercises). Cheapest first.
STUDIES = {
    "dpsgd-steps": ("dpsgd", ["-r", "paper"], "at least MIN_STEPS optimiser steps (DP-SGD's network)"),
    "pate-teachers": ("pate", [], "teachers count and batch, vote noise (Confident-GNMax T, σ1, σ2)"),
    "srr-labels": ("srr", ["--accounting", "paper"], "SRR teacher's steps, student epochs (the labels are not capped)"),
    "dgd-teachers": ("dgd", [], "teachers count and batch, vote noise, baseline steps"),
    "dpsgd-recipe-steps": ("dpsgd", [], "the default recipe's epochs raised while each step's noise-to-signal "
                                        "ratio stays at most 0.3"),
}
DEFAULT_EPSILONS = {"dpsgd-steps": (1.0, 10.0), "pate-teachers": (10.0,), "srr-labels": (10.0,),
                    "dgd-teachers": (10.0,), "dpsgd-recipe-steps": (10.0,)}
LIGHT = ["run.threads=1"]  # one core: the machine has two and another training runs beside this study
NOTE = re.compile(r"sized to the data: (\w+)\.(\w+) (\S+) -> (\S+):")


def _stratified(labels: np.ndarray, sizes: tuple[int, ...], seed: int) -> dict[int, np.ndarray]:
    """Nested stratified subsets: each class keeps its share (largest remainders), the smaller inside the larger."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    order = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    share = np.array([len(order[c]) for c in classes]) / len(labels)
    out = {}
    for n in sizes:
        raw = share * n
        counts = np.floor(raw).astype(int)
        counts[np.argsort(-(raw - counts))[: n - counts.sum()]] += 1
        idx = np.concatenate([order[c][:k] for c, k in zip(classes, counts)])
        out[n] = np.sort(idx)
    return out


def make_data() -> None:
    from privdistill.data import load_data

    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for name, builtin in DATASETS.items():
        data = load_data(builtin)
        x, y = data.train.images.numpy()[:, 0], data.train.labels.numpy()
        xt, yt = data.test.images.numpy()[:, 0], data.test.labels.numpy()
        test = _stratified(yt, (TEST_SIZE,), seed=1)[TEST_SIZE]
        for n, idx in _stratified(y, DATA_SIZES, seed=0).items():
            path = DATA_DIR / f"{name}-{n}.npz"
            if path.is_file():  # the stage cache knows it by its content
                continue
            np.savez(path, x=x[idx].astype(np.uint8), y=y[idx].astype(np.int64), x_test=xt[test].astype(np.uint8),
                     y_test=yt[test].astype(np.int64))
            print(f"wrote {path}: {len(idx)} train (class counts {np.bincount(y[idx]).tolist()}), {len(test)} test")
    digits = DATA_DIR / "digits-1500.npz"
    if not digits.is_file():
        subprocess.run([sys.executable, str(ROOT / "experiments" / "small_digits.py"), str(digits)], check=True)


def spec(dataset: str, size: int) -> str:
    if dataset == "digits":
        return f"npz:{DATA_DIR / 'digits-1500.npz'}?range=0,16"
    return f"npz:{DATA_DIR / f'{dataset}-{size}.npz'}"


def base_command(study: str, dataset: str, size: int, epsilon: float, extra_set: list[str]) -> list[str]:
    method, args, _ = STUDIES[study]
    sets = [a for s in [*LIGHT, *extra_set] for a in ("--set", s)]
    return [method, "-d", spec(dataset, size), "-e", f"{epsilon:g}", *args, *sets, "--no-progress"]


def cli(args: list[str], timeout: float | None = None) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "400"}  # no wrapped plan lines
    started = time.perf_counter()
    try:
        proc = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "privdistill", *args], capture_output=True,
                              text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731 - bytes here
        proc = subprocess.CompletedProcess(exc.cmd, -9, text(exc.stdout), text(exc.stderr) + "\ntimed out")
    return proc, time.perf_counter() - started


def refusal(proc: subprocess.CompletedProcess) -> str:
    text = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.lower().startswith("error")), lines[-1] if lines else "?")[:1200]


def pins_of(study: str, dataset: str, size: int, epsilon: float, extra_set: list[str]) -> tuple[list[str], list[str]]:
    """(the --set pins that undo every refit of the refitted plan, that plan's 'sized to the data' notes)."""
    proc, _ = cli([*base_command(study, dataset, size, epsilon, extra_set), "--dry-run", "--set",
                   "run.plan_check=warn"])
    text = proc.stdout + proc.stderr
    notes = sorted({m.group(0)[:-1] for m in NOTE.finditer(text)})
    pins = [f"{m.group(1)}.{m.group(2)}={m.group(3)}" for m in NOTE.finditer(text)]
    return list(dict.fromkeys(pins)), notes


def run_arm(study: str, dataset: str, size: int, epsilon: float, arm: str, pins: list[str], extra_set: list[str],
            timeout: float | None) -> dict:
    probe = "".join(f"-{re.sub(r'[^A-Za-z0-9]+', '_', s)}" for s in extra_set)  # one run directory per probe
    run_dir = RUNS_DIR / f"{study}-{dataset}-{size}-eps{epsilon:g}{probe}-{arm}"
    sets = extra_set + (pins if arm == "unrefitted" else [])
    cmd = base_command(study, dataset, size, epsilon, sets)
    proc, wall = cli([*cmd, "--run-dir", str(run_dir)], timeout=timeout)
    row = {"arm": arm, "command": "privdistill " + " ".join(cmd), "wall_s": round(wall, 1)}
    summary = run_dir / "summary.json"
    if proc.returncode == 0 and summary.is_file():
        s = json.loads(summary.read_text())
        row.update(accuracy=s.get("test_accuracy"), epsilon_strict=s.get("epsilon_strict"),
                   epsilon_paper=s.get("epsilon_paper"), at_chance=s.get("at_chance"),
                   notes=[n for n in (s.get("plan_notes") or []) if "sized to the data" in n or "run all the same"
                          in n], plan=_plan_lines(proc.stdout + proc.stderr))
    else:
        row["refused" if proc.returncode in (1, 2) else "failed"] = refusal(proc)
        row["plan"] = _plan_lines(proc.stdout + proc.stderr)
    return row


def _plan_lines(text: str) -> list[str]:
    """The plan's lines that say what the noise and the sizes are (σ, steps, queries, teachers)."""
    keep = re.compile(r"σ|sigma|steps|queries|teachers|noise|labels|epochs", re.I)
    return [ln.strip()[:300] for ln in text.splitlines() if keep.search(ln) and "Warning" not in ln][:25]


def load_rows() -> list[dict]:
    return json.loads(OUT.read_text()) if OUT.is_file() else []


def save_rows(rows: list[dict]) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


def key(row: dict) -> tuple:
    return (row["study"], row["dataset"], row["size"], row["epsilon"], row["arm"], tuple(row.get("extra_set", [])))


def run(args: argparse.Namespace) -> None:
    rows = load_rows()
    done = {key(r) for r in rows}
    for study in args.study:
        for dataset in args.dataset:
            for size in ([1500] if dataset == "digits" else args.size):
                for epsilon in args.epsilon or DEFAULT_EPSILONS[study]:
                    cell = {"study": study, "method": STUDIES[study][0], "rule": STUDIES[study][2],
                            "dataset": dataset, "size": size, "epsilon": epsilon, "extra_set": args.set}
                    arms = [a for a in args.arm if key({**cell, "arm": a}) not in done]
                    if not arms:
                        continue
                    pins, notes = pins_of(study, dataset, size, epsilon, args.set)
                    # a batch the refitted plan lowered to its (fewer) teachers' partitions cannot be pinned back
                    # when the preset's teachers have still smaller ones: the batch rule then stays on, as below
                    batch_pin = [p for p in pins if p.startswith("teachers.batch_size=")]
                    if batch_pin:
                        proc, _ = cli([*base_command(study, dataset, size, epsilon, args.set + pins), "--dry-run",
                                       "--set", "run.plan_check=warn"])
                        if proc.returncode != 0 and "exceeds the smallest partition" in refusal(proc):
                            pins = [p for p in pins if p not in batch_pin]
                    # rules that apply only once the pins are in (a batch larger than the pinned teachers'
                    # partitions): the unrefitted arm leaves them on, so that it can start; whether it could start
                    # without them is recorded too
                    follow, follow_notes = pins_of(study, dataset, size, epsilon, args.set + pins)
                    fully = None
                    if follow:
                        proc, _ = cli([*base_command(study, dataset, size, epsilon, args.set + pins + follow),
                                       "--dry-run", "--set", "run.plan_check=warn"])
                        fully = {"pins": follow, "notes": follow_notes,
                                 "starts": proc.returncode == 0,
                                 "error": None if proc.returncode == 0 else refusal(proc)}
                    for arm in arms:
                        print(f"[{time.strftime('%H:%M:%S')}] {study} {dataset} {size} eps {epsilon:g} {arm} "
                              f"pins {pins if arm == 'unrefitted' else '-'}", flush=True)
                        row = {**cell, "pins": pins, "refit_notes": notes,
                               **({"fully_unrefitted": fully} if arm == "unrefitted" and fully else {}),
                               **run_arm(study, dataset, size, epsilon, arm, pins, args.set, args.timeout)}
                        rows = [r for r in load_rows() if key(r) != key(row)] + [row]
                        save_rows(rows)
                        print("   ", _cell_text(row), flush=True)
    table()


def _cell_text(r: dict) -> str:
    if r.get("accuracy") is not None:
        eps = f"{r['epsilon_strict']:.3g}" if r.get("epsilon_strict") is not None else "-"
        return f"{100 * r['accuracy']:.2f} % (strict ε {eps}, {r['wall_s']:.0f} s)"
    what = r.get("refused") or r.get("failed") or "?"
    return f"{'refused' if 'refused' in r else 'failed'} ({r['wall_s']:.0f} s): {what[:160]}"


def table() -> None:
    rows = load_rows()
    cells: dict[tuple, dict] = {}
    for r in rows:
        cells.setdefault((r["study"], r["dataset"], r["size"], r["epsilon"], tuple(r.get("extra_set", []))),
                         {})[r["arm"]] = r
    print("| study (rule) | data | N | ε | refitted: accuracy (strict ε, wall) "
          "| unrefitted: accuracy (strict ε, wall) |"
          " Δ points | what was refitted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    order = list(STUDIES)
    for (study, dataset, size, eps, extra), arms in sorted(cells.items(), key=lambda kv: (order.index(kv[0][0]),
                                                                                          kv[0][1], kv[0][2],
                                                                                          kv[0][3], kv[0][4])):
        ref, unref = arms.get("refitted"), arms.get("unrefitted")
        delta = "-"
        if ref and unref and ref.get("accuracy") is not None and unref.get("accuracy") is not None:
            delta = f"{100 * (ref['accuracy'] - unref['accuracy']):+.2f}"
        pins = (ref or unref or {}).get("pins", [])
        refit = ", ".join(f"{p.split('=')[0]} {p.split('=')[1]} → {_new(p, ref or unref)}" for p in pins) or "nothing"
        name = study + (" " + " ".join(extra) if extra else "")
        fully = (unref or {}).get("fully_unrefitted")
        if fully:
            refit += (f"; unrefitted arm keeps {', '.join(fully['notes'])[:200]}"
                      + ("" if fully["starts"] else f" (without it: cannot start: {fully['error'][:160]})"))
        print(f"| {name} | {dataset} | {size:,} | {eps:g} | {_cell_text(ref) if ref else '-'} | "
              f"{_cell_text(unref) if unref else '-'} | {delta} | {refit} |")


def _new(pin: str, row: dict) -> str:
    k = pin.split("=")[0]
    for n in row.get("refit_notes", []):
        if f": {k} " in n:
            return n.split(" -> ")[1].split(":")[0]
    return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("data", help="write the stratified npz subsets")
    sub.add_parser("table", help="print the markdown table of the JSON")
    r = sub.add_parser("run", help="run the selected cells (skipping those already in the JSON)")
    r.add_argument("--study", nargs="+", default=list(STUDIES), choices=list(STUDIES))
    r.add_argument("--dataset", nargs="+", default=["mnist", "fashion-mnist"],
                   choices=["mnist", "fashion-mnist", "digits"])
    r.add_argument("--size", nargs="+", type=int, default=list(SIZES))
    r.add_argument("--epsilon", nargs="+", type=float, default=None, help="default: the study's own (DP-SGD 1, 10)")
    r.add_argument("--arm", nargs="+", default=["refitted", "unrefitted"], choices=["refitted", "unrefitted"])
    r.add_argument("--set", action="append", default=[], help="an extra --set for both arms (a probe of the rule)")
    r.add_argument("--timeout", type=float, default=None, help="seconds a run may take before it is recorded failed")
    args = parser.parse_args()
    {"data": lambda: make_data(), "table": table, "run": lambda: run(args)}[args.command]()


if __name__ == "__main__":
    main()
