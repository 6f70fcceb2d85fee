"""Do the recorded bench cells' configurations still plan the spend they recorded? (Nothing is trained.)

For every cell of a matrix whose result file exists, run the cell's command up to its privacy plan (the
method's `plan` step: queries, steps, σ, per-label ε, from the budget), price the planned events under both
accountings and compare them with the ε the recorded run printed. A refactoring of the methods that keeps
every cell's plan keeps its ledger and ε. DP-SGD is skipped (Opacus calibrates σ while it trains), and so
are cells whose recorded run stopped before spending its plan. Confident-GNMax plans every query as answered:
its strict ε must match, its paper ε (answered queries only, once run) may only be below the plan's.

    python scripts/check_cell_plans.py [--preset quick | experiments/research-matrix.yaml] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile

from typer.testing import CliRunner


class _Planned(Exception):
    def __init__(self, plan):
        self.plan = plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick", help="a packaged matrix (quick, paper) or a matrix YAML path, "
                        "e.g. experiments/research-matrix.yaml")
    parser.add_argument("--only", default="")
    args = parser.parse_args()

    from privdistill.bench.matrix import load_matrix
    from privdistill.cli import get_app
    from privdistill.methods import runner
    from privdistill.privacy import both
    from privdistill.privacy.accounting import merge_events

    planned = {}

    def stop_after_plan(self, ctx, plan, ledger):  # replaces Method.train: nothing trains
        planned["plan"], planned["delta"] = plan, ctx.budget.delta
        raise _Planned(plan)

    runner.Method.train = stop_after_plan
    for cls in _method_classes():
        cls.train = stop_after_plan
    matrix = load_matrix(args.preset)
    rows, failures = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for cell in matrix.cells:
            if args.only not in cell.name or not cell.result.is_file() or cell.args[0] in ("dpsgd", "train"):
                continue
            recorded = json.loads(cell.result.read_text())
            if recorded.get("stopped"):
                continue
            planned.clear()
            result = CliRunner().invoke(get_app(), cell.args[:1] + ["--run-dir", f"{tmp}/{cell.name}",
                                                                    "--no-progress"] + cell.args[1:])
            if "plan" not in planned:
                rows.append((cell.name, "no plan", str(result.exception or result.output[-200:])))
                failures += 1
                continue
            eps = both(merge_events(planned["plan"].remaining), delta=planned["delta"], breakdown=False)
            now = {k: r.value for k, r in eps.items()}
            same = all(_close(now[k], recorded.get(f"epsilon_{k}")) for k in ("paper", "strict"))
            if recorded.get("answered") is not None and recorded["answered"] < recorded.get("queries", 0):
                # Confident-GNMax: the plan prices every query as answered (the count is the mechanism's own
                # choice); the paper accounting of the finished run counts the answered ones only
                same = _close(now["strict"], recorded["epsilon_strict"]) and now["paper"] >= recorded["epsilon_paper"]
            failures += not same
            rows.append((cell.name, "same" if same else "DIFFERS",
                         f"paper {_fmt(now['paper'])} / {recorded.get('epsilon_paper')}, "
                         f"strict {_fmt(now['strict'])} / {recorded.get('epsilon_strict')}"))
    for name, verdict, detail in rows:
        print(f"{verdict:8} {name:55} {detail}")
    print(f"{len(rows)} cells checked, {failures} differ or failed to plan")
    return 1 if failures else 0


def _method_classes():
    from privdistill.methods.dgd import DGDMethod
    from privdistill.methods.dpdfd import DPDFDMethod
    from privdistill.methods.pate import PATEMethod
    from privdistill.methods.srr import SRRMethod

    return DGDMethod, DPDFDMethod, PATEMethod, SRRMethod


def _close(now: float, recorded) -> bool:
    """Equal up to the rounding the recorded summary used (3 to 6 decimals, "inf" for no guarantee)."""
    if recorded in (None, "inf") or (isinstance(recorded, float) and math.isinf(recorded)):
        return math.isinf(now) if recorded is not None else False
    return abs(now - float(recorded)) <= 5e-4 * max(1.0, abs(float(recorded)))


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.6g}"


if __name__ == "__main__":
    sys.exit(main())
