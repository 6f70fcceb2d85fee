"""Probe (issue 24): does the choice of which synthetic samples DGD queries teach its student more?

DGD's strict ε fixes how many samples its teachers label (2,547 Gaussian votes, σ = 40, at strict ε 9.34), not
which: the paper draws them at random from the pool. For each rule of engine/query_selection.py (and `active`,
rounds in which the student trained on the labels so far picks the samples it is least sure of), this script
selects the queries from a DGD pool, releases their labels through the real GNMax mechanism, trains a paper-CNN
student on them alone (DGD's supervised part, 500 steps of 128) and reports its test accuracy, with how many
released labels equal the teachers' noiseless plurality. `--noiseless` adds a student on the plurality itself
(what the samples hold, apart from the vote noise), `--baseline-labels` one on the baseline's labels of the same
queries (what they would hold if every teacher read them as the generator's source); `--augment` and
`--label-smoothing` (comma-separated) train one student per recipe on the same released labels; `--sigma` alone
sizes the queries to the strict `--epsilon`. The rules read the pool and the baseline (the generator's source,
outside DGD's ε as the generator is); `active` reads the student, post-processing of released labels.
Evaluation only: the private teachers' votes are read for a simulation and nothing is released.

    flock /tmp/privdistill-cpu.lock python experiments/query_selection_probe.py --synthetic STAGE --teachers STAGE \
        --baseline STAGE --rules random,balanced,diverse,confident,uncertain,active --seeds 0 \
        --out docs/diagnostics/query-selection-probe-mnist.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from privdistill.config import ClassifierTraining, RunOptions
from privdistill.data import load_data
from privdistill.data.dataset import ImageDataset
from privdistill.engine import Env, RunDir
from privdistill.engine.ensemble import TeacherEnsemble

try:
    from privdistill.engine.query_selection import select_queries
except ImportError:  # the rules it compares left the package; so did its squared-error soft loss (1e62836)
    raise SystemExit("this probe's query rules (balanced, confident, uncertain) left the package in commit 36b23f9: "
                     "run it there (git worktree add /tmp/qs 36b23f9^)") from None
from privdistill.engine.synthesis import label_balance
from privdistill.engine.trainer import evaluate, predict_logits, train_classifier
from privdistill.models import create_model
from privdistill.privacy import mechanisms
from privdistill.privacy.calibration import max_count
from privdistill.privacy.events import GaussianQueries


def train_student(images, labels, data, env: Env, steps: int, seed: int = 0, augment: str = "none",
                  label_smoothing: float = 0.0, soft_targets: torch.Tensor | None = None,
                  soft_loss: str = "cross-entropy"):
    if soft_loss != "cross-entropy":  # the package's squared-error soft loss was removed as a dead branch
        raise SystemExit("--soft brier / shrink need train_classifier(soft_loss='brier'), which left the package in "
                         "commit 1e62836: run them at that commit (git worktree add /tmp/qs 1e62836^)")
    torch.manual_seed(seed)
    model = create_model("paper-cnn", kind="classifier", in_channels=data.train.channels,
                         num_classes=data.train.num_classes, image_size=data.train.image_size[0])
    cfg = ClassifierTraining(steps=steps, batch_size=128, lr=1e-3, eval_every_epochs=1e9, augment=augment,
                             label_smoothing=label_smoothing)
    train_classifier(model, ImageDataset(images, labels, data.train.num_classes, name="probe"), cfg=cfg, env=env,
                     soft_targets=soft_targets)
    return model


def project_to_simplex(v: torch.Tensor) -> torch.Tensor:
    """Each row's Euclidean projection onto the probability simplex (Duchi et al. 2008): max(v - tau, 0) with the
    one tau that makes the row sum to 1. On a noisy vote share it subtracts the noise floor: classes the noise
    alone lifted fall to 0."""
    u = v.sort(dim=1, descending=True).values
    css = u.cumsum(1) - 1
    ks = torch.arange(1, v.shape[1] + 1, dtype=v.dtype)
    rho = (u - css / ks > 0).sum(1, keepdim=True)  # the number of classes kept
    tau = css.gather(1, rho - 1) / rho.to(v.dtype)
    return (v - tau).clamp_min(0)


class Votes:
    """The teachers' vote counts on pool samples, counted once per sample (the slow part: 250 CNNs)."""

    def __init__(self, teachers: TeacherEnsemble, pool: torch.Tensor, env: Env):
        self.teachers, self.pool, self.env, self.known = teachers, pool, env, {}

    def __call__(self, idx: torch.Tensor) -> torch.Tensor:
        todo = [i for i in idx.tolist() if i not in self.known]
        if todo:
            counts = torch.cat(list(self.teachers.iter_votes(self.pool[todo], self.env)))
            self.known.update(zip(todo, counts))
        return torch.stack([self.known[i] for i in idx.tolist()])


def active_queries(pool, count, rounds, votes, sigma, noise, data, env, rng, reader, steps) -> tuple:
    """`rounds` rounds of count / rounds queries: the first balanced by the reader, each later one the unqueried
    samples the student trained on the labels so far answers with the narrowest margin, count / (rounds K) per
    class the student predicts."""
    k = data.train.num_classes
    idx = select_queries(pool, count // rounds, "balanced", reader=reader, env=env, rng=rng, num_classes=k)
    labels = mechanisms.gnmax(votes(idx), sigma=sigma, generator=noise)
    for r in range(1, rounds):
        student = train_student(pool[idx], labels, data, env, steps)
        rest = torch.ones(len(pool), dtype=torch.bool)
        rest[idx] = False
        rest = rest.nonzero().squeeze(1)
        need = count // rounds if r < rounds - 1 else count - len(idx)
        pick = rest[select_queries(pool[rest], need, "uncertain", reader=student, env=env, rng=rng, num_classes=k)]
        idx = torch.cat([idx, pick])
        labels = torch.cat([labels, mechanisms.gnmax(votes(pick), sigma=sigma, generator=noise)])
    return idx, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--synthetic", required=True, help="synthetic stage directory (DGD's pool)")
    ap.add_argument("--teachers", required=True, help="teachers stage directory")
    ap.add_argument("--baseline", required=True, help="baseline stage directory (the generator's source)")
    ap.add_argument("--queries", type=int, default=0, help="how many samples the teachers label; 0: as many as "
                    "GNMax at --sigma answers within --epsilon (strict), 2,547 at the defaults")
    ap.add_argument("--epsilon", type=float, default=9.34, help="strict ε of the votes (δ 1e-5)")
    ap.add_argument("--sigma", type=float, default=40.0)
    ap.add_argument("--rules", default="random,balanced,diverse,confident,uncertain,active")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the active rule")
    ap.add_argument("--student-steps", type=int, default=500)
    ap.add_argument("--noiseless", action="store_true", help="also a student on the noiseless plurality")
    ap.add_argument("--baseline-labels", action="store_true", help="also a student on the baseline's labels of the "
                    "same queries: what the samples would teach if every teacher read them as the generator's source")
    ap.add_argument("--augment", default="none", help="the student's augmentations of its labelled samples "
                    "(comma-separated: one student each)")
    ap.add_argument("--label-smoothing", default="0", help="the student's label smoothings (comma-separated)")
    ap.add_argument("--soft", default="", help="students on soft targets made from the same noisy histogram "
                    "(comma-separated scales s: the simplex projection of s * noisy counts / teachers, 'brier': the "
                    "noisy share itself under a squared-error loss, 'shrink': the noisy share shrunk towards a "
                    "cross-fitted student's answer (empirical Bayes), 'clean': the noiseless vote share)")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per rule and seed (appended)")
    args = ap.parse_args()

    env = Env.from_options(RunOptions(precision="auto", progress=False))  # bf16 where the CPU has it natively
    data = load_data(args.dataset, None, seed=0)
    k = data.train.num_classes
    pool = next(iter(load_file(str(Path(args.synthetic) / "synthetic.safetensors")).values()))
    teachers = TeacherEnsemble.load(Path(args.teachers) / "teachers.safetensors", env.device)
    baseline = RunDir(args.baseline).load_weights("model").eval()
    votes = Votes(teachers, pool, env)
    if args.queries <= 0:
        args.queries = max_count(GaussianQueries(sigma=args.sigma, count=1), target_epsilon=args.epsilon, delta=1e-5)
    recipes = [{"augment": a, "label_smoothing": float(ls)} for a in args.augment.split(",")
               for ls in args.label_smoothing.split(",")]
    for seed in args.seeds:
        for rule in args.rules.split(","):
            rng, noise = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(1000 + seed)
            if rule == "active":
                idx, labels = active_queries(pool, args.queries, args.rounds, votes, args.sigma, noise, data, env,
                                             rng, baseline, args.student_steps)
            else:
                idx = select_queries(pool, args.queries, rule, reader=baseline, env=env, rng=rng, num_classes=k)
                # the noisy histogram GNMax draws; its argmax is exactly mechanisms.gnmax with this noise stream
                noisy = mechanisms.noisy_histogram(votes(idx), distribution="gaussian", scale=args.sigma,
                                                   generator=noise)
                labels = noisy.argmax(1)
            stats, plurality, base = label_stats(pool, idx, labels, votes, baseline, k, env)
            if args.soft and rule != "active":
                stats["soft"] = soft_rows(pool[idx], labels, noisy, votes(idx), data, env, args)
            for fit in recipes:  # several student recipes on the same released labels
                t0 = time.perf_counter()
                row = {"queries": len(idx), "sigma": args.sigma, **fit, "student_steps": args.student_steps, **stats,
                       **student_rows(pool[idx], labels, plurality, base, data, env, args, fit)}
                row.update(rule=rule, seed=seed, minutes=round((time.perf_counter() - t0) / 60, 1),
                           device=env.describe(), note="evaluation only: reads the private teachers' votes")
                print(json.dumps(row), flush=True)
                with args.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")


def label_stats(pool, idx, labels, votes, baseline, k, env) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """How the released labels of `idx` compare with the teachers' noiseless plurality and the baseline (once per
    selection, whatever the student recipes), that plurality and the baseline's labels."""
    counts = votes(idx)
    plurality = counts.argmax(1)
    base = predict_logits(baseline, pool[idx], env).argmax(1)
    return {"labels_equal_plurality": round(float((labels == plurality).float().mean()), 4),
            "labels_equal_baseline": round(float((labels == base).float().mean()), 4),
            "plurality_equal_baseline": round(float((plurality == base).float().mean()), 4),
            "mean_top_vote_share": round(float(counts.max(1).values.float().mean() / votes.teachers.num_teachers), 4),
            "label_balance": round(label_balance(labels, k), 4)}, plurality, base


def soft_rows(images, labels, noisy, counts, data, env, args) -> dict:
    """Test accuracy of students trained on soft targets made from the released noisy histogram (post-processing
    of it, at the same data-independent ε as its argmax) or, for 'clean', from the noiseless counts."""
    n = counts.sum(1, keepdim=True).double()  # the number of teachers
    row = {}
    for spec in args.soft.split(","):
        if spec == "clean":
            target = counts.double() / n
        elif spec == "brier":
            target = noisy.double() / n
        elif spec == "shrink":
            target, extra = shrunk_share(images, labels, noisy.double() / n, args.sigma / float(n[0]), data, env, args)
            row["shrink_stats"] = extra
        else:
            target = project_to_simplex(float(spec) * noisy.double() / n)
        student = train_student(images, labels, data, env, args.student_steps, soft_targets=target.float(),
                                soft_loss="brier" if spec in ("brier", "shrink") else "cross-entropy")
        row[spec] = {"student_test_accuracy": round(evaluate(student, data.test, env), 4),
                     "mean_classes_kept": round(float((target > 0).double().sum(1).mean()), 3),
                     "target_argmax_equal_released": round(float((target.argmax(1) == labels).double().mean()), 4)}
        print(spec, row[spec], flush=True)
    return row


def shrunk_share(images, labels, share, noise_std, data, env, args, folds: int = 2) -> tuple[torch.Tensor, dict]:
    """Empirical-Bayes denoising of the released noisy vote share (post-processing of it, so free): each query's
    share is shrunk towards a cross-fitted student's softmax on it (a student fitted by squared error to the noisy
    shares of the other folds), by the one weight w = tau^2 / (tau^2 + noise^2) that a Gaussian prior around the
    student's answer gives, tau^2 read off the residuals (their mean square per class less the noise's known
    variance (sigma / teachers)^2). James-Stein's idea with the student as the point it shrinks to."""
    perm = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    prior = torch.empty_like(share)
    for f in range(folds):
        held = perm[f::folds]
        fit = torch.cat([perm[g::folds] for g in range(folds) if g != f])
        student = train_student(images[fit], labels[fit], data, env, args.student_steps,
                                soft_targets=share[fit].float(), soft_loss="brier")
        prior[held] = predict_logits(student, images[held], env).double().softmax(1)
    noise_var = float(noise_std) ** 2
    tau2 = max(float((share - prior).square().mean()) - noise_var, 1e-6)
    w = tau2 / (tau2 + noise_var)
    stats = {"weight_on_release": round(w, 4), "tau": round(tau2 ** 0.5, 4), "noise_std": round(noise_std, 4),
             "prior_argmax_equal_released": round(float((prior.argmax(1) == labels).double().mean()), 4)}
    return w * share + (1 - w) * prior, stats


def student_rows(images, labels, plurality, base, data, env, args, fit) -> dict:
    """Test accuracy of a student trained with recipe `fit` on the released labels (and, with --noiseless, on the
    teachers' plurality; with --baseline-labels, on the baseline's labels)."""
    student = train_student(images, labels, data, env, args.student_steps, **fit)
    row = {"student_test_accuracy": round(evaluate(student, data.test, env), 4)}
    if args.noiseless:
        clean = train_student(images, plurality, data, env, args.student_steps, **fit)
        row["noiseless_student_test_accuracy"] = round(evaluate(clean, data.test, env), 4)
    if args.baseline_labels:
        source = train_student(images, base, data, env, args.student_steps, **fit)
        row["baseline_labels_student_test_accuracy"] = round(evaluate(source, data.test, env), 4)
    return row

if __name__ == "__main__":
    main()
