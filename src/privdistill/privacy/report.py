"""Privacy reports: epsilon under both accountings, mechanism by mechanism, and for each released
artifact the pathways from the private data that the epsilon covers and those it does not.

A method describes its artifacts with :class:`Pathway` lists and writes them to ``RUN_DIR/privacy.json`` with
:func:`write_privacy_json`; each method's pathways live with the method (methods/dgd.py: dgd_pathways,
methods/dpdfd_plan.py: dpdfd_pathways, methods/srr_plan.py: srr_pathways, methods/pate.py: pate_pathways,
methods/dpsgd.py: dpsgd_pathways);
``privdistill privacy report RUN_DIR`` combines them with ``RUN_DIR/ledger.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from privdistill.atomic import atomic_write_bytes
from privdistill.errors import RunError
from privdistill.privacy._checks import check_delta
from privdistill.privacy.accounting import both, json_num, merge_events
from privdistill.privacy.events import PrivacyEvent, as_events
from privdistill.privacy.ledger import LEDGER_NAME, read_ledger_events

PRIVACY_JSON = "privacy.json"


@dataclass(frozen=True)
class Pathway:
    """One way information flows from the private data to a released artifact."""

    source: str
    via: str
    to: str
    covered: bool
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Pathway":
        try:
            return cls(source=str(data["source"]), via=str(data["via"]), to=str(data["to"]),
                       covered=bool(data["covered"]), note=str(data.get("note", "")))
        except KeyError as err:
            raise RunError(f"pathway {dict(data)!r} lacks the field {err}") from None


PRIVATE = "private training data"


def _finite_strict(summary: Mapping[str, Any]) -> bool:
    """Whether the summary states a finite strict ε (JSON writes infinity as "inf")."""
    strict = summary.get("epsilon_strict")
    return strict not in (None, "inf") and not (isinstance(strict, float) and math.isinf(strict))


def is_label_dp(summary: Mapping[str, Any]) -> bool:
    """Whether a run's ε is label-DP (it protects the labels only): its neighbouring relation says so."""
    return _finite_strict(summary) and "label" in str(summary.get("relation") or "")


def guarantee(summary: Mapping[str, Any]) -> tuple[bool, str]:
    """(whether the released model is DP as a whole, one sentence in words saying so) from a run's summary: the
    headline the console, the report and the model card put above any ε. "As a whole" means every pathway from
    the private data to the released model is covered by the strict ε (summary `not_covered` empty)."""
    strict, paper = summary.get("epsilon_strict"), summary.get("epsilon_paper")
    delta = summary.get("delta")
    if strict is None and paper is None:
        return False, "No differential-privacy guarantee: no privacy mechanism was used."
    not_covered = list(summary.get("not_covered") or [])
    relation = str(summary.get("relation") or "replace-one")
    if is_label_dp(summary):  # a label-DP release covers the labels by design, never the images
        return False, (f"label-DP only, not DP as a whole: ({fmt_num(strict)}, {fmt_num(delta)})-label-DP (strict "
                       "accounting) protects the labels of the private training set; its images are used "
                       "without noise.")
    if not_covered or not _finite_strict(summary):
        missing = "; ".join(not_covered) or "the strict accounting gives no finite epsilon"
        paper_note = (f" (the paper's own accounting says epsilon = {fmt_num(paper)}, which is not a guarantee)"
                      if paper is not None and paper != strict else "")
        return False, (f"NOT differentially private as a whole: the strict epsilon = {fmt_num(strict)}{paper_note} "
                       f"does not cover: {missing}.")
    return True, (f"({fmt_num(strict)}, {fmt_num(delta)})-differentially private as a whole (strict accounting, "
                  f"{relation.split(':')[0]}): every pathway from the private data to the released model is covered.")


def noise_source(secure: bool, option: str, *, draws: int = 0, rho: float = 0.0, tail: float = 0.0,
                 epsilon: float | None = None, delta: float | None = None) -> dict[str, Any]:
    """Where a run's privacy noise came from, and what that means for its ε and δ (``option``: the config key that
    chose it). A seeded generator makes runs reproducible, but anyone who knows the seed (it is saved in the run's
    config.yaml) can redraw the noise and subtract it. Secure draws follow the exact laws the accountants price up
    to a factor e^rho on the bulk and a mass `tail` outside it (sums over the run's draws, privacy/secure.py): the
    run is (ε + 2 rho, e^rho δ + (1 + e^(ε + 2 rho)) tail)-DP where the exact mechanism is (ε, δ)-DP."""
    if secure:
        eps_added = 2 * rho
        delta_added = None
        if epsilon is not None:
            delta_added = math.expm1(rho) * (delta or 0.0) + (1 + math.exp(min(epsilon + eps_added, 700.0))) * tail
        sampling = (f"; its {draws:,} draws follow the exact laws to within a factor e^{rho:.1e}, which adds "
                    f"{eps_added:.1e} to ε and {delta_added:.1e} to δ" if draws and delta_added is not None else "")
        return {"secure": True, "draws": int(draws), "rho": rho, "tail": tail, "epsilon_added": eps_added,
                "delta_added": delta_added,
                "statement": "privacy noise from ChaCha20 keyed by OS entropy on every draw (discrete noise on the "
                             "integers or on a grid fixed by the noise scale: no floating-point attack; not "
                             "reproducible): nothing in the run directory regenerates it" + sampling}
    return {"secure": False, "statement": "reproducible privacy noise, drawn from generators seeded with the run's "
                                          "seed (saved in config.yaml): the ε holds only while that seed stays "
                                          f"secret; for a release, run without --seed ({option} = secure)"}


def write_privacy_json(run_dir: str | os.PathLike, artifacts: Mapping[str, Sequence[Pathway]], *,
                       method: str | None = None, noise: Mapping[str, Any] | None = None,
                       extra: Mapping[str, Any] | None = None) -> Path:
    """Write ``RUN_DIR/privacy.json`` (artifacts and their pathways, where the noise came from) atomically."""
    doc = {"method": method, "artifacts": {k: [p.to_dict() for p in v] for k, v in artifacts.items()}}
    if noise is not None:
        doc["noise"] = dict(noise)
    if extra:
        doc.update(extra)
    path = Path(run_dir) / PRIVACY_JSON
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
    return path


# ----------------------------------------------------------------------------------------- reports
def privacy_report(events: Sequence[PrivacyEvent] | PrivacyEvent, *, delta: float,
                   artifacts: Mapping[str, Sequence[Pathway]] | None = None, method: str | None = None,
                   title: str | None = None) -> dict[str, Any]:
    """A JSON-able report: epsilon at ``delta`` under both accountings (total and per mechanism, events
    of one setting merged), and for each artifact its pathways, covered or not."""
    delta = check_delta(delta)
    events = merge_events(as_events(events))
    results = both(events, delta=delta)
    paper, strict = results["paper"], results["strict"]
    mechanisms = []
    for ev, pe, se in zip(events, paper.events, strict.events):
        mechanisms.append({"type": ev.type_name, "description": ev.describe(), "event": ev.to_dict(),
                           "epsilon_paper": json_num(pe.epsilon), "epsilon_strict": json_num(se.epsilon),
                           "paper_notes": list(pe.notes), "strict_notes": list(se.notes),
                           "details": {k: json_num(v) for k, v in {**pe.details, **se.details}.items()}})
    arts = _artifacts(artifacts, paper=paper.value, strict=strict.value, delta=delta)
    notes = list(dict.fromkeys([*strict.notes, *paper.notes]))  # each note once, strict's first
    if not artifacts:
        notes.append("no artifact pathways were given (no privacy.json): the epsilon covers the recorded "
                     "mechanisms only; what else reaches the released models is not stated")
    return {
        "title": title or (f"Privacy report: {method}" if method else "Privacy report"),
        "method": method,
        "relation": strict.relation,
        "delta": delta,
        "epsilon": {"paper": json_num(paper.value), "strict": json_num(strict.value)},
        "accountings": {"paper": paper.to_dict(), "strict": strict.to_dict()},
        "mechanisms": mechanisms,
        "artifacts": arts,
        "notes": notes,
    }


def _artifacts(artifacts: Mapping[str, Sequence[Pathway]] | None, *, paper: float, strict: float,
               delta: float) -> dict[str, Any]:
    """For each released artifact: its pathways and one statement of what the ε covers."""
    arts: dict[str, Any] = {}
    for name, pathways in (artifacts or {}).items():
        pws = [p if isinstance(p, Pathway) else Pathway.from_dict(p) for p in pathways]
        covered = [p for p in pws if p.covered]
        missing = [p for p in pws if not p.covered]
        if not pws:
            statement = "no pathways declared"
        elif not missing:
            statement = (f"every listed pathway is covered: ({fmt_num(strict)}, {delta:g})-DP under strict "
                         f"accounting, ({fmt_num(paper)}, {delta:g}) as the papers count")
        else:
            statement = (f"NOT differentially private as a whole: epsilon covers {len(covered)} of {len(pws)} "
                         f"pathways; not covered: " + "; ".join(p.via for p in missing))
        arts[name] = {"pathways": [p.to_dict() for p in pws], "fully_covered": bool(pws) and not missing,
                      "statement": statement}
    return arts


def fmt_num(x: Any) -> str:
    """An ε, δ, count or noise scale for reading: "-" for none, "inf", thousands separated, else 4 digits."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    x = float(x)
    if math.isinf(x):
        return "inf"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def pathway_line(p: Mapping[str, Any]) -> str:
    """One pathway (its dict) as the plain-text reports list it: ``[covered    ] source -> via -> to  (note)``."""
    mark = "covered    " if p["covered"] else "NOT covered"
    return f"[{mark}] {p['source']} -> {p['via']} -> {p['to']}" + (f"  ({p['note']})" if p.get("note") else "")


def render_text(report: Mapping[str, Any]) -> str:
    """The report as readable plain text."""
    # a model at chance (methods/chance.py) is said so before its privacy
    lines = [f"WARNING: {report['release_warning']}"] if report.get("release_warning") else []
    lines += [report.get("title") or "Privacy report", "", f"neighbouring relation: {report['relation']}",
              f"delta: {report['delta']:g}"]
    if report.get("noise"):
        lines.append(f"noise: {report['noise']['statement']}")
    lines += [f"epsilon (paper accounting):  {fmt_num(report['epsilon']['paper'])}   - the formulas the papers print",
              f"epsilon (strict accounting): {fmt_num(report['epsilon']['strict'])}   - a correct bound on every "
              "recorded use of the private data (which artifacts it covers: below)", "", "Mechanisms:"]
    if not report["mechanisms"]:
        lines.append("  (none recorded)")
    for m in report["mechanisms"]:
        lines += [f"  - {m['description']}",
                  f"      paper {fmt_num(m['epsilon_paper'])} | strict {fmt_num(m['epsilon_strict'])}"]
        lines += [f"      strict: {n}" for n in m["strict_notes"]]
        for k, v in m["details"].items():
            lines.append(f"      {k}: {fmt_num(v) if isinstance(v, (int, float, str)) else v}")
    lines += ["", "Released artifacts and what the epsilon covers:"]
    if not report["artifacts"]:
        lines.append("  (no pathways declared)")
    for name, art in report["artifacts"].items():
        lines.append(f"  {name}: {art['statement']}")
        lines += ["    " + pathway_line(p) for p in art["pathways"]]
    if report.get("notes"):
        lines += ["", "Notes:"] + [f"  - {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def has_run_report(run_dir: str | os.PathLike) -> bool:
    """Whether `run_report` can describe this run: it has a privacy ledger, or is a DP-SGD run (Opacus's
    accounting in privacy.json)."""
    run = Path(run_dir)
    return (run / LEDGER_NAME).exists() or "dpsgd_accounting" in _privacy_doc(run)


def _privacy_doc(run: Path) -> dict[str, Any]:
    """RUN_DIR/privacy.json ({} if the run wrote none)."""
    pj = run / PRIVACY_JSON
    if not pj.exists():
        return {}
    try:
        return json.loads(pj.read_text())
    except ValueError as err:
        raise RunError(f"{pj} is not valid JSON: {err}") from None


def run_report(run_dir: str | os.PathLike, *, delta: float | None = None) -> dict[str, Any]:
    """The report of a run directory: ``ledger.jsonl`` (or, for DP-SGD, Opacus's figures in privacy.json)
    and ``privacy.json`` (optional)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise RunError(f"{run} is not a directory")
    doc = _privacy_doc(run)
    if not (run / LEDGER_NAME).exists():
        if "dpsgd_accounting" in doc:
            return _dpsgd_report(run, doc)
        raise RunError(f"{run} has no {LEDGER_NAME}: this run recorded no privacy mechanism "
                       "(or it is not a run directory)")
    events, header = read_ledger_events(run)
    if delta is None:
        delta = float(header["delta"]) if header and "delta" in header else 1e-5
    artifacts = {k: [Pathway.from_dict(p) for p in v] for k, v in (doc.get("artifacts") or {}).items()} or None
    report = privacy_report(events, delta=delta, artifacts=artifacts, method=doc.get("method"),
                            title=f"Privacy report: {run}")
    if doc.get("noise"):
        report["noise"] = doc["noise"]
    if doc.get("release_warning"):
        report["release_warning"] = doc["release_warning"]
    if header:
        report["ledger"] = {"accounting_enforced": header.get("accounting"), "max_epsilon": header.get("max_epsilon"),
                            "records": len(events)}
    return report


def _dpsgd_report(run: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """DP-SGD runs are accounted by Opacus during training (no ledger): the report is rebuilt from the
    figures privacy.json recorded, in the same shape as a ledger run's report."""
    acc = doc["dpsgd_accounting"]
    needed = ["noise_multiplier", "sample_rate", "steps", "max_grad_norm", "epsilon_replace_one_pld"]
    missing = [k for k in needed if k not in acc] + ([] if "delta" in doc else ["delta"])
    if missing:
        raise RunError(f"{run / PRIVACY_JSON} lacks {missing}: not written by a finished DP-SGD run")
    # the paper column is Opacus's figure under the run's accountant (older runs: read from the headline)
    accountant = acc.get("accountant") or ("prv" if "PRV" in acc.get("headline", "") else "rdp")
    paper = acc.get(f"epsilon_opacus_{accountant}")
    strict = acc["epsilon_replace_one_pld"]
    artifacts = {k: [Pathway.from_dict(p) for p in v] for k, v in (doc.get("artifacts") or {}).items()}
    report = privacy_report([], delta=float(doc["delta"]), artifacts=artifacts, method="dpsgd",
                            title=f"Privacy report: {run}")
    report["epsilon"] = {"paper": paper, "strict": strict}
    report["artifacts"] = _artifacts(artifacts, paper=paper, strict=strict, delta=float(doc["delta"]))
    report["relation"] = "replace-one (strict); add/remove-one (Opacus, paper column)"
    report["mechanisms"] = [{
        "type": "dpsgd", "event": acc,
        "description": (f"DP-SGD: noise multiplier {acc['noise_multiplier']:g}, sampling rate {acc['sample_rate']:.4g} "
                        f"(Poisson), {acc['steps']} steps, clip norm {acc['max_grad_norm']:g}"),
        "epsilon_paper": paper, "epsilon_strict": strict, "paper_notes": [acc.get("headline", "")],
        "strict_notes": ["dp-accounting PLD accountant, replace-one relation (the relation of every other "
                         "method here)"],
        "details": {"epsilon_opacus_rdp": acc.get("epsilon_opacus_rdp"),
                    "epsilon_opacus_prv": acc.get("epsilon_opacus_prv")}}]
    report["notes"] = [n for n in report["notes"] if "no artifact pathways" not in n]
    report["accountings"] = {}
    if doc.get("noise"):
        report["noise"] = doc["noise"]
    if doc.get("release_warning"):
        report["release_warning"] = doc["release_warning"]
    return report
