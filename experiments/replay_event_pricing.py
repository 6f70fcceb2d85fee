"""Replay every recorded privacy event through two versions of the accountants and compare their ε.

    python experiments/replay_event_pricing.py --against REF [--ledgers DIR ...] [--keep DIR]

What is replayed (collected once, as JSON, so that both versions price the very same inputs):

* every ledger.jsonl found under the ``--ledgers`` directories (default: this checkout's runs/): the events
  merged as the ledger merges them, the ε after each spend (recorded in the ledger too, and compared with it
  for information), and, where the votes' side files are there, PATE's data-dependent ε;
* every committed result file (results/**/*.json): the events its run spent, rebuilt from what it records (PATE
  records its event; DGD, DPDFD and SRR their queries, noise and steps; DP-SGD its sampling and noise); DP
  sources of end-to-end runs record only their ε, and are left out;
* a fixed set of event lists that reach every event type and the accountants' corners (several δ-consuming
  families, DP-SGD δ shares, label-DP, Alg. 3, filters, count 0), with seeded random votes;
* calibration: the most queries / steps and the least noise every distinct event allows at ε 1 and 10.

Each version (``REF``, a git revision, extracted with git archive; and this checkout's src/) prices them in its
own process; every number must agree to 1e-9 relative. Exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REL = 1e-9
DELTA = 1e-5
#: the events' JSON type names before they were named after their mechanisms -> after: a ledger written by either
#: version is read by both (the newer reads the old names itself; the older needs them translated back)
RENAMED = {"lnmax": "laplace-queries", "gnmax": "gaussian-queries", "confident-gnmax": "confident-gaussian-queries",
           "rr": "randomized-response", "srr": "randomized-response-with-prior", "dpdfd": "normalised-gaussian",
           "dpsgd": "subsampled-gaussian", "latent-laplace": "laplace-on-synthetic-codes"}


# ==================================================================================== collection
def _ledger_cases(dirs: list[str]) -> list[dict]:
    cases = []
    paths = sorted({p for d in dirs for p in glob.glob(os.path.join(d, "**", "ledger.jsonl"), recursive=True)})
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        header, spends = None, []
        for line in lines:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line: the ledger ignores it too
            if rec.get("kind") == "header":
                header = rec
            elif rec.get("kind") == "spend":
                spends.append(rec)
        if header is None or not spends:
            continue
        events = [rec["event"] for rec in spends]
        votes = []
        for rec in spends:  # the data-dependent PATE bound, from the recorded votes (inline or side files)
            entry = None
            if rec.get("votes") is not None:
                entry = {"root": os.path.dirname(path), "votes": rec["votes"]}
                if rec.get("answered") is not None:
                    entry["answered"] = rec["answered"]
            votes.append(entry)
        cases.append({"id": f"ledger:{path}", "delta": header["delta"], "events": events,
                      "after": [rec.get("epsilon_after") for rec in spends],
                      "votes": votes if any(votes) else None})
    return cases


def _set(command: str, name: str, default):
    m = re.search(rf"--set {re.escape(name)}=(\S+)", command)
    return type(default)(m.group(1)) if m else default


def _result_events(doc: dict) -> list[dict] | None:
    """The events a result file's run spent, rebuilt from what it records (None: not reconstructible)."""
    method, cmd = doc.get("method"), doc.get("command", "")
    if method == "pate" and isinstance(doc.get("event"), dict):
        return [doc["event"]]
    if method in ("dgd", "dgd+") and doc.get("queries") is not None:
        if doc.get("privacy_scope") == "end-to-end":
            return None  # the DP source records its ε only
        if doc["aggregation"] == "laplace":
            events = [{"type": "lnmax", "scale": _set(cmd, "dgd.laplace_scale", 40.0), "count": doc["queries"]}]
        else:
            events = [{"type": "gnmax", "sigma": _set(cmd, "dgd.gaussian_sigma", 40.0), "count": doc["queries"]}]
        if doc.get("latent_noise"):
            events.append({"type": "latent-laplace", "epsilon1": _set(cmd, "dgd.epsilon1", 0.01)})
        return events
    if method == "dpdfd" and doc.get("sigma") is not None:
        alg = doc.get("algorithm", 1)
        ev = {"type": "dpdfd", "clip_norm": doc["clip_norm"], "sigma": doc["sigma"], "batch_size": doc["batch_size"],
              "steps": doc["steps"], "num_teachers": doc.get("num_teachers") or 1,
              "granularity": doc.get("granularity", "per_sample"), "algorithm": alg}
        if alg == 3:  # the private set's size is not recorded: it sets only the channel's ε, a detail
            ev["dataset_size"] = {"mnist": 60000, "fashion-mnist": 60000}.get(doc.get("dataset"), 10 * ev["batch_size"])
        return [ev]
    # older SRR runs record the per-label ε as the target under the paper accounting
    eps = doc.get("epsilon_per_label") or (doc.get("target_epsilon") if doc.get("accounting") == "paper" else None)
    if method == "srr" and eps and doc.get("num_labels"):
        mech = doc.get("mechanism", "srr")
        n, setting = doc["num_labels"], doc.get("setting", "data-free")
        if setting == "data-free" and mech == "rr":
            return [{"type": "rr", "epsilon": eps, "count": n, "num_classes": 10}]
        return [{"type": "srr", "epsilon": eps, "count": n, "num_classes": 10, "setting": setting}]
    if method == "dpsgd" and isinstance(doc.get("dpsgd_accounting"), dict):
        a = doc["dpsgd_accounting"]
        return [{"type": "dpsgd", "noise_multiplier": a["noise_multiplier"], "sample_rate": a["sample_rate"],
                 "steps": a["steps"], "delta": doc["delta"]}]  # all of the run's δ
    return None


def _result_cases() -> tuple[list[dict], list[str]]:
    cases, skipped = [], []
    for path in sorted(glob.glob(str(ROOT / "results" / "**" / "*.json"), recursive=True)):
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(doc, dict) or doc.get("epsilon_strict") is None:
            continue
        rel = os.path.relpath(path, ROOT)
        events = _result_events(doc)
        if events is None:
            skipped.append(f"{rel} ({doc.get('method')}, {doc.get('privacy_scope') or 'method'}: not rebuilt)")
            continue
        recorded = {"paper": doc.get("epsilon_paper"), "strict": doc.get("epsilon_strict")}
        if doc.get("method") == "dpsgd":  # the result's paper ε is Opacus's; strict is the replace-one PLD
            recorded = {"strict": doc["dpsgd_accounting"].get("epsilon_replace_one_pld")}
        cases.append({"id": f"result:{rel}", "delta": doc["delta"], "events": events, "recorded": recorded})
    return cases, skipped


def _fixed_cases() -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(20261203)
    lnmax = {"type": "lnmax", "scale": 40.0, "count": 400}
    gnmax = {"type": "gnmax", "sigma": 40.0, "count": 300}
    conf = {"type": "confident-gnmax", "threshold": 200.0, "sigma1": 150.0, "sigma2": 40.0, "count": 500,
            "answered": 180}
    filt = dict(conf, count=900, answered=300, filter_budget=500)
    dpdfd = {"type": "dpdfd", "clip_norm": 1e-3, "sigma": 100.0, "batch_size": 256, "steps": 30, "num_classes": 10}
    alg2 = dict(dpdfd, algorithm=2, num_teachers=100, granularity="batch_sum")
    alg3 = dict(dpdfd, algorithm=3, dataset_size=60000, steps=235)
    srr = {"type": "srr", "epsilon": 1.0, "count": 60000, "num_classes": 10}
    label_dp = dict(srr, setting="label-dp")
    rr = {"type": "rr", "epsilon": 2.0, "count": 5000, "num_classes": 10}
    src = {"type": "dpsgd", "noise_multiplier": 1.1, "sample_rate": 0.004, "steps": 2000, "delta": 5e-6}
    stats = {"type": "dpsgd", "noise_multiplier": 3.0, "sample_rate": 1.0, "steps": 1, "delta": 2e-6,
             "what": "DP feature statistics"}
    latent = {"type": "latent-laplace", "epsilon1": 0.01, "dim": 32}
    lists = {
        "lnmax": [lnmax], "lnmax-two-scales": [lnmax, dict(lnmax, scale=20.0, count=50), dict(lnmax, count=17)],
        "lnmax-soft-sensitivity": [dict(lnmax, sensitivity=4.0)], "gnmax": [gnmax], "confident": [conf],
        "confident-unknown": [dict(conf, answered=None)], "confident-filter": [filt],
        "confident-merge": [conf, dict(conf, count=40, answered=3), filt, dict(filt, count=10, answered=2,
                                                                               filter_budget=6)],
        "pate-families": [lnmax, gnmax, conf, dpdfd], "dgd": [lnmax, latent], "dgd+": [gnmax, latent],
        "dgd-end-to-end": [src, gnmax, latent], "srr-end-to-end": [src, stats],
        "source-only": [src], "source-eats-delta": [dict(src, delta=1e-5), gnmax],
        "dpdfd": [dpdfd], "dpdfd-alg2": [alg2], "dpdfd-alg3": [alg3], "dpdfd-alg3-no-steps": [dict(alg3, steps=0)],
        "dpdfd-mixed": [dpdfd, alg2, dict(dpdfd, num_classes=None)], "srr": [srr], "srr-label-dp": [label_dp],
        "srr-label-dp-stages": [dict(label_dp, count=3000)] * 4, "srr-label-dp-none": [dict(label_dp, count=0)],
        "rr": [rr], "rr-huge-epsilon": [dict(rr, epsilon=800.0, count=3)], "rr-and-srr": [rr, srr],
        "labels-and-votes": [srr, lnmax], "zero-counts": [dict(lnmax, count=0), dict(gnmax, count=0), latent],
        "everything": [lnmax, gnmax, conf, filt, dpdfd, alg2, srr, rr, src, latent],
    }
    cases = [{"id": f"fixed:{name}", "delta": DELTA, "events": evs} for name, evs in lists.items()]
    cases += [{"id": f"fixed:{name}@delta=1e-7", "delta": 1e-7, "events": lists[name]}
              for name in ("lnmax", "confident", "dpdfd", "srr", "dgd-end-to-end")]

    def votes(n: int, teachers: int = 250, k: int = 10) -> list:
        out = []
        for _ in range(n):
            p = rng.dirichlet(np.full(k, rng.choice([0.05, 0.3, 3.0])))
            out.append(rng.multinomial(teachers, p).tolist())
        return out

    v1, v2, v3 = votes(400), votes(300), votes(500)
    answered = (np.max(np.asarray(v3), axis=1) + rng.normal(0, 150, 500) >= 200).tolist()
    cases.append({"id": "fixed:data-dependent", "delta": DELTA,
                  "events": [lnmax, gnmax, dict(conf, answered=sum(answered))],
                  "votes": [{"votes": v1}, {"votes": v2}, {"votes": v3, "answered": answered}]})
    cases.append({"id": "fixed:data-dependent-partial", "delta": DELTA, "events": [gnmax, dpdfd, srr],
                  "votes": [{"votes": v2}, None, None]})
    return cases


def collect(ledger_dirs: list[str]) -> dict:
    ledgers = _ledger_cases(ledger_dirs)
    results, skipped = _result_cases()
    cases = ledgers + results + _fixed_cases()
    templates, seen = [], set()
    for case in cases:  # calibration: every distinct event (count 1 / its noise) at ε 1 and 10
        for ev in case["events"]:
            key = json.dumps({k: v for k, v in ev.items() if k not in ("count", "steps", "answered")},
                             sort_keys=True)
            if key in seen or (ev["type"] == "dpsgd" and ev["steps"] > 100):  # PLD per step count: slow
                continue
            seen.add(key)
            templates.append({"event": ev, "delta": case["delta"]})
    return {"cases": cases, "templates": templates, "skipped": skipped,
            "counts": {"ledgers": len(ledgers), "results": len(results), "templates": len(templates)}}


# ======================================================================================= pricing
def _num(x):
    if x is None:
        return None
    x = float(x)
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else x)


def _result_numbers(r) -> dict:
    out = {"value": _num(r.value), "order": _num(r.optimal_order), "data_dependent": _num(r.data_dependent),
           "events": [{"epsilon": _num(e.epsilon), **{f"details.{k}": _num(v) for k, v in sorted(e.details.items())
                                                      if isinstance(v, (int, float))}} for e in r.events]}
    return out


def _decode(value, root):
    """A ledger's recorded array (the ledger's own encoding: inline values or base64, or a side file)."""
    import base64

    import numpy as np

    if value is None:
        return None
    if isinstance(value, list):
        return np.asarray(value)
    if "values" in value:
        return np.asarray(value["values"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    if "b64" in value:
        return np.frombuffer(base64.b64decode(value["b64"]), dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    return np.load(os.path.join(root, value["file"]), allow_pickle=False)


def price(collected: dict) -> dict:
    from privdistill.errors import PrivacyError
    from privdistill.privacy.accounting import VoteStats, both, epsilon, merge_events
    from privdistill.privacy.calibration import calibrate_noise, max_count
    from privdistill.privacy.events import event_from_dict

    back = {new: old for old, new in RENAMED.items()}

    def read(d: dict):
        try:
            return event_from_dict(d)
        except PrivacyError:
            if d["type"] not in back:
                raise
            return event_from_dict({**d, "type": back[d["type"]]})

    out: dict = {"cases": {}, "templates": []}
    for case in collected["cases"]:
        events = [read(e) for e in case["events"]]
        delta = case["delta"]
        rec: dict = {"types": [type(e).__name__ for e in events]}
        res = both(merge_events(events), delta=delta)
        rec["merged"] = {k: _result_numbers(r) for k, r in res.items()}
        rec["unmerged"] = {k: _num(epsilon(events, delta=delta, accounting=k, breakdown=False).value)
                           for k in ("paper", "strict")}
        if case.get("after"):  # the ε after each spend, as the ledger computes it
            rec["after"] = [{k: _num(r.value) for k, r in both(merge_events(events[: i + 1]), delta=delta,
                                                                breakdown=False).items()}
                            for i in range(len(events))]
        if case.get("votes"):
            stats = []
            for ev, entry in zip(events, case["votes"]):
                if entry is None:
                    stats.append(None)
                    continue
                try:
                    votes = _decode(entry["votes"], entry.get("root"))
                    answered = _decode(entry["answered"], entry.get("root")) if "answered" in entry else None
                except (OSError, ValueError, KeyError, TypeError):
                    votes = answered = None
                # Confident-GNMax needs its answered mask: without it (an older ledger) the event is left out
                usable = votes is not None and (answered is not None or "answered" not in ev.to_dict())
                stats.append(VoteStats(votes=votes, answered=answered) if usable else None)
            if any(s is not None for s in stats):
                r = epsilon(events, delta=delta, accounting="strict", stats=stats, breakdown=False)
                rec["data_dependent"] = _num(r.data_dependent)
        out["cases"][case["id"]] = rec
    for t in collected["templates"]:
        ev = read(t["event"])
        row: dict = {"event": t["event"]}
        for acc in ("paper", "strict"):
            for target in (1.0, 10.0):
                tag = f"{acc}@{target:g}"
                if ev.count_field is not None:
                    row[f"max_count.{tag}"] = max_count(ev, target_epsilon=target, delta=t["delta"], accounting=acc)
                if ev.noise_field is not None:
                    try:
                        row[f"noise.{tag}"] = calibrate_noise(ev, target_epsilon=target, delta=t["delta"],
                                                              accounting=acc)
                    except PrivacyError as err:
                        row[f"noise.{tag}"] = f"refused: {str(err)[:60]}"
        out["templates"].append(row)
    return out


# ===================================================================================== comparison
def _flatten(x, prefix=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, x


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a == b or abs(a - b) <= REL * max(abs(a), abs(b))
    return a == b


def compare(collected: dict, old: dict, new: dict) -> int:
    numbers = exact = 0
    diffs = []
    for section in ("cases", "templates"):
        a, b = dict(_flatten(old[section])), dict(_flatten(new[section]))
        for key in sorted(set(a) | set(b)):
            if key.endswith(("types", ".event")) or ".types[" in key or ".event." in key:
                continue  # the class names differ by design
            numbers += 1
            if key not in a or key not in b or not _same(a[key], b[key]):
                diffs.append(f"{section}:{key}: old {a.get(key)!r} new {b.get(key)!r}")
            elif a[key] == b[key]:
                exact += 1
    c = collected["counts"]
    print(f"replayed {len(collected['cases'])} event lists ({c['ledgers']} ledgers, {c['results']} result files, "
          f"{len(collected['cases']) - c['ledgers'] - c['results']} fixed) and {c['templates']} calibration "
          f"templates: {numbers} numbers, {exact} bit-identical, {numbers - len(diffs)} within {REL:g} relative, "
          f"{len(diffs)} different")
    for d in diffs[:40]:
        print("  DIFF", d)
    if collected["skipped"]:
        print(f"{len(collected['skipped'])} result files not rebuilt (their runs recorded too little):")
        for s in collected["skipped"]:
            print("  -", s)
    # for information: the new code against what the runs recorded (rounded; the code may have changed since)
    agree = disagree = 0
    notes = []
    for case in collected["cases"]:
        got = new["cases"][case["id"]]
        checks = []
        if case.get("recorded"):
            checks += [(k, v, got["merged"][k]["value"], 1e-3) for k, v in case["recorded"].items() if v is not None]
        for i, after in enumerate(case.get("after") or []):
            checks += [(f"after[{i}].{k}", v, got["after"][i][k], 1e-9) for k, v in (after or {}).items()]
        for name, want, have, tol in checks:
            want_f, have_f = float(want), float(have)
            if want_f == have_f or abs(want_f - have_f) <= tol * max(1.0, abs(want_f)):
                agree += 1
            else:
                disagree += 1
                notes.append(f"{case['id']} {name}: recorded {want} now {have}")
    print(f"against the recorded ε (result files: to their printed precision; ledgers' epsilon_after: 1e-9): "
          f"{agree} agree, {disagree} differ")
    for n in notes[:25]:
        print("  recorded≠now", n)
    return 1 if diffs else 0


# ========================================================================================== main
def _run_priced(src: Path, cases_file: Path, out_file: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(src))
    subprocess.run([sys.executable, __file__, "--price", str(cases_file), str(out_file)], env=env, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default="HEAD", help="git revision whose accountants are the reference")
    ap.add_argument("--ledgers", nargs="*", default=[str(ROOT / "runs")], help="directories searched for ledgers")
    ap.add_argument("--keep", help="write the collected cases and both versions' numbers here")
    ap.add_argument("--price", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.price:
        started = time.perf_counter()
        collected = json.loads(Path(args.price[0]).read_text())
        Path(args.price[1]).write_text(json.dumps(price(collected)))
        print(f"priced with {os.environ.get('PYTHONPATH')} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="replay-events-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        collected = collect(args.ledgers)
        (work / "cases.json").write_text(json.dumps(collected))
        old_src = Path(tmp) / "reference"
        old_src.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.against, "src"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_src)], input=archive, check=True)
        _run_priced(old_src / "src", work / "cases.json", work / "old.json")
        _run_priced(ROOT / "src", work / "cases.json", work / "new.json")
        old, new = (json.loads((work / f).read_text()) for f in ("old.json", "new.json"))
        print(f"reference: {args.against}; new: {ROOT / 'src'}")
        return compare(collected, old, new)


if __name__ == "__main__":
    sys.exit(main())
