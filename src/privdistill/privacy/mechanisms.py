"""The noise mechanisms of DGD, DPDFD and SRR, vectorised in torch (CPU and CUDA).

Every function takes an explicit ``generator`` and never touches torch's global random state; privacy parameters
are keyword-only; bad input raises :class:`privdistill.errors.PrivacyError`. These functions only *draw* the noise:
pricing is the accountants' job and recording the ledger's (``ledger.spend(key, event, lambda: lnmax(...))``).

``noise_source``: a seeded ``torch.Generator`` (reproducible; anyone who knows the seed, saved in the run's config,
can subtract the noise) or, with ``secure=True``, :class:`privacy.secure.SecureNoise` (OS entropy, discrete noise,
no floating-point attack). The distributions, and so the accounting, are the same; secure noise is not reproducible,
so a resumed run reuses the ledger's recorded answers.
"""

from __future__ import annotations

import math

import torch

from privdistill.errors import PrivacyError
from privdistill.privacy._checks import check_positive, check_real
from privdistill.privacy.events import ConfidentGaussianQueries
from privdistill.privacy.secure import SecureNoise

# ------------------------------------------------------------------------------------- generators
NoiseSource = torch.Generator | SecureNoise


def make_generator(seed: int | None = None, *, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (an integer in [0, 2**64)), for reproducible
    privacy noise. For a release, use ``noise_source(secure=True)``."""
    if seed is None:
        raise PrivacyError("make_generator needs a seed (for unseeded, secure noise use noise_source(secure=True))")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise PrivacyError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(seed)
    return gen


def noise_source(seed: int | None = None, *, secure: bool = False, device: str | torch.device = "cpu") -> NoiseSource:
    """The noise of one mechanism use: ``make_generator(seed, device=device)``, or with ``secure=True`` OpenDP's
    samplers (the seed is then not used: nothing about secure noise is derived from the run's configuration)."""
    return SecureNoise() if secure else make_generator(seed, device=device)


def _check_generator(generator: NoiseSource, tensor: torch.Tensor, what: str) -> None:
    if isinstance(generator, SecureNoise):
        return  # draws on the CPU, answers on the data's device
    if not isinstance(generator, torch.Generator):
        raise PrivacyError(f"{what}: generator must be a torch.Generator or SecureNoise (see noise_source), "
                           f"got {generator!r}")
    gdev = torch.device(generator.device)
    tdev = tensor.device
    if gdev.type != tdev.type or (gdev.type != "cpu" and (gdev.index or 0) != (tdev.index or 0)):
        raise PrivacyError(f"{what}: generator is on {gdev} but the data is on {tdev}; "
                           "create it with make_generator(..., device=data.device)")


def _float_dtype(t: torch.Tensor) -> torch.dtype:
    # noise is drawn in float64 on CPU (cheap, precise); on accelerators keep float32 unless the
    # data already is float64 (MPS has no float64).
    return torch.float64 if t.dtype == torch.float64 or t.device.type == "cpu" else torch.float32


def laplace_noise(shape, *, scale: float, generator: torch.Generator, device=None,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Laplace(0, scale) samples as the difference of two Exp(1) draws times ``scale``
    (no log(0) at the edge of the uniform's range)."""
    scale = check_positive("Laplace scale", scale)
    device = device if device is not None else generator.device
    e1 = torch.empty(shape, device=device, dtype=dtype).exponential_(1.0, generator=generator)
    e2 = torch.empty(shape, device=device, dtype=dtype).exponential_(1.0, generator=generator)
    return (e1 - e2) * scale


def gaussian_noise(shape, *, sigma: float, generator: torch.Generator, device=None,
                   dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """N(0, sigma^2) samples."""
    sigma = check_positive("sigma", sigma)
    device = device if device is not None else generator.device
    return torch.randn(shape, generator=generator, device=device, dtype=dtype) * sigma


def _noisy(values: torch.Tensor, *, distribution: str, scale: float, generator: NoiseSource,
           dtype: torch.dtype) -> torch.Tensor:
    """values + Laplace(scale) or N(0, scale^2) noise, elementwise, from either kind of noise source: seeded noise
    drawn in `dtype`; secure noise discrete on the integers for integer counts, on a fine grid for real values."""
    if isinstance(generator, SecureNoise):
        return generator.add(values, distribution=distribution, scale=scale).to(dtype)
    draw = laplace_noise if distribution == "laplace" else gaussian_noise
    scale_kw = {"scale": scale} if distribution == "laplace" else {"sigma": scale}
    return values.to(dtype) + draw(values.shape, generator=generator, device=values.device, dtype=dtype, **scale_kw)


def _counts(votes: torch.Tensor) -> torch.Tensor:
    """Vote counts as integers when they are whole numbers (so that secure noise is discrete and exact)."""
    if votes.is_floating_point() and bool((votes == votes.round()).all()):
        return votes.long()
    return votes


# ------------------------------------------------------------------------------------------ votes
def _check_votes(votes, what: str) -> torch.Tensor:
    if not isinstance(votes, torch.Tensor):
        raise PrivacyError(f"{what}: votes must be a torch tensor [queries, classes], got {type(votes).__name__}")
    if votes.dim() != 2:
        raise PrivacyError(f"{what}: votes must have shape [queries, classes], got {tuple(votes.shape)}")
    if votes.shape[0] == 0 or votes.shape[1] == 0:
        raise PrivacyError(f"{what}: votes are empty (shape {tuple(votes.shape)})")
    if votes.shape[1] < 2:
        raise PrivacyError(f"{what}: votes need at least 2 classes, got {votes.shape[1]}")
    if votes.dtype == torch.bool or votes.is_complex():
        raise PrivacyError(f"{what}: votes must be integer or float counts, got {votes.dtype}")
    if votes.is_floating_point() and not bool(torch.isfinite(votes).all()):
        raise PrivacyError(f"{what}: votes contain NaN or infinite counts")
    if bool((votes < 0).any()):
        raise PrivacyError(f"{what}: votes contain negative counts")
    return votes


def lnmax(votes: torch.Tensor, *, scale: float, generator: torch.Generator) -> torch.Tensor:
    """Laplace noisy argmax (LNMax; DGD Eq. 3): ``argmax_k(votes_k + Lap(scale))`` per row.

    ``votes``: [B, K] vote counts; returns int64 labels [B]. DGD uses scale = 2/epsilon0 = 40.
    """
    scale = check_positive("Laplace scale", scale)
    return _noisy_argmax(votes, "lnmax", generator, "laplace", scale)


def gnmax(votes: torch.Tensor, *, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """Gaussian noisy argmax (GNMax; PATE 2018, DGD+): ``argmax_k(votes_k + N(0, sigma^2))``."""
    sigma = check_positive("sigma", sigma)
    return _noisy_argmax(votes, "gnmax", generator, "gaussian", sigma)


def noisy_histogram(votes: torch.Tensor, *, distribution: str, scale: float, generator: NoiseSource,
                    what: str = "noisy_histogram") -> torch.Tensor:
    """``votes + noise`` on every count (Laplace of scale ``scale``, or Gaussian of standard deviation ``scale``).

    The whole noisy histogram is what LNMax's and GNMax's data-independent analyses price (one changed teacher
    moves the counts by (+1, -1)); their argmax is post-processing of it. So releasing the histogram itself costs
    the same ε under those analyses, but not under PATE's data-dependent bounds, which price the argmax only.
    """
    votes = _check_votes(votes, what)
    _check_generator(generator, votes, what)
    if distribution not in ("laplace", "gaussian"):
        raise PrivacyError(f"{what}: distribution must be 'laplace' or 'gaussian', got {distribution!r}")
    scale = check_positive("Laplace scale" if distribution == "laplace" else "sigma", scale)
    return _noisy(_counts(votes), distribution=distribution, scale=scale, generator=generator,
                  dtype=_float_dtype(votes))


def _noisy_argmax(votes: torch.Tensor, what: str, generator: NoiseSource, distribution: str,
                  scale: float) -> torch.Tensor:
    """argmax_k(votes_k + noise) per row (ties, possible with discrete secure noise: the lowest class index, a
    fixed post-processing rule)."""
    noisy = noisy_histogram(votes, distribution=distribution, scale=scale, generator=generator, what=what)
    return torch.argmax(noisy, dim=1)


def confident_gnmax(votes: torch.Tensor, *, threshold: float, sigma1: float, sigma2: float,
                    generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident-GNMax (PATE 2018, Alg. 1): answer only if ``max(votes) + N(0, sigma1^2) >= threshold``,
    then with GNMax(sigma2). Returns (labels [B] int64 with -1 where not answered, answered [B] bool).

    The step-2 noise is drawn for every row and discarded where not answered: the same distribution
    as drawing it only for answered rows, without a data-dependent amount of random numbers.
    """
    votes = _check_votes(votes, "confident_gnmax")
    threshold = check_real("threshold", threshold)
    sigma1 = check_positive("sigma1", sigma1)
    sigma2 = check_positive("sigma2", sigma2)
    _check_generator(generator, votes, "confident_gnmax")
    dt = _float_dtype(votes)
    counts = _counts(votes)
    answered = _noisy(counts.max(dim=1).values, distribution="gaussian", scale=sigma1, generator=generator,
                      dtype=dt) >= threshold
    labels = torch.argmax(_noisy(counts, distribution="gaussian", scale=sigma2, generator=generator, dtype=dt), dim=1)
    labels = torch.where(answered, labels, torch.full_like(labels, -1))
    return labels, answered


def filtered_confident_gnmax(votes: torch.Tensor, *, threshold: float, sigma1: float, sigma2: float,
                             filter_budget: int, generator: torch.Generator, spent: float = 0.0
                             ) -> tuple[torch.Tensor, torch.Tensor, int, float]:
    """Confident-GNMax under an RDP privacy filter (Feldman & Zrnic, NeurIPS 2021, Thm 3.1): the rows are asked
    in order while the realised cost (every threshold check, and the GNMax step of the answered rows) plus one
    more worst-case row stays within the RDP of `filter_budget` rows all answered. An unanswered row costs only
    its check (λ/(2σ1²), against λ/σ2² more for an answer), so when many rows are refused the filter asks more
    of them than a plan that prices every row as answered, for the same guarantee.

    `spent`: the cost of rows asked before these (RDP / λ, as returned), so a pool can be asked chunk by chunk.
    Returns (labels [B] with -1 where not answered or not asked, answered [B] bool, rows asked, cost spent
    after them). The noise is drawn for every row, as in confident_gnmax; the rows past the stop are never
    released. The stopping rule reads only the released outcomes (answered or not), as the filter requires."""
    labels, answered = confident_gnmax(votes, threshold=threshold, sigma1=sigma1, sigma2=sigma2, generator=generator)
    # the costs the strict accountant prices, from the event that records the run
    check, answer = ConfidentGaussianQueries(threshold=threshold, sigma1=sigma1, sigma2=sigma2, count=1).round_costs
    budget = filter_budget * (check + answer) * (1 + 1e-12)
    # the cost before each row from integer counts (checks so far, answers so far): no rounding builds up
    answers_before = torch.cumsum(answered.long().cpu(), 0) - answered.long().cpu()
    spent_before = spent + torch.arange(len(answered), dtype=torch.float64) * check + answers_before.double() * answer
    asked = int((spent_before + check + answer <= budget).sum())  # spent_before increases: a prefix
    labels[asked:], answered[asked:] = -1, False
    return labels, answered, asked, spent + asked * check + int(answered[:asked].sum()) * answer


# ---------------------------------------------------------------------------- randomized response
def _check_labels(labels, num_classes: int, what: str) -> torch.Tensor:
    if not isinstance(labels, torch.Tensor):
        raise PrivacyError(f"{what}: labels must be a torch tensor, got {type(labels).__name__}")
    if labels.dim() != 1:
        raise PrivacyError(f"{what}: labels must have shape [N], got {tuple(labels.shape)}")
    if labels.numel() == 0:
        raise PrivacyError(f"{what}: labels are empty")
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise PrivacyError(f"{what}: labels must be integers, got {labels.dtype}")
    if bool((labels < 0).any()) or bool((labels >= num_classes).any()):
        raise PrivacyError(f"{what}: labels must lie in [0, {num_classes}), got values in "
                           f"[{int(labels.min())}, {int(labels.max())}]")
    return labels.long()


def rr_keep_probability(k, epsilon: float):
    """k-ary randomized response's probability of releasing the true label, e^eps/(e^eps + k - 1), written
    stably for large eps; 1 when k = 1. `k` may be a number or a tensor of set sizes."""
    return 1.0 / (1.0 + (k - 1.0) * math.exp(-epsilon))


def randomized_response(labels: torch.Tensor, *, num_classes: int, epsilon: float,
                        generator: torch.Generator) -> torch.Tensor:
    """k-ary randomized response: keep each label with probability e^eps / (e^eps + K - 1), else
    output one of the K - 1 other classes uniformly. eps-DP per label."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise PrivacyError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    epsilon = check_positive("epsilon per label", epsilon)
    labels = _check_labels(labels, num_classes, "randomized_response")
    _check_generator(generator, labels, "randomized_response")
    k = num_classes
    if isinstance(generator, SecureNoise):  # the same distribution: k-RR on the set of all classes
        everything = torch.ones((labels.shape[0], k), dtype=torch.bool, device=labels.device)
        return rr_on_sets(everything, labels, epsilon=epsilon, generator=generator)
    p_keep = rr_keep_probability(k, epsilon)
    u = torch.rand(labels.shape, generator=generator, device=labels.device, dtype=torch.float64)
    shift = torch.randint(1, k, labels.shape, generator=generator, device=labels.device)
    other = (labels + shift) % k
    return torch.where(u < p_keep, labels, other)


def selective_randomized_response(student_probs: torch.Tensor, teacher_labels: torch.Tensor, *,
                                  epsilon: float, threshold: float | None = None,
                                  generator: torch.Generator) -> torch.Tensor:
    """Selective randomized response, SRR paper Alg. 1 (function R), vectorised over N samples.

    I = {k : y_s[k] > t} (t = 1/(2K) by default); if |I| < 2, I = the indices of the two largest
    y_s; k = |I|. If the teacher's label y is in I, return y with probability e^eps/(e^eps + k - 1)
    and each other member of I with probability 1/(e^eps + k - 1); otherwise return a uniform member
    of I. Returns int64 labels [N].

    ``teacher_labels``: [N] integer labels, or [N, K] teacher outputs (their argmax is used). The
    algorithm box says "return y_t"; releasing the teacher's soft output would not be DP, so the
    one-hot label argmax(y_t) is returned (as the text around Fig. 1 describes).
    """
    if not isinstance(student_probs, torch.Tensor) or student_probs.dim() != 2:
        raise PrivacyError("selective_randomized_response: student_probs must be a tensor [N, K]")
    n, k_classes = student_probs.shape
    if n == 0 or k_classes < 2:
        raise PrivacyError(f"selective_randomized_response: student_probs has shape {tuple(student_probs.shape)}; "
                           "need N >= 1 rows and K >= 2 classes")
    if not student_probs.is_floating_point() or not bool(torch.isfinite(student_probs).all()):
        raise PrivacyError("selective_randomized_response: student_probs must be finite floats")
    if isinstance(teacher_labels, torch.Tensor) and teacher_labels.dim() == 2:
        if teacher_labels.shape != student_probs.shape:
            raise PrivacyError(f"selective_randomized_response: teacher outputs {tuple(teacher_labels.shape)} "
                               f"do not match student_probs {tuple(student_probs.shape)}")
        teacher_labels = teacher_labels.argmax(dim=1)
    labels = _check_labels(teacher_labels, k_classes, "selective_randomized_response")
    if labels.shape[0] != n:
        raise PrivacyError(f"selective_randomized_response: {labels.shape[0]} teacher labels for {n} student rows")
    epsilon = check_positive("epsilon per label", epsilon)
    t = 1.0 / (2.0 * k_classes) if threshold is None else check_real("threshold", threshold)
    _check_generator(generator, student_probs, "selective_randomized_response")
    if labels.device != student_probs.device:
        raise PrivacyError("selective_randomized_response: teacher labels and student_probs are on different devices")

    return rr_on_sets(srr_candidate_sets(student_probs, t), labels, epsilon=epsilon, generator=generator)


# ------------------------------------------------------------ randomized response on candidate sets
# SRR, plain k-RR and RRWithPrior are one family: k-RR restricted to a candidate set I chosen without looking
# at the label, uniform on I if the label is not in I (plain RR: I = all K classes). Each released label is
# eps-DP in the label it hides whatever I is (docs/privacy.md, SRR strict).
LABEL_MECHANISMS = ("srr", "rr", "rr-prior")


def srr_candidate_sets(student_probs: torch.Tensor, threshold: float) -> torch.Tensor:
    """SRR's I per row: {k : y_s[k] > t}, or the two largest y_s when fewer than two pass. [N, K] bool."""
    in_set = student_probs > threshold
    small = in_set.sum(dim=1) < 2
    if bool(small.any()):
        top2 = torch.topk(student_probs, 2, dim=1).indices
        top2_mask = torch.zeros_like(in_set).scatter_(1, top2, True)
        in_set = torch.where(small[:, None], top2_mask, in_set)
    return in_set


def rr_with_prior_sets(prior: torch.Tensor, epsilon: float) -> torch.Tensor:
    """RRWithPrior's candidate sets (Ghazi et al., NeurIPS 2021, Alg. 2): the top-k* classes of the prior with
    k* = argmax_k e^eps/(e^eps + k - 1) * sum_{j in top k} prior_j (ties: the smallest k). [N, K] bool."""
    n, k_classes = prior.shape
    sorted_p, order = torch.sort(prior.double(), dim=1, descending=True, stable=True)
    ks = torch.arange(1, k_classes + 1, dtype=torch.float64, device=prior.device)
    weight = rr_keep_probability(ks, epsilon)
    objective = sorted_p.cumsum(dim=1) * weight
    k_star = objective.argmax(dim=1) + 1  # argmax returns the first maximum: the smallest k
    rank_mask = ks[None, :] <= k_star[:, None].double()
    return torch.zeros_like(rank_mask).scatter_(1, order, rank_mask)


def rr_on_sets(in_set: torch.Tensor, labels: torch.Tensor, *, epsilon: float,
               generator: torch.Generator) -> torch.Tensor:
    """k-RR restricted to a candidate set per row: ``in_set`` [N, K] bool (at least one True per row),
    ``labels`` [N]. If the label is in I (k = |I|): keep it with probability e^eps/(e^eps + k - 1), else a
    uniform other member of I; if the label is not in I: a uniform member of I. eps-DP in the label whenever
    I does not depend on it."""
    n, k_classes = in_set.shape
    if n == 0 or not bool(in_set.any(dim=1).all()):
        raise PrivacyError("rr_on_sets: every row needs a non-empty candidate set")
    labels = labels.long()
    k = in_set.sum(dim=1).to(torch.float64)
    y_in = in_set.gather(1, labels[:, None]).squeeze(1)
    p_keep = rr_keep_probability(k, epsilon)
    if isinstance(generator, SecureNoise):
        return generator.randomized_response(in_set, labels, p_keep)
    dev = in_set.device  # draws on the generator's device, then moved: any device pairing works

    def uniform(*shape):
        return torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device).to(dev)

    keep = y_in & (uniform(n) < p_keep)
    # a uniform member of I \ {y} (if y in I) or of I (if not): argmax of iid uniforms on the allowed set
    allowed = in_set.clone()
    allowed[torch.arange(n, device=dev), labels] &= ~y_in
    scores = uniform(n, k_classes)
    scores = torch.where(allowed, scores, torch.full_like(scores, -1.0))
    other = scores.argmax(dim=1)
    # k = 1 and y in I: kept with probability 1 (allowed is empty, `other` is never used)
    return torch.where(keep, labels, other)


def released_label_likelihood(in_set: torch.Tensor, released: torch.Tensor, *, epsilon: float) -> torch.Tensor:
    """What a released label says about the label it hides: P(released | true label = y) for every class y,
    [N, K], for k-RR on the candidate set I (`rr_on_sets`; plain RR is I = all classes, SRR's R the same with
    SRR's I). With k = |I|: e^eps/(e^eps + k - 1) for y = the released label, 1/(e^eps + k - 1) for the other
    members of I, 1/k for y outside I (a uniform member of I was released). Post-processing of the release
    and the set (which never depends on the label): a student may train on this likelihood at no privacy cost."""
    if in_set.dim() != 2 or in_set.dtype != torch.bool:
        raise PrivacyError(f"released_label_likelihood: in_set must be a bool tensor [N, K], got "
                           f"{in_set.dtype} {tuple(in_set.shape)}")
    n, _ = in_set.shape
    released = released.long().to(in_set.device)
    if released.shape != (n,) or not bool(in_set.gather(1, released[:, None]).all()):
        raise PrivacyError("released_label_likelihood: every released label must be a member of its row's set")
    epsilon = check_positive("epsilon per label", epsilon)
    k = in_set.sum(dim=1, keepdim=True).to(torch.float64)
    p_keep = rr_keep_probability(k, epsilon)
    p_other = (1.0 - p_keep) / (k - 1.0).clamp(min=1.0)  # k = 1: p_keep = 1, and I has no other member
    likelihood = torch.where(in_set, p_other, 1.0 / k)
    return likelihood.scatter(1, released[:, None], p_keep)


def candidate_sets(mechanism: str, prior: torch.Tensor, *, epsilon: float, threshold: float) -> torch.Tensor:
    """The set I each label mechanism draws from, given the prior [N, K] (evaluation statistics read it)."""
    if mechanism == "srr":
        return srr_candidate_sets(prior, threshold)
    if mechanism == "rr-prior":
        return rr_with_prior_sets(prior, epsilon)
    if mechanism == "rr":
        return torch.ones_like(prior, dtype=torch.bool)
    raise PrivacyError(f"label mechanism must be one of {LABEL_MECHANISMS}, got {mechanism!r}")


def release_labels(mechanism: str, prior: torch.Tensor, labels: torch.Tensor, *, epsilon: float,
                   threshold: float | None, generator: torch.Generator) -> torch.Tensor:
    """The labels one use of a label mechanism releases: ``prior`` = the student's softmax [N, K] (SRR's y_s),
    ``labels`` = the label the mechanism protects (a teacher's argmax, or the true label under label-DP)."""
    if mechanism == "srr":
        return selective_randomized_response(prior, labels, epsilon=epsilon, threshold=threshold, generator=generator)
    if mechanism == "rr":
        return randomized_response(labels, num_classes=prior.shape[1], epsilon=epsilon, generator=generator)
    if mechanism == "rr-prior":
        return rr_on_sets(rr_with_prior_sets(prior, epsilon), labels, epsilon=epsilon, generator=generator)
    raise PrivacyError(f"label mechanism must be one of {LABEL_MECHANISMS}, got {mechanism!r}")


# ------------------------------------------------------------------------------------------- DPDFD
GRANULARITIES = ("per_sample", "batch_sum")


def _check_grads(grads, dims: int, what: str) -> torch.Tensor:
    if not isinstance(grads, torch.Tensor):
        raise PrivacyError(f"{what}: grads must be a torch tensor, got {type(grads).__name__}")
    shape = "[B, K]" if dims == 2 else "[n, B, K]"
    if grads.dim() != dims:
        raise PrivacyError(f"{what}: grads must have shape {shape}, got {tuple(grads.shape)}")
    if grads.numel() == 0:
        raise PrivacyError(f"{what}: grads are empty (shape {tuple(grads.shape)})")
    if not grads.is_floating_point():
        raise PrivacyError(f"{what}: grads must be floating point, got {grads.dtype}")
    if not bool(torch.isfinite(grads).all()):
        raise PrivacyError(f"{what}: grads contain NaN or infinite values")
    return grads


def _check_gradient_mechanism(what: str, grads, dims: int, *, clip_norm: float, sigma: float, granularity: str,
                              generator: torch.Generator) -> tuple[torch.Tensor, float, float]:
    """The arguments every DPDFD mechanism takes, checked: (grads, C, sigma)."""
    grads = _check_grads(grads, dims, what)
    clip_norm = check_positive("clip norm C", clip_norm)
    sigma = check_positive("sigma", sigma)
    if granularity not in GRANULARITIES:
        raise PrivacyError(f"granularity must be 'per_sample' or 'batch_sum', got {granularity!r}")
    _check_generator(generator, grads, what)
    return grads, clip_norm, sigma


def _noise_and_divide(bounded: torch.Tensor, *, noise_std: float, granularity: str, divisor: int,
                      generator: torch.Generator) -> torch.Tensor:
    """The noise every DPDFD mechanism adds to its bounded per-sample vectors ``bounded`` [B, K] (already summed
    over teachers): ``per_sample`` adds N(0, noise_std^2 I_K) to each row and returns [B, K]; ``batch_sum`` adds
    one such vector to the sum of the rows and returns [K]. Both divide by ``divisor`` (n * B, or n)."""
    released = bounded if granularity == "per_sample" else bounded.sum(dim=0)
    return _noisy(released, distribution="gaussian", scale=noise_std, generator=generator,
                  dtype=bounded.dtype) / divisor


def _normalise(grads: torch.Tensor, clip_norm: float, stability: float) -> torch.Tensor:
    # C * g / (||g||_2 + e): norm strictly below C (DPDFD Alg. 1 line 7)
    return grads * (clip_norm / (torch.linalg.vector_norm(grads, dim=-1, keepdim=True) + stability))


def normalize_and_noise(grads: torch.Tensor, *, clip_norm: float, sigma: float, stability: float = 1e-4,
                        granularity: str = "per_sample", generator: torch.Generator) -> torch.Tensor:
    """DPDFD's A_{C,sigma} for one teacher (Alg. 1), on per-sample output gradients ``grads`` [B, K].

    ``granularity="per_sample"`` (default): row i becomes (C g_i/(||g_i|| + e) + N(0, sigma^2 C^2 I_K)) / B,
    i.e. a noisy gradient of the batch-MEAN loss w.r.t. sample i's logits; returns [B, K].
    ``granularity="batch_sum"``: the literal Eq. 4, (sum_i C g_i/(||g_i|| + e) + N(0, sigma^2 C^2 I_K)) / B,
    one vector [K] for the whole batch (it carries no per-sample information; broadcast by the caller).
    Both are priced by ``NormalisedGaussian(..., granularity=...)`` (docs/privacy.md derives the sensitivities).
    """
    grads, clip_norm, sigma = _check_gradient_mechanism("normalize_and_noise", grads, 2, clip_norm=clip_norm,
                                                        sigma=sigma, granularity=granularity, generator=generator)
    stability = check_positive("stability constant e", stability)
    return _noise_and_divide(_normalise(grads, clip_norm, stability), noise_std=sigma * clip_norm,
                             granularity=granularity, divisor=grads.shape[0], generator=generator)


def normalize_and_noise_multi(grads: torch.Tensor, *, clip_norm: float, sigma: float, stability: float = 1e-4,
                              granularity: str = "per_sample", batch_mean: bool = False,
                              generator: torch.Generator) -> torch.Tensor:
    """DPDFD's multi-teacher A_{C,sigma} (Alg. 2) on per-sample gradients ``grads`` [n, B, K] (teacher j,
    sample i): row i becomes (1/n) (sum_j C g_ij/(||g_ij|| + e) + N(0, sigma^2 C^2 I_K)); returns [B, K].

    ``batch_mean=True`` additionally divides by B (the 1/B convention of Alg. 1, i.e. the gradient of
    the batch-mean loss); Alg. 2 as printed does not. A constant factor changes nothing in the privacy
    analysis. ``granularity="batch_sum"`` sums over samples too and returns one vector [K]:
    (1/n) (sum_ij C g_ij/(||g_ij|| + e) + N(0, sigma^2 C^2 I_K)) (divided by B if ``batch_mean``).
    Alg. 2's line 8 writes ||g||; the norm is read as ||g_ij||, per gradient, as in Alg. 1.
    """
    grads, clip_norm, sigma = _check_gradient_mechanism("normalize_and_noise_multi", grads, 3, clip_norm=clip_norm,
                                                        sigma=sigma, granularity=granularity, generator=generator)
    stability = check_positive("stability constant e", stability)
    n, b, _ = grads.shape
    summed = _normalise(grads, clip_norm, stability).sum(dim=0)  # [B, K]
    return _noise_and_divide(summed, noise_std=sigma * clip_norm, granularity=granularity,
                             divisor=n * (b if batch_mean else 1), generator=generator)


def clip_and_noise(grads: torch.Tensor, *, clip_norm: float, sigma: float, granularity: str = "per_sample",
                   generator: torch.Generator, teachers_axis: bool = False, batch_mean: bool = True) -> torch.Tensor:
    """A_{C,sigma} with CLIPPING instead of normalisation (DPDFD Fig. 2): g * min(1, C/||g||), then the same noise.

    ``grads`` [B, K] (or [n, B, K] with ``teachers_axis``: summed over teachers and divided by n). Vectors of
    norm <= C either way, so the sensitivity and the accountings are those of normalise-and-noise."""
    grads, clip_norm, sigma = _check_gradient_mechanism("clip_and_noise", grads, 3 if teachers_axis else 2,
                                                        clip_norm=clip_norm, sigma=sigma, granularity=granularity,
                                                        generator=generator)
    norms = torch.linalg.vector_norm(grads, dim=-1, keepdim=True)
    clipped = grads * torch.clamp(clip_norm / norms.clamp_min(1e-30), max=1.0)
    n = clipped.shape[0] if teachers_axis else 1
    if teachers_axis:
        clipped = clipped.sum(0)
    return _noise_and_divide(clipped, noise_std=sigma * clip_norm, granularity=granularity,
                             divisor=n * (clipped.shape[0] if batch_mean else 1), generator=generator)


def privatise(grads: torch.Tensor, *, operation: str, clip_norm: float, sigma: float, stability: float,
              granularity: str, generator: torch.Generator) -> torch.Tensor:
    """DPDFD's A_{C,sigma} as configured: per-sample output gradients [B, K] (Alg. 1 and 3) or [n, B, K] (Alg. 2,
    one row per teacher), normalised (``operation="normalize"``, the paper) or clipped ("clip", Fig. 2), noised,
    averaged over the batch (and the teachers) -> [B, K] (or [K] with ``granularity="batch_sum"``)."""
    multi = grads.dim() == 3
    if operation == "clip":
        return clip_and_noise(grads, clip_norm=clip_norm, sigma=sigma, granularity=granularity,
                              generator=generator, teachers_axis=multi)
    if multi:
        return normalize_and_noise_multi(grads, clip_norm=clip_norm, sigma=sigma, stability=stability,
                                         granularity=granularity, batch_mean=True, generator=generator)
    return normalize_and_noise(grads, clip_norm=clip_norm, sigma=sigma, stability=stability,
                               granularity=granularity, generator=generator)


# --------------------------------------------------------------------------------------------- DGD
def laplace_latent_perturbation(codes: torch.Tensor, *, clip: float = 1.0, epsilon1: float,
                                generator: torch.Generator) -> torch.Tensor:
    """DGD's latent-code perturbation: clamp each coordinate to [-clip, clip], add Laplace noise of scale
    2 * clip * c / epsilon1 per coordinate (c = code dimension), the codes being rows of ``codes`` [N, c].

    Reading of DGD Sec. III-E ("Laplacian noise with scale 2c/eps1 to the normalized latent codes"):
    codes clamped to [-1, 1]^c have L1 diameter 2c, so scale 2c/eps1 makes each released code
    eps1-DP with respect to replacing that (synthetic) code. Clamping is chosen over L2-normalising
    because it makes the stated scale exactly the L1 sensitivity. This protects the synthetic codes
    only, never the private records (docs/privacy.md).
    """
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.numel() == 0:
        raise PrivacyError("laplace_latent_perturbation: codes must be a non-empty tensor [N, c]")
    if not codes.is_floating_point() or not bool(torch.isfinite(codes).all()):
        raise PrivacyError("laplace_latent_perturbation: codes must be finite floats")
    clip = check_positive("latent clip", clip)
    epsilon1 = check_positive("epsilon1", epsilon1)
    _check_generator(generator, codes, "laplace_latent_perturbation")
    c = codes.shape[1]
    scale = 2.0 * clip * c / epsilon1
    return _noisy(codes.clamp(-clip, clip), distribution="laplace", scale=scale, generator=generator,
                  dtype=codes.dtype)


# ---------------------------------------------------------------------------------- feature statistics
#: ||u * u|| of a feature vector u of norm 1 is small (about 0.03 on GroupNorm'd scattering features): the squares
#: are scaled by 1 / SQUARE_CLIP before clipping, so that the noise does not swamp them. A fixed constant, not read
#: from the data.
SQUARE_CLIP = 0.05


def gaussian_feature_statistics(features: torch.Tensor, *, noise_multiplier: float, generator: NoiseSource,
                                square_clip: float = SQUARE_CLIP) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-coordinate mean and variance of private `features` [n, d], released by ONE Gaussian sum.

    Each example contributes w = [u, clip(u * u / square_clip, 1)] / sqrt(2), with u its feature vector scaled to
    norm 1 (the variance is read on that scale, times d: for GroupNorm'd features, whose norm is sqrt(d), the
    features' own), so ||w|| <= 1 and replacing one example moves the sum by at most 2. Noise N(0, z^2) on every
    coordinate of the sum is then exactly DP-SGD's Gaussian step with q = 1 (privacy.events.SubsampledGaussian with
    sample_rate 1 and one step: dp-accounting's replace-one PLD prices sensitivity 2). n is public (the size of
    the training set). Returns (mean, variance), the variance floored at 1e-2."""
    check_positive("noise multiplier", noise_multiplier)
    if features.ndim != 2 or len(features) < 1:
        raise PrivacyError(f"feature statistics need features [n, d], got shape {tuple(features.shape)}")
    n, d = features.shape
    u = features.double() / features.double().norm(dim=1, keepdim=True).clamp_min(1e-12)
    squares = u * u / square_clip
    squares = squares / squares.norm(dim=1, keepdim=True).clamp_min(1.0)
    total = torch.cat([u, squares], 1).sum(0) / math.sqrt(2)
    _check_generator(generator, total, "feature statistics")
    total = _noisy(total, distribution="gaussian", scale=noise_multiplier, generator=generator, dtype=torch.float64)
    sum_u, sum_squares = total[:d] * math.sqrt(2), total[d:] * math.sqrt(2)
    mean = sum_u / n * math.sqrt(d)
    var = (sum_squares / n * square_clip * d - mean ** 2).clamp_min(1e-2)
    return mean.float(), var.float()
