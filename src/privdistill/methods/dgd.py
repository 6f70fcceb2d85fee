"""DGD: discriminative-generative distillation (Ge et al., IEEE TIP 2023; paper 001).

    discriminative stream   baseline φb on all of D;  n teachers φt,i on disjoint subsets D_i
    generative stream       generator φg trained data-free against φb (DGD loss);  N synthetic samples;
                            VAE (c = 32) trained on them
    split                   |D̂s| queries  -> labels l = argmax(votes + Lap(2/ε0))          (Eq. 3)
                            the rest D̂u   -> codes, clipped + Lap(2c/ε1), decoded into triples (x̂, x̂∥, x̂⊥)
    student                 CE on (D̂s, l)  +  ‖h(x̂)−h(x̂⊥)‖² + ‖h(x̂)−h(x̂∥)‖² + Σ φs(x̂) log φs(x̂)   (Eq. 1, 5, 6)

Readings of what the paper leaves open (each configurable; in full: research log, "Notes that left the code:
methods/dgd.py"):
- "normalized latent codes" + "mapping operator M": codes clamped to [−clip, clip], Lap(2·clip·c/ε1) added, then
  clamped back before decoding.
- Perturbations follow TNAR (adversarial); the entropy term is MINIMISED, as the text says (Eq. 6's
  printed sign would maximise it); the energies are per-feature means, each term weighted 1.
- DGD+ = GNMax aggregation (σ not given by the paper; default 40, as PATE 2018 for MNIST).
Ours: `dgd.release=histogram` releases the whole noisy vote histogram, which the data-independent LNMax/GNMax
analyses already price (so every ε is unchanged; PATE's data-dependent bounds do not apply); few labels
(`dgd.query_selection=medoids|clusters`, engine/few_label.py); `dgd.inputs=private-holdout` (Fig. 7). The student
is methods/dgd_student.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import ClassifierTraining
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import evaluate, streams
from privdistill.engine.context import Env
from privdistill.engine.datafree import GeneratorTraining
from privdistill.engine.ensemble import TeacherTraining, plan_teachers
from privdistill.engine.few_label import (
    CLUSTER_MEMBERS,
    cluster_pool,
    cluster_votes,
    embed_pool,
    medoid_queries,
    name_clusters,
    reader_probabilities,
)
from privdistill.engine.holdout import holdout_size, holdout_split
from privdistill.engine.query_selection import split_pool
from privdistill.engine.synthesis import query_label_agreement, source_labels, synthesis_agreement
from privdistill.engine.vae import VAETraining
from privdistill.errors import ConfigError
from privdistill.methods import end_to_end as e2e
from privdistill.methods.common import MethodAPI, RunRequest
from privdistill.methods.dgd_plan import LATENT_KEY, QUERIES_KEY, DGDConfig, dgd_pathways, plan_vote_event
from privdistill.methods.dgd_student import StudentConfig, train_student
from privdistill.methods.runner import Context, Method, Plan, Report, RunResult, Trained
from privdistill.models import create_model
from privdistill.privacy import mechanisms
from privdistill.privacy.events import GaussianQueries, LaplaceOnSyntheticCodes, LaplaceQueries
from privdistill.privacy.ledger import LedgerAnswer, LedgerView, PrivacyLedger
from privdistill.privacy.report import PRIVATE, Pathway


class DGDMethod(Method):
    name = "dgd"
    sections = {"baseline": ClassifierTraining, "teachers": TeacherTraining, "generator": GeneratorTraining,
                "vae": VAETraining, "dgd": DGDConfig, "student": StudentConfig, "dp_source": e2e.DPSourceConfig}

    def check_end_to_end(self, ctx: Context) -> None:  # the generator fitted to a DP source, its samples the inputs
        if ctx.section("dgd").inputs != "generator":
            raise ConfigError("--privacy end-to-end needs the generator's samples as the only inputs (dgd.inputs="
                              "generator)")
        source = ctx.section("dp_source")
        statistics = source.statistics(0.0)
        if statistics:  # the adversarial generator's BN-statistics target, released under DP
            if source.share + statistics >= 1:
                raise ConfigError(f"dp_source.share {source.share:g} + dp_source.statistics_share "
                                  f"{statistics:g} leave nothing of ε for the teachers' votes: keep "
                                  "their sum below 1")
            if ctx.section("generator").loss != "srr":
                raise ConfigError("dp_source.statistics_share is the target of a BN-statistics generator loss "
                                  "(generator.loss=srr, as the default recipe's); this generator would not read them")
            e2e.check_scatter_source(ctx, "dp_source.statistics_share needs a ScatterNet DP source")

    def summary_name(self, ctx: Context) -> str:
        return "dgd" if ctx.section("dgd").aggregation == "laplace" else "dgd+"

    def plan(self, ctx: Context, recorded: LedgerView) -> Plan:
        """|D̂s| from the target ε (or as given); refused here, before any stage trains, if it cannot fit."""
        cfg: DGDConfig = ctx.section("dgd")
        if cfg.source_labels and not e2e.is_end_to_end(ctx):
            raise ConfigError("dgd.source_labels=true labels samples with the generator's source model: only a DP "
                              "source (--privacy end-to-end) makes that free; with the non-private baseline it would "
                              "be uncovered")
        # end to end: the DP source's share (and the DP feature statistics' for its generator), then the votes'
        source = e2e.dgd_source_events(ctx) if e2e.is_end_to_end(ctx) else {}
        reads_codes = ctx.section("student").reads_latent_codes  # ε1 is spent only where the codes are read
        vote = plan_vote_event(cfg, ctx.budget, ctx.data.num_classes, fixed=list(source.values()),
                               reads_codes=reads_codes)
        queries, noise = vote.count, vote.scale if cfg.aggregation == "laplace" else vote.sigma
        pool_size = ((cfg.num_synthetic or len(ctx.data.train)) if cfg.inputs == "generator"
                     else holdout_size(cfg.holdout, len(ctx.data.train)))
        if queries >= pool_size:  # the pool below has exactly this size
            raise ConfigError(f"{queries} queries leave no unlabelled samples out of {pool_size}"
                              + (": raise dgd.num_synthetic" if cfg.inputs == "generator" else ""))
        events = {QUERIES_KEY: vote, **source}
        if cfg.latent_noise and reads_codes:
            events[LATENT_KEY] = LaplaceOnSyntheticCodes(epsilon1=cfg.epsilon1, dim=ctx.section("vae").latent_dim,
                                                         clip=cfg.latent_clip)
        private = ctx.data.train if cfg.inputs == "generator" else holdout_split(ctx.data, cfg.holdout, ctx.env)[0]
        notes = [plan_teachers(private, ctx.section("teachers"), distribution=cfg.aggregation, option="dgd noise",
                               scale=noise), *e2e.floor_notes(source)]
        if cfg.query_selection == "clusters":
            notes.append(f"cluster votes: {queries} clusters of {cfg.spread_pool:,} pool samples, each teacher voting "
                         f"its majority over {CLUSTER_MEMBERS} members; noise {noise:.4g} spends the target ε")
        # on resume the recorded uses are already in the ledger's total: plan only what is still to be spent
        return Plan(remaining=[e for key, e in events.items() if key not in recorded], notes=notes,
                    details={"queries": queries, "events": events, "cluster_labels": cfg.query_selection == "clusters",
                             "source_labels": cfg.source_labels})

    def train(self, ctx: Context, plan: Plan, ledger: PrivacyLedger) -> Trained:
        cfg: DGDConfig = ctx.section("dgd")
        env, data, stages, queries = ctx.env, ctx.data, ctx.stages, plan.details["queries"]
        # --- discriminative and generative streams (cached stages)
        generator, baseline, baseline_accuracy, refs, diagnostics = None, None, None, {}, {}
        if cfg.inputs == "generator":
            # the generator's discriminator: the non-private baseline, or in end-to-end mode a DP-SGD model
            baseline, fitted_key = e2e.generator_source(ctx, ledger, plan.details["events"], refs,
                                                    secure=cfg.secure_noise)
            fitted_to = baseline
            if e2e.STATISTICS_KEY in plan.details["events"]:  # the DP source has no BatchNorm statistics to match
                fitted_to, statistics_key = e2e.with_statistics(ctx, ledger, baseline,
                                                                plan.details["events"][e2e.STATISTICS_KEY],
                                                                secure=cfg.secure_noise)
                fitted_key += f"+{statistics_key}"
            generator, gen_stage = stages.generator(fitted_to, fitted_key, ctx.section("generator"))
            pool, pool_stage = stages.synthetic(generator, gen_stage, cfg.num_synthetic or len(data.train))
            source = baseline  # the model the generator was fitted to: what a query selection rule reads
            teachers, teachers_stage = stages.teachers(ctx.section("teachers"))
            baseline_accuracy = evaluate(baseline, data.test, env)
            # on 500 samples (a share to about 2 points): the whole ensemble reads each
            diagnostics["synthesis_quality"] = synthesis_agreement(pool[:500], source, baseline, teachers, env,
                                                                   data.num_classes)
            refs.update(generator=gen_stage.ref(), synthetic=pool_stage.ref())
            pool_key = pool_stage.key
        else:  # Fig. 7: a held-out slice of D plays the public unlabelled data; teachers learn on the rest
            private, public = holdout_split(data, cfg.holdout, env)
            teachers, teachers_stage = stages.teachers_on(private, ctx.section("teachers"))
            pool, pool_key, source = public.images, f"holdout:{public.fingerprint()}", None
        student_cfg: StudentConfig = ctx.section("student")
        vae = None
        if student_cfg.reads_latent_codes:  # Eq. 1's energies decode the unqueried samples' latent codes
            vae, vae_stage = stages.vae(pool, pool_key, ctx.section("vae"))
            refs.update(vae=vae_stage.ref())
        refs.update(teachers=teachers_stage.ref())

        # --- split: queries labelled by the noisy aggregation (Eq. 3), the rest as noisy latent codes; the paper
        # draws the queries at random, a selection rule reads only what the generator was fitted to
        queried, unqueried, grouping = _choose_queries(pool, queries, cfg, source, env, data.num_classes)
        query_images, rest_images = pool[queried], pool[unqueried]
        noise_seed, fresh, event = env.seed, {}, plan.details["events"][QUERIES_KEY]

        def answer_queries() -> LedgerAnswer:
            if cfg.query_selection == "clusters":  # the teachers' vote counts per cluster of `grouping`
                votes = cluster_votes(teachers, query_images, grouping[1], queries, data.num_classes, env,
                                      members=CLUSTER_MEMBERS, seed=env.seed)
            else:  # per queried sample (kept for the agreement diagnostic)
                votes = fresh["votes"] = torch.cat(list(teachers.iter_votes(query_images, env)))
            return _aggregate(votes, cfg, event, noise_seed)

        released = torch.as_tensor(ledger.spend(QUERIES_KEY, event, answer_queries))
        # the noisy vote share (histogram release) or the noisy label; the share's argmax is GNMax's/LNMax's label
        share = released.float() / teachers.num_teachers if cfg.release == "histogram" else None
        labels = share.argmax(1) if share is not None else released.long()
        if cfg.query_selection == "clusters":  # the histograms name the clusters; members learn the name
            labels, share = name_clusters(released)[grouping[1]], None
            diagnostics["clusters"] = {"count": queries, "pool": len(query_images),
                                       "classes": torch.bincount(labels, minlength=data.num_classes).tolist()}
        if baseline is not None:  # evaluation only: reads the non-private baseline, never released
            diagnostics.update({"query_agreement_with_baseline": query_label_agreement(
                baseline, query_images, labels, fresh.get("votes"), env),
                "query_agreement_note": "evaluation only: compares the teachers' labels on the queried synthetic "
                                        "samples with the non-private baseline's; not covered by any epsilon"})
        codes = (_latent_codes(vae, rest_images, cfg, env, ledger, plan.details["events"].get(LATENT_KEY), noise_seed)
                 if vae is not None else torch.empty(0, ctx.section("vae").latent_dim))

        # --- semi-supervised student (Eq. 1)
        torch.manual_seed(env.generator(streams.DGD_INIT).initial_seed())
        student = create_model(student_cfg.model, kind="classifier", in_channels=data.channels,
                               num_classes=data.num_classes, image_size=data.image_size[0])
        if cfg.source_labels:  # every unqueried sample labelled by the DP source: post-processing of a DP model, free
            labels = torch.cat([labels, source_labels(baseline, rest_images, env).to(labels.dtype).cpu()])
            query_images = torch.cat([query_images, rest_images])
        labelled = ImageDataset(query_images, labels, data.num_classes, name="queries (noisy labels)")
        if share is not None:  # samples the DP source labelled (dgd.source_labels) keep their label as a one-hot
            share = torch.cat([share, F.one_hot(labels[len(share):], data.num_classes).float()])
        student, train_stats = train_student(student, labelled, codes, vae, student_cfg, env, run=ctx.run,
                                             test=data.test, vote_share=share)
        return Trained(student=student, generator=generator, baseline_accuracy=baseline_accuracy,
                       fields={"stages": refs, "student_training": train_stats, **diagnostics})

    def pathways(self, ctx: Context, plan: Plan) -> dict[str, list[Pathway]]:
        cfg, dp = ctx.section("dgd"), e2e.is_end_to_end(ctx)
        source = "DP source (DP-SGD)" if dp else "non-private baseline classifier"
        pathways = dgd_pathways(aggregation=cfg.aggregation, source_is_dp=dp,
                                inputs="generator" if cfg.inputs == "generator" else "held-out-private",
                                fitted_to=source,
                                latent_codes=ctx.section("student").reads_latent_codes,
                                query_selection=cfg.query_selection, release=cfg.release)
        if cfg.source_labels:  # only ever on with a DP source (plan)
            pathways["student"].append(Pathway(PRIVATE, "DP source (DP-SGD) -> labels of the unqueried synthetic "
                                               "samples", "the student's supervised set", True,
                                               "post-processing of the DP source"))
        if dp and ctx.section("dp_source").statistics(0.0):
            pathways["generator"].append(Pathway(PRIVATE, "DP source's scattering features -> per-coordinate mean "
                                                 "and variance + Gaussian noise", "the generator's BatchNorm-"
                                                 "statistics target", True, "one Gaussian sum, in the ledger"))
        return pathways

    def report(self, ctx: Context, plan: Plan, trained: Trained, ledger: PrivacyLedger) -> Report:
        cfg, dp = ctx.section("dgd"), e2e.is_end_to_end(ctx)
        latent = LATENT_KEY in plan.details["events"]  # spent ε1: a student with Eq. 1's energies, latent noise on
        statistics = " + DP feature statistics" if e2e.STATISTICS_KEY in plan.details["events"] else ""
        covers = (f"the whole student: DP source{statistics} + teacher votes (strict)" if dp else
                  "the teacher-vote channel only (strict)" + ("; paper adds ε1 for the latent noise" if latent else ""))
        return Report(pathways=self.pathways(ctx, plan), secure_noise=cfg.secure_noise, noise_option="dgd.secure_noise",
                      fields={"epsilon_covers": covers, "queries": plan.details["queries"],
                              "aggregation": cfg.aggregation, "inputs": cfg.inputs, "latent_noise": latent,
                              "query_selection": cfg.query_selection, "release": cfg.release,
                              "variant": cfg.variant})


def run_dgd(request: RunRequest, *, cache: bool = True) -> RunResult:
    """DGD end to end: the released student and generator, the summary, ε under both accountings."""
    return DGDMethod().run(request, cache=cache)


def _choose_queries(pool: torch.Tensor, queries: int, cfg: DGDConfig, source: nn.Module | None, env: Env,
                    num_classes: int) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
    """(queried, unqueried) indices of the pool, and with cluster votes (the part's indices, their clusters):
    medoids and clusters come from a random part of the pool, in the backbone features (medoids) or class
    probabilities (clusters) of the model the generator was fitted to; the other rules choose over the whole pool
    (engine/query_selection.py)."""
    if cfg.query_selection not in ("medoids", "clusters"):
        return *split_pool(pool, queries, cfg.query_selection, reader=source, env=env,
                           rng=env.generator(streams.DGD_SPLIT), num_classes=num_classes), None
    part = torch.randperm(len(pool), generator=env.generator(streams.DGD_SPLIT))[:cfg.spread_pool]
    if queries > len(part):
        raise ConfigError(f"{queries} queries do not fit in dgd.spread_pool={cfg.spread_pool}: raise it")
    if cfg.query_selection == "clusters":  # every sample of the part is labelled by its cluster's name
        queried, grouping = part, (part, cluster_pool(reader_probabilities(source, pool[part], env), queries,
                                                      seed=env.seed))
    else:
        queried, grouping = part[medoid_queries(embed_pool(pool[part], env, reader=source), queries,
                                                seed=env.seed)], None
    rest = torch.ones(len(pool), dtype=torch.bool)
    rest[queried] = False
    return queried, rest.nonzero().squeeze(1), grouping


def _aggregate(votes: torch.Tensor, cfg: DGDConfig, event: LaplaceQueries | GaussianQueries,
               seed: int) -> LedgerAnswer:
    """The vote counts' release at the planned noise. The ledger keeps the votes (for PATE's data-dependent bound)
    only beside an argmax release: that bound does not price a released histogram."""
    gen = mechanisms.noise_source(seed, secure=cfg.secure_noise)
    distribution, scale = (("laplace", event.scale) if cfg.aggregation == "laplace" else ("gaussian", event.sigma))
    noisy = mechanisms.noisy_histogram(votes, distribution=distribution, scale=scale, generator=gen)
    # Eq. 3 (LNMax) or GNMax: the argmax of the noisy histogram; or, with dgd.release=histogram, the histogram
    if cfg.release == "histogram":
        return LedgerAnswer(answers=noisy.float())
    return LedgerAnswer(answers=noisy.argmax(1), votes=votes)


def _latent_codes(vae: nn.Module, images: torch.Tensor, cfg: DGDConfig, env: Env, ledger: PrivacyLedger,
                  event: LaplaceOnSyntheticCodes | None, seed: int) -> torch.Tensor:
    """VAE means of the unlabelled samples, clipped, perturbed (if enabled) and mapped back into the box."""
    means = []
    with torch.no_grad():
        for start in range(0, len(images), 1000):
            mu, _ = vae.encode(env.place_batch(to_float(images[start:start + 1000])))
            means.append(mu.float().cpu())
    codes = torch.cat(means)
    if not cfg.latent_noise:
        return codes.clamp(-cfg.latent_clip, cfg.latent_clip)

    def perturb():
        gen = mechanisms.noise_source(seed + 1, secure=cfg.secure_noise)
        return mechanisms.laplace_latent_perturbation(codes, clip=cfg.latent_clip, epsilon1=cfg.epsilon1, generator=gen)

    noisy = torch.as_tensor(ledger.spend(LATENT_KEY, event, perturb))
    return noisy.clamp(-cfg.latent_clip, cfg.latent_clip)  # M(·): back into the decoder's input box


class DGD(MethodAPI):
    """`DGD(epsilon=10, queries=1300).fit("mnist")` -> RunResult(student, generator, summary, privacy).

    `epsilon`, `max_epsilon`, `delta` and `accounting` go to the `budget` section (default accounting: strict);
    other keywords to the `dgd` section (`queries=1300`, `aggregation="gaussian"`, `inputs="private-holdout"`,
    `variant=...`); anything else through `overrides={"student.steps": 300, ...}`.
    """

    section, method = "dgd", DGDMethod
