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

_NAMES = {
    "mechanisms": "make_generator noise_source lnmax gnmax confident_gnmax randomized_response "
                  "selective_randomized_response normalize_and_noise normalize_and_noise_multi "
                  "laplace_latent_perturbation",
    "secure": "SecureNoise",
    "events": "PrivacyEvent LaplaceQueries GaussianQueries ConfidentGaussianQueries RandomizedResponse "
              "RandomizedResponseWithPrior NormalisedGaussian SubsampledGaussian LaplaceOnSyntheticCodes "
              "event_from_dict",
    "accounting": "epsilon both get_accountant register_accountant available_accountants Accountant EpsilonResult "
                  "VoteStats merge_events",
    "calibration": "max_count calibrate_noise",
    "ledger": "PrivacyLedger LedgerAnswer",
    "report": "Pathway privacy_report render_text run_report write_privacy_json",
}
_EXPORTS = {name: module for module, names in _NAMES.items() for name in names.split()}

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
