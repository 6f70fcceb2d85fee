"""DGD's configuration and plan (methods/dgd.py is the algorithm): the `dgd` section, how many queries a budget
buys, the vote event they are priced as, and the pathways the privacy report lists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from privdistill.config import check
from privdistill.engine.query_selection import QUERY_SELECTIONS
from privdistill.errors import ConfigError, PrivacyError
from privdistill.methods.runner import Budget
from privdistill.privacy import calibration
from privdistill.privacy._checks import check_choice
from privdistill.privacy.events import GaussianQueries, LaplaceOnSyntheticCodes, LaplaceQueries
from privdistill.privacy.report import PRIVATE, Pathway

# the pool-wide rules (engine/query_selection.py) and the few-label student's medoids and cluster votes
# (engine/few_label.py)
DGD_QUERY_SELECTIONS = QUERY_SELECTIONS + ("medoids", "clusters")


@dataclass
class DGDConfig:
    """Config section `dgd`: the privacy mechanisms and the data split (the target ε: section `budget`)."""

    queries: int = 0  # |D̂s|; 0: the most the budget's target ε allows under its accounting
    aggregation: str = "laplace"  # laplace (DGD) | gaussian (DGD+)
    laplace_scale: float = 40.0  # b = 2/ε0
    gaussian_sigma: float = 40.0
    latent_noise: bool = True
    epsilon1: float = 0.01
    latent_clip: float = 1.0
    inputs: str = "generator"  # generator | private-holdout (Fig. 7)
    holdout: float = 1 / 6  # the held-out "public" slice for inputs=private-holdout: records, or a fraction below 1
    num_synthetic: int = 0  # 0: as many as the private training set (paper)
    secure_noise: Optional[bool] = None  # None: run.noise decides (methods/common.py)
    variant: Optional[str] = None  # the label --record adds to the result's name (ablations)
    source_labels: bool = False  # end to end only: the DP source labels the unqueried samples (post-processing)
    # which samples of the pool are queried: random (paper) | diverse (a k-center cover per class; ours,
    # engine/query_selection.py) | medoids | clusters (few labels; ours, engine/few_label.py, which says how)
    query_selection: str = "random"
    release: str = "argmax"  # argmax (paper: the noisy label) | histogram (the noisy vote histogram; ours)
    spread_pool: int = 20_000  # samples of the pool the medoids (clusters) are chosen from

    def validate(self) -> None:
        check(self.queries >= 0, "dgd.queries must be >= 0")
        check(self.aggregation in ("laplace", "gaussian"), "dgd.aggregation must be laplace or gaussian")
        check(self.inputs in ("generator", "private-holdout"), "dgd.inputs must be generator or private-holdout")
        if min(self.laplace_scale, self.gaussian_sigma, self.epsilon1, self.latent_clip, self.holdout) <= 0:
            raise ConfigError("dgd noise scales, epsilon1, latent_clip and holdout must be > 0")
        if self.holdout >= 1:
            self.holdout = int(self.holdout)  # a count of records (below 1: a fraction)
        check(self.release in ("argmax", "histogram"), f"dgd.release must be argmax or histogram, got {self.release!r}")
        check(self.query_selection in DGD_QUERY_SELECTIONS,
              f"dgd.query_selection must be one of {', '.join(DGD_QUERY_SELECTIONS)}")
        check(self.spread_pool >= 2, "dgd.spread_pool must be at least 2")
        clusters = self.query_selection == "clusters"
        check(not (clusters and (self.source_labels or self.queries)), "dgd.query_selection=clusters labels every "
              "clustered sample by its cluster's name: it takes neither dgd.source_labels nor dgd.queries (one "
              "cluster a class)")
        check(not clusters or self.release == "histogram", "dgd.query_selection=clusters names the clusters from "
              "their noisy vote histograms: set dgd.release=histogram")
        check(self.query_selection == "random" or self.inputs == "generator",
              f"dgd.query_selection={self.query_selection} reads the model the generator was fitted to; "
              "dgd.inputs=private-holdout has none (use dgd.query_selection=random)")


# the ledger keys of the two mechanism uses a run spends budget on
QUERIES_KEY, LATENT_KEY = "dgd/queries", "dgd/latent-codes"


def dgd_pathways(*, aggregation: str = "laplace", inputs: str = "generator",
                 fitted_to: str = "non-private baseline classifier", source_is_dp: bool = False,
                 latent_codes: bool = True, query_selection: str = "random",
                 release: str = "argmax") -> dict[str, list[Pathway]]:
    """DGD (and DGD+ with ``aggregation="gaussian"``). ``latent_codes``: the student reads the VAE's noisy
    codes (Eq. 1's energies), not only the samples themselves. ``query_selection``: how the queried samples are
    chosen (random, or a rule that reads what the generator was fitted to: the same pathway, named; medoids in its
    backbone features, clusters in its class probabilities).
    ``inputs``: "generator" (the method) or "held-out-private" (Fig. 7 variant: a held-out slice of the private
    set replaces the generator).
    ``fitted_to``: what the generator was fitted to (the baseline, or a DP source end to end).
    ``release``: "argmax" (the noisy label, the paper) or "histogram" (the whole noisy vote histogram, priced
    alike by the data-independent analysis).
    ``source_is_dp``: end-to-end mode, the generator fitted to a DP-SGD model whose ε is in the run's ledger:
    the generator and everything made from it are post-processing of a DP model, so these pathways are covered."""
    check_choice("aggregation", aggregation, ("laplace", "gaussian"))
    check_choice("inputs", inputs, ("generator", "held-out-private"))
    check_choice("release", release, ("argmax", "histogram"))
    agg = "Laplace noisy argmax (LNMax)" if aggregation == "laplace" else "Gaussian noisy argmax (GNMax)"
    released = f"{agg} labels" if release == "argmax" else (
        f"{aggregation.capitalize()} noisy vote histograms (whose argmax is {agg.split(' (')[1][:-1]})")
    queried = "the queried samples"
    if query_selection == "clusters":  # engine/few_label.py's cluster votes
        queried = (f"the pool's k-means clusters in {fitted_to}'s class probabilities (each teacher votes its majority "
                   "over a cluster's members); every member learns its cluster's answer")
    student = [Pathway(PRIVATE, f"n teachers on disjoint subsets -> {released} of {queried}",
                       "labels of the student's supervised set", True, "the vote channel: what epsilon prices")]
    if inputs == "generator":
        why = ("post-processing of the DP source, whose DP-SGD training is in the ledger" if source_is_dp else
               "what the generator is fitted to and the generator are trained on D without noise")
        student += [
            Pathway(PRIVATE, f"{fitted_to} -> data-free generator -> synthetic inputs",
                    "the student's inputs (queried and unlabelled)", source_is_dp, why),
            Pathway(PRIVATE, f"{fitted_to} -> generator -> which samples are queried"
                    + ("" if query_selection == "random" else f"; {query_selection} selection reads {fitted_to}")
                    + ("; its class probabilities group the samples each cluster's answer labels"
                       if query_selection == "clusters" else ""),
                    "the student's query set", source_is_dp, why if source_is_dp else ""),
        ]
        if latent_codes:
            student.insert(2, Pathway(
                PRIVATE, f"{fitted_to} -> generator -> synthetic data -> VAE -> latent codes + Laplace(2c/eps1) -> "
                "decoded triples", "the student's unsupervised regulariser", source_is_dp, why if source_is_dp else
                "the latent noise perturbs codes of synthetic samples; it does not protect private records"))
        return {"student": student, "generator": [Pathway(
            PRIVATE, f"{fitted_to} (trained on D) as fixed discriminator", "generator weights", source_is_dp,
            why if source_is_dp else "not covered: the generator is fitted to models trained without noise")]}
    student.append(Pathway("held-out slice of the private set", "used directly as unlabelled inputs and VAE training "
                           "data", "the student's inputs", False, "covered only if that slice is genuinely public"))
    return {"student": student}


def vote_event(cfg: DGDConfig, count: int) -> LaplaceQueries | GaussianQueries:
    return (LaplaceQueries(scale=cfg.laplace_scale, count=count) if cfg.aggregation == "laplace"
            else GaussianQueries(sigma=cfg.gaussian_sigma, count=count))


def plan_vote_event(cfg: DGDConfig, budget: Budget, num_classes: int, fixed: list | None = None,
                    reads_codes: bool = True) -> LaplaceQueries | GaussianQueries:
    """The vote channel's event: |D̂s| queries at the configured noise (plan_queries), or with cluster votes one query
    a cluster at the least noise whose ε fits the target."""
    if cfg.query_selection != "clusters":
        return vote_event(cfg, plan_queries(cfg, budget, fixed, reads_codes))
    event = vote_event(cfg, num_classes)
    if budget.epsilon is None:
        return event
    fixed = list(fixed or []) + ([LaplaceOnSyntheticCodes(epsilon1=cfg.epsilon1)]
                                 if cfg.latent_noise and reads_codes and budget.accounting == "paper" else [])
    try:
        return event.with_noise(calibration.calibrate_noise(event, target_epsilon=budget.epsilon, delta=budget.delta,
                                                            accounting=budget.accounting, fixed=fixed))
    except PrivacyError as err:
        raise ConfigError(f"{event.count} cluster queries do not fit ε = {budget.epsilon:g}: {err}") from err


def plan_queries(cfg: DGDConfig, budget: Budget, fixed: list | None = None, reads_codes: bool = True) -> int:
    """|D̂s|: as given, or the most queries whose ε under the budget's accounting fits its target (the paper
    accounting adds ε1 of the latent noise, where the student reads the codes, to the vote channel; the strict one
    prices the vote channel)."""
    if cfg.queries > 0:
        return cfg.queries
    if budget.epsilon is None:
        raise ConfigError("give either dgd.queries (|D̂s|) or a target budget.epsilon (--epsilon)")
    fixed = list(fixed or []) + ([LaplaceOnSyntheticCodes(epsilon1=cfg.epsilon1)]
                                 if cfg.latent_noise and reads_codes and budget.accounting == "paper" else [])
    return calibration.vote_queries(vote_event(cfg, 1), budget, cfg.aggregation, fixed=fixed)
