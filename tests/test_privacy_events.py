"""Privacy events named after their mechanisms: each prices itself, old ledgers still read, accountants compose.

The numbers themselves are pinned by test_privacy_accounting.py (golden values), test_method_behaviour.py (every
method's ledger and ε) and experiments/replay_event_pricing.py (every recorded ledger and result, old code against
new); this file checks the structure that keeps them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from privdistill.privacy import accounting as acc
from privdistill.privacy import events as ev_mod
from privdistill.privacy.events import (
    ConfidentGaussianQueries,
    GaussianQueries,
    LaplaceOnSyntheticCodes,
    LaplaceQueries,
    NormalisedGaussian,
    PrivacyEvent,
    RandomizedResponse,
    RandomizedResponseWithPrior,
    SubsampledGaussian,
    event_from_dict,
)
from privdistill.privacy.ledger import PrivacyLedger
from privdistill.privacy.pricing import DP_REPLACE_ONE, ORDERS, PerLabel, StrictPrice

DELTA = 1e-5

#: one event of every type, with the JSON type name it was written under before
EVERY_EVENT = [
    ("lnmax", LaplaceQueries(scale=40.0, count=300)),
    ("gnmax", GaussianQueries(sigma=40.0, count=200)),
    ("confident-gnmax", ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=400, answered=120)),
    ("confident-gnmax", ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=700, answered=200,
                                                 filter_budget=400)),
    ("rr", RandomizedResponse(epsilon=2.0, count=500, num_classes=10)),
    ("srr", RandomizedResponseWithPrior(epsilon=1.0, count=6000, num_classes=10)),
    ("srr", RandomizedResponseWithPrior(epsilon=1.0, count=6000, num_classes=10, setting="label-dp")),
    ("dpdfd", NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=256, steps=20, num_classes=10)),
    ("dpdfd", NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=64, steps=5, num_teachers=10, algorithm=2,
                                 granularity="batch_sum")),
    ("dpdfd", NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=256, steps=10, algorithm=3,
                                 dataset_size=60000)),
    ("dpsgd", SubsampledGaussian(noise_multiplier=1.1, sample_rate=0.01, steps=200, delta=4e-6)),
    ("latent-laplace", LaplaceOnSyntheticCodes(epsilon1=0.01, dim=32)),
]


def _old_dict(old_type: str, event: PrivacyEvent) -> dict:
    return {**event.to_dict(), "type": old_type}


@pytest.mark.parametrize("old_type,event", EVERY_EVENT, ids=[f"{t}-{i}" for i, (t, _) in enumerate(EVERY_EVENT)])
def test_old_type_names_read_into_the_new_classes_and_new_names_are_written(old_type, event):
    assert event_from_dict(_old_dict(old_type, event)) == event
    written = event.to_dict()["type"]
    assert written == type(event).type_name and written != old_type and old_type in type(event).legacy_type_names
    assert event_from_dict(json.loads(json.dumps(event.to_dict()))) == event
    assert type(event).title.split(" (")[0] in event.describe()  # reports name the mechanism


def test_the_old_type_names_are_read_only():
    assert set(ev_mod.LEGACY_EVENT_TYPES) == {"lnmax", "gnmax", "confident-gnmax", "rr", "srr", "dpdfd", "dpsgd",
                                              "latent-laplace"}
    assert not set(ev_mod.LEGACY_EVENT_TYPES) & set(ev_mod.EVENT_TYPES)


def test_a_ledger_written_with_the_old_names_reads_resumes_and_prices_alike(tmp_path):
    """A run directory from before the rename: its ledger's events read into the new classes, priced as before, and
    a resumed run's same event matches its record (nothing is spent again); new spends are written with the new
    names."""
    events = [e for _, e in EVERY_EVENT if not isinstance(e, SubsampledGaussian)]
    led = PrivacyLedger(tmp_path)
    for i, e in enumerate(events):
        led.spend(f"k{i}", e, lambda: [1, 2, 3])
    want = led.epsilon_both()
    path = tmp_path / "ledger.jsonl"
    lines = []
    for line in path.read_text().splitlines():  # rewrite it as the old code wrote it
        rec = json.loads(line)
        if rec["kind"] == "spend":
            rec["event"]["type"] = type(event_from_dict(rec["event"])).legacy_type_names[0]
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    assert '"type": "lnmax"' in path.read_text()

    old = PrivacyLedger(tmp_path)
    assert old.events() == events
    for name, result in old.epsilon_both().items():
        assert result.value == want[name].value
    assert old.spend("k0", events[0], lambda: pytest.fail("a recorded spend must not run again")) == [1, 2, 3]
    old.spend("new", GaussianQueries(sigma=40.0, count=5), lambda: [0])
    last = json.loads(path.read_text().splitlines()[-1])
    assert last["event"]["type"] == "gaussian-queries"


def _rdp_accountant(dp_event, relation) -> np.ndarray:
    a = rdp_privacy_accountant.RdpAccountant(orders=ORDERS, neighboring_relation=relation)
    a.compose(dp_event)
    return a.rdp


@pytest.mark.parametrize("event", [e for _, e in EVERY_EVENT if not isinstance(e, SubsampledGaussian)],
                         ids=lambda e: type(e).__name__)
def test_the_strict_curve_is_dp_accountings_own_composition_of_the_event(event):
    """Where dp-accounting's RDP accountant can price an event, the strict RDP curve is what that accountant gives
    for the event's DpEvent (the accountant only caches each elementary mechanism's curve)."""
    price = event.strict_price(DELTA)
    rel = (dp_accounting.NeighboringRelation.REPLACE_ONE if price.units == DP_REPLACE_ONE
           else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    direct = _rdp_accountant(event.to_dp_event(), rel)
    assert price.dp_event == event.to_dp_event()
    assert np.allclose(price.rdp, direct, rtol=1e-12, atol=0) or (np.isinf(direct).all() and price.infinite)


def test_the_poisson_subsampled_gaussian_is_dp_accountings_pld_at_its_own_delta():
    from dp_accounting.pld import pld_privacy_accountant

    ev = SubsampledGaussian(noise_multiplier=1.1, sample_rate=0.01, steps=200, delta=4e-6)
    pld = pld_privacy_accountant.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    pld.compose(ev.to_dp_event())
    assert ev.strict_price(DELTA).fixed == (pytest.approx(pld.get_epsilon(4e-6), rel=1e-12), 4e-6)
    assert isinstance(ev.to_dp_event().event, dp_accounting.PoissonSampledDpEvent)


def test_what_each_mechanism_maps_to():
    laplace = LaplaceQueries(scale=40.0, count=3).to_dp_event()
    assert laplace == dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(20.0), 3)
    gauss = GaussianQueries(sigma=40.0, count=3).to_dp_event()
    assert gauss == dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(40.0 / math.sqrt(2)), 3)
    rr = RandomizedResponse(epsilon=1.0, count=4, num_classes=10).to_dp_event()
    assert rr.event.num_buckets == 10 and rr.count == 4
    srr = RandomizedResponseWithPrior(epsilon=1.0, count=4, num_classes=10)
    assert srr.to_dp_event().event.num_buckets == 2  # any ε-DP release, priced as binary RR
    label_dp = RandomizedResponseWithPrior(epsilon=1.0, count=4, num_classes=10, setting="label-dp")
    assert isinstance(label_dp.to_dp_event(), dp_accounting.RandomizedResponseDpEvent)  # once: parallel composition
    assert label_dp.relation == acc.CHANGE_LABEL and srr.relation == acc.REPLACE_ONE
    alg3 = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=256, steps=10, algorithm=3, dataset_size=60000)
    assert isinstance(alg3.to_dp_event(), dp_accounting.NonPrivateDpEvent)
    assert isinstance(LaplaceOnSyntheticCodes(epsilon1=0.01).to_dp_event(), dp_accounting.NoOpDpEvent)


def test_the_accountants_compose_an_event_type_they_have_never_seen():
    """A new mechanism needs no change to the accountants: it says what it costs, they compose it."""

    @dataclass(frozen=True)
    class OneBitRandomizedResponse(PrivacyEvent):
        epsilon: float
        count: int
        type_name: ClassVar[str] = "one-bit-rr-test"
        count_field: ClassVar[str | None] = "count"

        def describe(self) -> str:
            return f"one bit, {self.count} times"

        def to_dp_event(self):
            p = 2 / (math.exp(self.epsilon) + 1)
            return dp_accounting.SelfComposedDpEvent(dp_accounting.RandomizedResponseDpEvent(p, 2), self.count)

        def strict_price(self, delta, details=True):
            return StrictPrice(self.to_dp_event(), units=DP_REPLACE_ONE, pure=self.count * self.epsilon)

        def paper_claims(self):
            return (PerLabel(self.epsilon),)

    new = OneBitRandomizedResponse(epsilon=1.0, count=6000)
    same = RandomizedResponseWithPrior(epsilon=1.0, count=6000, num_classes=10)
    lnmax = LaplaceQueries(scale=40.0, count=100)
    for name in ("paper", "strict"):
        assert acc.epsilon([new, lnmax], delta=DELTA, accounting=name).value == \
            acc.epsilon([same, lnmax], delta=DELTA, accounting=name).value
