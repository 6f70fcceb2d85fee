"""Every method at ε = 1 and 10 on a small dataset of one's own, as a new user runs them (default recipes, quick
preset, the CLI): the accuracy, both ε and what they cover, the wall time, or the refusal before training.
Prints a markdown table and writes the rows as JSON (docs/results.md, "Data of your own").

    python experiments/small_digits.py /tmp/own/small.npz
    python experiments/own_data.py 'npz:/tmp/own/small.npz?range=0,16' docs/diagnostics/own-data-small-digits.json
    python experiments/own_data.py SPEC OUT.json dgd        # re-run only these methods' rows, keep the others
    python experiments/own_data.py SPEC OUT.json srr:default  # only this method's recipe
    python experiments/own_data.py --doc docs/results.md      # rewrite its "Data of your own" tables from the JSON

A row's optional "wall_note" (e.g. which stages came from the cache) is printed beside its wall time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from privdistill.bench.report import update_block  # the bench report's own marker rewrite

ROOT = Path(__file__).resolve().parents[1]
CELLS = [("dpsgd", []), ("srr", ["--recipe", "label-dp"]), ("srr", []), ("pate", []), ("dgd", []), ("dpdfd", [])]


def recipe_of(extra: list[str]) -> str:
    return extra[-1] if extra else "default"


def run_cell(spec: str, method: str, extra: list[str], epsilon: float, root: Path) -> dict:
    run_dir = root / f"{method}{'-' + extra[-1] if extra else ''}-eps{epsilon:g}"
    cmd = ["privdistill", method, "-d", spec, "-e", f"{epsilon:g}", *extra, "--run-dir", str(run_dir)]
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "privdistill", *cmd[1:]], capture_output=True, text=True)
    wall = time.perf_counter() - started
    row = {"method": method, "recipe": recipe_of(extra), "epsilon": epsilon, "wall_s": round(wall),
           "command": " ".join(cmd[:-2])}
    summary = run_dir / "summary.json"
    if proc.returncode == 0 and summary.is_file():
        s = json.loads(summary.read_text())
        row.update(accuracy=s.get("test_accuracy"), epsilon_strict=s.get("epsilon_strict"),
                   epsilon_paper=s.get("epsilon_paper"), not_covered=s.get("not_covered"),
                   at_chance=s.get("at_chance"), majority=(s.get("chance_check") or {}).get("majority_share"))
    else:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        row["refused"] = next((ln for ln in lines if ln.startswith("error")), lines[-1] if lines else "?")
    return row


def table(rows: list[dict]) -> str:
    """The rows as docs/results.md shows them: accuracy beside the largest class's share, both ε, the coverage."""
    lines = ["| method | recipe | ε | accuracy (largest class) | strict ε / paper ε | covers the whole model | wall | "
             "or refused before training |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        wall = f"{r['wall_s']} s" + (f" ({r['wall_note']})" if r.get("wall_note") else "")
        if "refused" in r:
            lines.append(f"| {r['method']} | {r['recipe']} | {r['epsilon']:g} | - | - | - | {wall} | "
                         f"{r['refused'].removeprefix('error: ')} |")
            continue
        largest = f" ({100 * r['majority']:.1f} %)" if r.get("majority") is not None else ""
        chance = " (at chance)" if r.get("at_chance") else ""
        lines.append(f"| {r['method']} | {r['recipe']} | {r['epsilon']:g} | {100 * r['accuracy']:.1f} %{largest}"
                     f"{chance} | {r['epsilon_strict']:.3g} / {r['epsilon_paper']:.3g} | "
                     f"{'no' if r['not_covered'] else 'yes'} | {wall} | |")
    return "\n".join(lines)


def write_doc(doc: Path) -> None:
    """Each `<!-- own-data-NAME:start -->` block of the document from docs/diagnostics/own-data-NAME.json."""
    text = doc.read_text()
    for rows_file in sorted((ROOT / "docs" / "diagnostics").glob("own-data-*.json")):
        if f"<!-- {rows_file.stem}:start -->" in text:  # only the blocks the document holds (never appended)
            text = update_block(text, rows_file.stem, table(json.loads(rows_file.read_text())))
    doc.write_text(text)


def main(spec: str, out: str, only: list[str]) -> None:
    root = Path(tempfile.mkdtemp(prefix="own-data-"))
    kept = json.loads(Path(out).read_text()) if only and Path(out).is_file() else []
    kept = {(r["method"], r["recipe"], r["epsilon"]): r for r in kept}

    def chosen(method: str, extra: list[str]) -> bool:
        return not only or method in only or f"{method}:{recipe_of(extra)}" in only

    rows = [run_cell(spec, m, extra, e, root) if chosen(m, extra)
            else kept[(m, recipe_of(extra), e)] for m, extra in CELLS for e in (1.0, 10.0)]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    if sys.argv[1] == "--doc":
        write_doc(Path(sys.argv[2]))
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3:])
