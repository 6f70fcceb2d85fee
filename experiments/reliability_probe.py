"""Bad inputs, tried as an adversarial user would (issue 28): every one run as its own `privdistill` process on a
throw-away directory, its answer classified and written to docs/diagnostics/reliability-probe.json (docs/
reliability.md shows the table).

    python experiments/reliability_probe.py [--out docs/diagnostics/reliability-probe.json] [--doc docs/reliability.md]

With --doc, the table between the markers `<!-- probe:begin -->` and `<!-- probe:end -->` of that file is
rewritten from the rows; rows answered "still running" name the deliberate acceptances listed in DELIBERATE.

Answers: "clear error" (non-zero exit, a one-line message, no traceback), "traceback" (non-zero exit with a
Python traceback: a bug), "accepted" (exit 0; the input was taken: the row says whether that is deliberate),
"still running" (past the time limit: the input was accepted and training started). No training is wanted from
any row, so each gets a short time limit. MNIST rows need the data in the default data root (they stop before
reading it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FAST = ["--no-progress", "--set", "run.threads=1"]


def fabricated(tmp: Path) -> dict[str, str]:
    """Small npz files with one defect each (and one good one for rows about options, not data)."""
    rng = np.random.default_rng(0)

    def npz(name: str, **arrays) -> str:
        path = tmp / f"{name}.npz"
        np.savez(path, **arrays)
        return str(path)

    x = rng.integers(0, 256, size=(300, 28, 28), dtype=np.uint8)
    y = np.arange(300) % 10
    xt, yt = x[:60], y[:60]
    return {
        "good": npz("good", x=x, y=y, x_test=xt, y_test=yt),
        "three": npz("three", x=x[:3], y=y[:3], x_test=xt[:3], y_test=yt[:3]),
        "test-only-label": npz("test-only-label", x=x, y=y % 9, x_test=xt, y_test=yt),
        "nan": npz("nan", x=np.full((300, 28, 28), np.nan, dtype=np.float32), y=y, x_test=xt, y_test=yt),
        "flat": npz("flat", x=x.reshape(300, -1)[:, :7], y=y, x_test=xt, y_test=yt),
        "float-labels": npz("float-labels", x=x, y=y + 0.5, x_test=xt, y_test=yt),
        "negative-labels": npz("negative-labels", x=x, y=y - 1, x_test=xt, y_test=yt),
        "length-mismatch": npz("length-mismatch", x=x, y=y[:200], x_test=xt, y_test=yt),
        "no-test": npz("no-test", x=x, y=y),
        "garbage": str(_write(tmp / "garbage.npz", b"not a zip file")),
    }


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def cases(tmp: Path, files: dict[str, str]) -> list[tuple[str, list[str]]]:
    good = f"npz:{files['good']}"
    garbage_weights = _write(tmp / "garbage.safetensors", b"\x00" * 64)
    (tmp / "empty-run").mkdir()
    torn = tmp / "torn-ledger"
    torn.mkdir()
    (torn / "ledger.jsonl").write_text('{"kind": "spend", "key": "a", "event": {"type": "lnmax"\n{"kind": ')
    return [
        # privacy parameters
        ("negative ε", ["srr", "-d", good, "-e", "-1"]),
        ("zero ε", ["srr", "-d", good, "-e", "0"]),
        ("NaN ε", ["dgd", "-d", good, "-e", "nan"]),
        ("infinite ε (DGD)", ["dgd", "-d", good, "-e", "inf"]),
        ("infinite ε (DP-SGD)", ["dpsgd", "-d", good, "-e", "inf"]),
        ("non-numeric ε", ["srr", "-d", good, "-e", "one"]),
        ("δ = 0", ["dpsgd", "-d", good, "-e", "1", "--delta", "0"]),
        ("δ ≥ 1", ["dpsgd", "-d", good, "-e", "1", "--delta", "2"]),
        ("δ as a config value above 1", ["dpdfd", "-d", good, "--set", "budget.delta=1.5"]),
        ("cap below the target ε", ["srr", "-d", good, "-e", "5", "--max-epsilon", "1"]),
        ("negative cap", ["srr", "-d", good, "-e", "1", "--max-epsilon", "-2"]),
        ("unknown accounting", ["srr", "-d", good, "--accounting", "lenient"]),
        ("DP-SGD steps that no σ can fit", ["dpsgd", "-d", good, "-e", "1e-9"]),
        ("DPDFD ε no step fits", ["dpdfd", "-d", good, "-e", "1e-9", "--accounting", "strict"]),
        ("negative query count to the estimator", ["privacy", "estimate", "lnmax", "--queries", "-10"]),
        ("Laplace scale of zero to the estimator", ["privacy", "estimate", "lnmax", "--queries", "10",
                                                    "--laplace-scale", "0"]),
        # datasets and data files
        ("unknown dataset", ["dgd", "-d", "imagenet-22k"]),
        ("missing npz", ["srr", "-d", "npz:/nonexistent/file.npz"]),
        ("npz that is not a zip", ["srr", "-d", f"npz:{files['garbage']}"]),
        ("npz of 3 training records", ["srr", "-d", f"npz:{files['three']}"]),
        ("a label only in the test split", ["srr", "-d", f"npz:{files['test-only-label']}"]),
        ("NaN pixels", ["srr", "-d", f"npz:{files['nan']}"]),
        ("images of the wrong shape", ["srr", "-d", f"npz:{files['flat']}"]),
        ("fractional labels", ["srr", "-d", f"npz:{files['float-labels']}"]),
        ("negative labels", ["srr", "-d", f"npz:{files['negative-labels']}"]),
        ("images and labels of different lengths", ["srr", "-d", f"npz:{files['length-mismatch']}"]),
        ("npz without a test split", ["srr", "-d", f"npz:{files['no-test']}"]),
        ("explicit --data-root that does not exist", ["dgd", "-d", "mnist", "--data-root", "/nonexistent/root"]),
        ("folder dataset that does not exist", ["srr", "-d", "folder:/nonexistent/dir"]),
        # configuration
        ("unknown preset", ["dgd", "-d", good, "--preset", "huge"]),
        ("--config naming no file", ["dgd", "-d", good, "--config", "nosuch"]),
        ("unknown section", ["dgd", "-d", good, "--set", "nosection.key=1"]),
        ("unknown key", ["srr", "-d", good, "--set", "srr.stagez=3"]),
        ("value of the wrong type", ["srr", "-d", good, "--set", "srr.stages=three"]),
        ("--set without =", ["srr", "-d", good, "--set", "srr.stages"]),
        ("zero stages", ["srr", "-d", good, "--set", "srr.stages=0"]),
        ("negative batch size", ["dpdfd", "-d", good, "--set", "dpdfd.batch_size=-3"]),
        ("zero teachers", ["dgd", "-d", good, "--set", "teachers.num_teachers=0"]),
        ("more teachers than records", ["dgd", "-d", good, "--set", "teachers.num_teachers=100000"]),
        ("unknown model", ["dpsgd", "-d", good, "--set", "dpsgd.model=resnet-9000"]),
        ("BatchNorm model under DP-SGD", ["dpsgd", "-d", good, "-e", "1", "--set", "dpsgd.model=paper-cnn-bn"]),
        ("augmentation with ScatterNet features", ["dpsgd", "-d", good, "--recipe", "scatternet",
                                                   "--set", "dpsgd.augment=shift"]),
        ("zero DP-SGD epochs", ["dpsgd", "-d", good, "--set", "dpsgd.epochs=0"]),
        ("unknown SRR setting", ["srr", "-d", good, "--set", "srr.setting=sideways"]),
        ("unknown label mechanism", ["srr", "-d", good, "--set", "srr.mechanism=coin"]),
        ("unknown DGD aggregation", ["dgd", "-d", good, "--aggregation", "median"]),
        ("unknown PATE aggregation", ["pate", "-d", good, "--set", "pate.aggregation=median"]),
        ("PATE hold-out larger than the data", ["pate", "-d", good, "--set", "pate.holdout=100000"]),
        ("DPDFD algorithm 4", ["dpdfd", "-d", good, "--algorithm", "4"]),
        ("negative seed", ["srr", "-d", good, "--seed", "-5"]),
        ("seed of 2^64", ["srr", "-d", good, "--seed", str(2**64)]),
        ("unknown precision", ["srr", "-d", good, "--precision", "fp8"]),
        ("unknown device", ["srr", "-d", good, "--device", "tpu"]),
        ("CUDA on a machine without one", ["srr", "-d", good, "--device", "cuda:3"]),
        # run directories and files
        ("--resume of a directory that does not exist", ["srr", "-d", good, "--resume", "--run-dir",
                                                         str(tmp / "never-made")]),
        ("--resume of an empty directory", ["srr", "-d", good, "--resume", "--run-dir", str(tmp / "empty-run")]),
        ("run directory under /proc", ["srr", "-d", good, "--run-dir", "/proc/privdistill-run"]),
        ("teacher directory that does not exist", ["dpdfd", "-d", good, "--teacher", "/nonexistent/run"]),
        ("teacher weights that are garbage", ["dpdfd", "-d", good, "--torchvision", "resnet18",
                                              "--weights", str(garbage_weights)]),
        ("eval of a missing run", ["eval", str(tmp / "never-made")]),
        ("report of a missing run", ["report", str(tmp / "never-made")]),
        ("privacy report of a directory without a ledger", ["privacy", "report", str(tmp / "empty-run")]),
        ("privacy report of a torn ledger", ["privacy", "report", str(torn)]),
        ("audit of a missing run", ["audit", str(tmp / "never-made")]),
        ("bench cell that does not exist", ["bench", "run", "--only", "no-such-cell", "--dry-run"]),
    ]


# Inputs that are accepted on purpose (the probe stops them after --timeout): why each is right to accept.
DELIBERATE = {
    "npz without a test split": "accepted: a tenth of the training records is held out as the test split (seeded)",
    "DPDFD ε no step fits": "accepted: the quick preset calibrates σ to the steps it caps (σ ≈ 10^9 at ε = 1e-9); "
                            "a valid, useless release whose plan prints σ",
}


def markdown_table(rows: list[dict]) -> str:
    lines = ["| bad input | command | answer | first line the user reads |", "| --- | --- | --- | --- |"]
    for r in rows:
        answer = r["answer"] if r["answer"] != "still running" else DELIBERATE.get(r["input"], "ACCEPTED (unintended)")
        message = r["message"].replace("|", "/")
        lines.append(f"| {r['input']} | `{r['command'].replace('|', '/')}` | {answer} | {message} |")
    return "\n".join(lines)


def classify(rc: int | None, output: str) -> str:
    if rc is None:
        return "still running"
    if rc == 0:
        return "accepted"
    return "traceback" if "Traceback (most recent call last)" in output else "clear error"


def message(output: str) -> str:
    """The line a user reads first: the error, without rich's box drawing."""
    lines = [ln.strip(" │╭╮╰╯─") for ln in output.splitlines()]
    lines = [ln for ln in lines if ln and ln not in ("Error", "Traceback (most recent call last):")]
    errors = [ln for ln in lines if any(w in ln.lower() for w in ("error", "refus", "invalid", "must", "not "))]
    return (errors or lines or [""])[0][:240]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="docs/diagnostics/reliability-probe.json")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--doc", help="markdown file whose probe table is rewritten")
    args = parser.parse_args()
    exe = str(Path(sys.executable).with_name("privdistill"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="privdistill-probe-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "PRIVDISTILL_CACHE": str(tmp / "cache"), "COLUMNS": "200",
               "PRIVDISTILL_NO_PROGRESS": "1"}
        files = fabricated(tmp)
        for what, argv in cases(tmp, files):
            is_run = argv[0] in ("dgd", "srr", "dpdfd", "dpsgd", "pate")
            # every run row gets a target ε unless it is about ε: each row has one defect, not two
            needs_eps = is_run and not {"-e", "--epsilon"} & set(argv) and "budget" not in " ".join(argv)
            full = [exe, *argv, *(["-e", "1"] if needs_eps else []), *(FAST if is_run else [])]
            if is_run and "--run-dir" not in argv:
                full += ["--run-dir", str(tmp / "runs" / f"{len(rows):03d}")]
            started = time.time()
            try:
                proc = subprocess.run(full, env=env, cwd=tmp, capture_output=True, text=True, timeout=args.timeout)
                rc, output = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as err:
                rc, output = None, (err.stdout or b"").decode() + (err.stderr or b"").decode()
            answer = classify(rc, output)
            shown = argv + (["-e", "1"] if needs_eps else [])  # as run, less the run directory and thread count
            rows.append({"input": what, "command": "privdistill " + " ".join(shown).replace(tmp_name, "$TMP"),
                         "answer": answer, "exit": rc, "message": message(output).replace(tmp_name, "$TMP"),
                         "seconds": round(time.time() - started, 1),
                         "output_tail": output[-800:].replace(tmp_name, "$TMP")})
            print(f"{answer:14s} {what}: {rows[-1]['message'][:110]}", flush=True)
    counts = {a: sum(r["answer"] == a for r in rows) for a in ("clear error", "accepted", "traceback",
                                                                  "still running")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"what": __doc__.split("\n\n")[0], "command":
                                          "python experiments/reliability_probe.py", "counts": counts, "rows": rows},
                                         indent=1, ensure_ascii=False) + "\n")
    print(counts)
    if args.doc:
        doc = Path(args.doc).read_text()
        begin, end = "<!-- probe:begin -->", "<!-- probe:end -->"
        head, rest = doc.split(begin)
        Path(args.doc).write_text(head + begin + "\n" + markdown_table(rows) + "\n" + end + rest.split(end)[1])


if __name__ == "__main__":
    main()
