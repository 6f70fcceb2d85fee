"""Privacy: noise mechanisms, events, the paper and strict accountants, calibration, the ledger, reports.

    mechanisms   lnmax, gnmax, confident_gnmax, randomized response, normalize_and_noise, ..., noise_source (torch)
    secure       SecureNoise: secure samplers for a release (discrete noise, OS entropy, nothing persisted)
    events       the immutable, JSON round-trippable events, each pricing itself (privacy/events.py)
    pricing      the arithmetic the events price themselves with
    accounting   epsilon(events, delta=..., accounting="paper"|"strict"), get_accountant, both
    pate         PATE 2017/2018 data-dependent RDP bounds
    calibration  max_count, calibrate_noise
    ledger       PrivacyLedger (append-only ledger.jsonl; budget enforcement; crash-safe resume)
    report       Pathway, privacy_report, render_text, run_report

Neighbouring relation: replace-one throughout (label-DP only for SRR's label-sensitive setting). Derivations:
docs/privacy.md. Names are exported lazily, so importing the accountants does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # mechanisms (torch)
    "make_generator": "mechanisms", "noise_source": "mechanisms", "SecureNoise": "secure",
    "lnmax": "mechanisms", "gnmax": "mechanisms",
    "confident_gnmax": "mechanisms", "randomized_response": "mechanisms",
    "selective_randomized_response": "mechanisms", "normalize_and_noise": "mechanisms",
    "normalize_and_noise_multi": "mechanisms", "laplace_latent_perturbation": "mechanisms",
    # events
    "PrivacyEvent": "events", "LaplaceQueries": "events", "GaussianQueries": "events",
    "ConfidentGaussianQueries": "events", "RandomizedResponse": "events", "RandomizedResponseWithPrior": "events",
    "NormalisedGaussian": "events", "SubsampledGaussian": "events", "LaplaceOnSyntheticCodes": "events",
    "event_from_dict": "events",
    # accounting
    "epsilon": "accounting", "both": "accounting", "get_accountant": "accounting",
    "register_accountant": "accounting", "available_accountants": "accounting",
    "Accountant": "accounting", "EpsilonResult": "accounting", "VoteStats": "accounting",
    "merge_events": "accounting",
    # calibration
    "max_count": "calibration", "calibrate_noise": "calibration",
    # ledger
    "PrivacyLedger": "ledger", "LedgerAnswer": "ledger",
    # report
    "Pathway": "report", "privacy_report": "report", "render_text": "report", "run_report": "report",
    "write_privacy_json": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'privdistill.privacy' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"privdistill.privacy.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
