"""Whether two runs of the same command gave the same result: their summaries (wall times and paths aside) and
privacy ledgers, field by field. Used to check that a refactoring left behaviour unchanged: run one command with
reproducible noise (`--seed N`) on the code before and after, each into its own run directory, then

    python experiments/compare_runs.py BEFORE_RUN_DIR AFTER_RUN_DIR [...more pairs]

Prints accuracy and ε (strict / paper) of each pair, the summary keys that differ and whether the ledgers match.
Evaluation only: no ε spent, nothing trained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from privdistill.engine.run import _diff as differing_keys  # the check a resumed run's config gets

# fields that record when, where and how long, not what: they differ between any two runs
VOLATILE = ("wall", "second", "time", "elapsed", "started", "finished", "command", "git_commit", "run_dir")


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if not any(word in k for word in VOLATILE)}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _ledger(run: Path) -> list | None:
    path = run / "ledger.jsonl"
    if not path.exists():  # DP-SGD keeps its accountant's state in privacy.json instead
        return None
    return [_stable(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def compare(before: Path, after: Path) -> bool:
    a, b = (json.loads((run / "summary.json").read_text()) for run in (before, after))
    differ = differing_keys(_stable(a), _stable(b))  # dotted keys; a list (history) differs as a whole
    ledgers = _ledger(before), _ledger(after)
    same_ledger = ledgers[0] == ledgers[1]
    print(f"{before} vs {after}: accuracy {a['test_accuracy']} / {b['test_accuracy']}; strict ε "
          f"{a.get('epsilon_strict')} / {b.get('epsilon_strict')}; paper ε {a.get('epsilon_paper')} / "
          f"{b.get('epsilon_paper')}; {len(differ)} summary field(s) differ; ledgers "
          f"{'absent' if ledgers[0] is None else 'equal' if same_ledger else 'DIFFER'}")
    for line in differ[:20]:
        print("   ", line)
    return not differ and same_ledger


if __name__ == "__main__":
    runs = [Path(p) for p in sys.argv[1:]]
    if not runs or len(runs) % 2:
        sys.exit(__doc__)
    same = [compare(runs[i], runs[i + 1]) for i in range(0, len(runs), 2)]
    sys.exit(0 if all(same) else 1)
