"""Re-price recorded PATE summaries from their runs' privacy ledgers with the current accountant.

Used once, on 2026-11-22, when the strict accounting of Confident-GNMax changed from "answered queries only"
(an odometer reading) to "every query priced as answered" (a bound fixed in advance; docs/privacy.md). The
runs' released students and ledgers are unchanged, so re-training them would only reproduce the same students;
the ε figures are a function of the recorded events alone. Each rewritten summary keeps the figures it had under
`reaccounted.before`.

    python experiments/reaccount_pate.py results/quick/pate-*-confident-gnmax.json
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from privdistill.atomic import atomic_write_json
from privdistill.methods.pate import realised_answered_only
from privdistill.privacy.accounting import both as epsilon_both_accountings
from privdistill.privacy.accounting import merge_events
from privdistill.privacy.ledger import read_ledger_events

REASON = ("strict Confident-GNMax accounting prices every query as answered (the answered count is chosen "
          "adaptively; answered-only is an odometer reading, now epsilon_realised_answered_only)")


def reaccount(summary_path: Path) -> tuple[dict, dict]:
    summary = json.loads(summary_path.read_text())
    if summary.get("method") != "pate":
        raise SystemExit(f"{summary_path}: not a PATE summary")
    # read-only: opening a PrivacyLedger would create a missing ledger and may append config records
    events, _header = read_ledger_events(Path(summary["run_dir"]) / "ledger.jsonl")  # RunError if missing
    both = epsilon_both_accountings(merge_events(events), delta=summary["delta"])
    after = {"epsilon_paper": round(both["paper"].value, 4), "epsilon_strict": round(both["strict"].value, 4),
             "epsilon_realised_answered_only": realised_answered_only(both["strict"])}
    before = {k: summary.get(k) for k in after}
    return before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summaries", nargs="+", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    args = parser.parse_args()
    for path in args.summaries:
        before, after = reaccount(path)
        print(f"{path}: {before} -> {after}")
        if before == after or args.dry_run:
            continue
        summary = json.loads(path.read_text())
        summary.update(after)
        summary["reaccounted"] = {"date": datetime.date.today().isoformat(), "reason": REASON, "before": before}
        atomic_write_json(path, summary)


if __name__ == "__main__":
    main()
