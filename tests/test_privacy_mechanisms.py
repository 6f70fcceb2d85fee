"""Mechanisms: output distributions against theory (chi-square, Kolmogorov-Smirnov), shapes, devices,
reproducibility, bad input. Seeds are fixed, so the statistical tests are deterministic."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from privdistill.errors import PrivacyError
from privdistill.privacy import mechanisms as M

P_MIN = 1e-3  # a correct sampler fails one of these tests with probability ~1e-3 per seed; seeds are fixed
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def gen(seed=0, device="cpu"):
    return M.make_generator(seed, device=device)


def chisq(observed: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * observed.sum()
    return stats.chisquare(observed, expected).pvalue


def counts(labels: torch.Tensor, k: int) -> np.ndarray:
    return torch.bincount(labels.cpu(), minlength=k).numpy()


# ------------------------------------------------------------------------------------- noise scales
def test_laplace_noise_distribution():
    x = M.laplace_noise((40000,), scale=3.0, generator=gen(1)).numpy()
    assert stats.kstest(x, stats.laplace(scale=3.0).cdf).pvalue > P_MIN
    assert x.std() == pytest.approx(3.0 * math.sqrt(2), rel=0.03)


def test_gaussian_noise_distribution():
    x = M.gaussian_noise((40000,), sigma=2.5, generator=gen(2)).numpy()
    assert stats.kstest(x, stats.norm(scale=2.5).cdf).pvalue > P_MIN


# --------------------------------------------------------------------------------- noisy argmax
def test_lnmax_two_classes_matches_laplace_difference_tail():
    n, a, b = 50, 30, 5.0  # gap g = 10 votes
    votes = torch.tensor([[a, n - a]]).repeat(40000, 1)
    labels = M.lnmax(votes, scale=b, generator=gen(3))
    g = (2 * a - n) / b
    p1 = (2 + g) / 4 * math.exp(-g)  # Pr[Lap - Lap > gap]
    assert chisq(counts(labels, 2), np.array([1 - p1, p1])) > P_MIN


def test_gnmax_two_classes_matches_gaussian_tail():
    votes = torch.tensor([[30, 20]]).repeat(40000, 1)
    labels = M.gnmax(votes, sigma=6.0, generator=gen(4))
    p1 = stats.norm.sf(10 / (math.sqrt(2) * 6.0))
    assert chisq(counts(labels, 2), np.array([1 - p1, p1])) > P_MIN


def test_noisy_argmax_shapes_and_float_votes():
    votes = torch.rand(7, 10) * 100
    for out in (M.lnmax(votes, scale=40, generator=gen()), M.gnmax(votes, sigma=40, generator=gen())):
        assert out.shape == (7,) and out.dtype == torch.int64
        assert int(out.min()) >= 0 and int(out.max()) < 10


def test_noisy_histogram_is_what_the_noisy_argmax_reads():
    """The released histogram and GNMax / LNMax on the same noise stream: its argmax is their label; its noise has
    the mechanism's scale; bad input is refused like theirs."""
    votes = torch.tensor([[120, 80, 50], [10, 200, 40]]).repeat(5000, 1)
    for dist, scale, argmax in (("gaussian", 40.0, M.gnmax), ("laplace", 40.0, M.lnmax)):
        kw = {"sigma": scale} if dist == "gaussian" else {"scale": scale}
        noisy = M.noisy_histogram(votes, distribution=dist, scale=scale, generator=gen(5))
        assert noisy.shape == votes.shape and noisy.is_floating_point()
        assert torch.equal(noisy.argmax(1), argmax(votes, generator=gen(5), **kw))
        want = scale if dist == "gaussian" else scale * math.sqrt(2)
        assert float((noisy - votes).std()) == pytest.approx(want, rel=0.03)
    with pytest.raises(PrivacyError, match="distribution"):
        M.noisy_histogram(votes, distribution="uniform", scale=1.0, generator=gen())
    with pytest.raises(PrivacyError, match="negative"):
        M.noisy_histogram(-votes, distribution="gaussian", scale=1.0, generator=gen())


def test_confident_gnmax_answer_rate_and_labels():
    votes = torch.tensor([[160, 40, 0], [100, 90, 10]]).repeat(20000, 1)
    labels, answered = M.confident_gnmax(votes, threshold=150, sigma1=20, sigma2=10, generator=gen(5))
    assert labels.shape == answered.shape == (40000,)
    assert bool((labels[~answered] == -1).all()) and bool((labels[answered] >= 0).all())
    for row, top in ((0, 160), (1, 100)):
        sel = answered[row::2]
        p = stats.norm.sf((150 - top) / 20)
        assert chisq(np.array([int(sel.sum()), int((~sel).sum())]), np.array([p, 1 - p])) > P_MIN
    first = labels[0::2][answered[0::2]]
    assert bool((first == 0).float().mean() > 0.99)  # gap 120 at sigma 10: practically always class 0


def test_filtered_confident_gnmax_asks_until_the_budget_of_answered_queries_is_spent():
    """A refused query costs its check only: with half the rows refused the filter asks about twice the budget,
    with every row answered exactly the budget; the released prefix is what confident_gnmax draws, the rest -1."""
    from privdistill.privacy.events import ConfidentGaussianQueries

    votes = torch.tensor([[1000, 0, 0], [0, 0, 0]]).repeat(2000, 1)  # even rows sure, odd rows refused (5 sigma1)
    kw = dict(threshold=500, sigma1=100, sigma2=10)  # a check costs 1/200 of an answer
    labels, answered, asked, spent = M.filtered_confident_gnmax(votes, **kw, filter_budget=100, generator=gen(3))
    plain, plain_answered = M.confident_gnmax(votes, **kw, generator=gen(3))
    assert torch.equal(labels[:asked], plain[:asked]) and torch.equal(answered[:asked], plain_answered[:asked])
    assert bool((labels[asked:] == -1).all()) and not bool(answered[asked:].any())
    check, answer = ConfidentGaussianQueries(count=1, **kw).round_costs
    assert int(answered.sum()) in (99, 100)  # the budget buys 100 answers, or 99 and the refused checks
    assert asked == pytest.approx(200, abs=3) and asked > 100
    assert spent == pytest.approx(asked * check + int(answered.sum()) * answer)
    assert spent <= 100 * (check + answer) * (1 + 1e-9) < spent + check + answer  # within, and one more won't fit
    sure = votes[0::2]
    _, all_answered, asked_all, _ = M.filtered_confident_gnmax(sure, **kw, filter_budget=100, generator=gen(3))
    assert asked_all == 100 and bool(all_answered[:100].all())
    # chunk by chunk, carrying the cost spent: the same rows asked as in one call
    first = M.filtered_confident_gnmax(votes[:150], **kw, filter_budget=100, generator=gen(3))
    rest = M.filtered_confident_gnmax(votes[150:], **kw, filter_budget=100, generator=gen(4), spent=first[3])
    assert first[2] == 150 and first[2] + rest[2] in range(asked - 3, asked + 4)
    # every row refused: a row is asked only while its check AND a possible answer fit (the rule reads the earlier
    # rows' outcomes, never its own): (B - answer) / check rows, not B / check
    _, none, asked_refused, _ = M.filtered_confident_gnmax(votes[1::2], **kw, filter_budget=10, generator=gen(3))
    assert not bool(none.any()) and asked_refused == round((10 * (check + answer) - answer) / check) == 1810


# ------------------------------------------------------------------------------ randomized response
def test_randomized_response_frequencies():
    k, e, y = 5, 1.0, 2
    labels = torch.full((50000,), y)
    out = M.randomized_response(labels, num_classes=k, epsilon=e, generator=gen(6))
    probs = np.full(k, 1 / (math.exp(e) + k - 1))
    probs[y] = math.exp(e) / (math.exp(e) + k - 1)
    assert chisq(counts(out, k), probs) > P_MIN


def test_randomized_response_large_epsilon_keeps_label():
    labels = torch.randint(0, 10, (1000,), generator=gen(7))
    out = M.randomized_response(labels, num_classes=10, epsilon=50.0, generator=gen(8))
    assert torch.equal(out, labels)


def _srr(probs_row, y, n=40000, eps=1.0, seed=9, threshold=None):
    sp = torch.tensor(probs_row, dtype=torch.float64).repeat(n, 1)
    return M.selective_randomized_response(sp, torch.full((n,), y), epsilon=eps, threshold=threshold,
                                           generator=gen(seed))


def test_srr_teacher_label_in_selected_set():
    # K = 5, t = 1/10: I = {0, 1, 3} (k = 3); teacher label 1 in I
    out = _srr([0.4, 0.3, 0.05, 0.2, 0.05], y=1)
    z = math.exp(1.0) + 2
    c = counts(out, 5)
    assert c[2] == 0 and c[4] == 0
    assert chisq(c[[0, 1, 3]], np.array([1 / z, math.e / z, 1 / z])) > P_MIN


def test_srr_teacher_label_outside_selected_set_is_uniform_over_it():
    out = _srr([0.4, 0.3, 0.05, 0.2, 0.05], y=4, seed=10)
    c = counts(out, 5)
    assert c[2] == 0 and c[4] == 0
    assert chisq(c[[0, 1, 3]], np.full(3, 1 / 3)) > P_MIN


def test_srr_small_set_falls_back_to_top_two():
    # only class 0 above t = 1/10: I = top two = {0, 2}
    probs = [0.85, 0.05, 0.06, 0.04]
    out = _srr(probs, y=2, seed=11, threshold=0.1)
    c = counts(out, 4)
    assert c[1] == 0 and c[3] == 0
    z = math.e + 1
    assert chisq(c[[0, 2]], np.array([1 / z, math.e / z])) > P_MIN
    out = _srr(probs, y=3, seed=12, threshold=0.1)  # teacher label not in the top two: uniform
    c = counts(out, 4)
    assert c[1] == 0 and c[3] == 0 and chisq(c[[0, 2]], np.array([0.5, 0.5])) > P_MIN


def test_srr_default_threshold_is_one_over_2k():
    # K = 4: t = 1/8 = 0.125; 0.12 is below, 0.13 above
    out = _srr([0.5, 0.13, 0.12, 0.25], y=2, n=5000, seed=13)
    assert set(counts(out, 4).nonzero()[0]) == {0, 1, 3}


def test_srr_accepts_teacher_outputs_and_mixed_rows():
    sp = torch.tensor([[0.5, 0.4, 0.1], [0.1, 0.1, 0.8]])
    teacher = torch.tensor([[0.1, 0.9, 0.0], [0.2, 0.7, 0.1]])
    out = M.selective_randomized_response(sp, teacher, epsilon=30.0, generator=gen(14))
    assert out.tolist()[0] == 1  # teacher's argmax 1 is in I = {0, 1}, kept at eps = 30
    assert out.tolist()[1] in (0, 1, 2)


# ------------------------------------------------------------------------------------------ DPDFD
def test_normalize_and_noise_deterministic_part_and_noise_scale():
    g = torch.randn(64, 10, generator=gen(15), dtype=torch.float64) * 5
    C, B = 1e-3, 64
    tiny = M.normalize_and_noise(g, clip_norm=C, sigma=1e-12, generator=gen(16))
    expected = C * g / (g.norm(dim=1, keepdim=True) + 1e-4) / B
    assert torch.allclose(tiny, expected, atol=1e-15)
    assert bool(((tiny * B).norm(dim=1) < C).all())
    zeros = torch.zeros(4096, 10, dtype=torch.float64)
    noise = M.normalize_and_noise(zeros, clip_norm=C, sigma=100.0, generator=gen(17)) * 4096
    assert stats.kstest(noise.flatten().numpy(), stats.norm(scale=100 * C).cdf).pvalue > P_MIN


def test_normalize_and_noise_batch_sum_is_literal_eq4():
    g = torch.randn(32, 10, generator=gen(18), dtype=torch.float64)
    out = M.normalize_and_noise(g, clip_norm=1.0, sigma=1e-12, granularity="batch_sum", generator=gen(19))
    assert out.shape == (10,)
    assert torch.allclose(out, (g / (g.norm(dim=1, keepdim=True) + 1e-4)).sum(0) / 32, atol=1e-12)
    zeros = torch.zeros(3, 10, dtype=torch.float64)
    draws = torch.stack([M.normalize_and_noise(zeros, clip_norm=2.0, sigma=5.0, granularity="batch_sum",
                                               generator=gen(20 + i)) for i in range(400)]) * 3
    assert stats.kstest(draws.flatten().numpy(), stats.norm(scale=10.0).cdf).pvalue > P_MIN


def test_normalize_and_noise_multi():
    g = torch.randn(5, 16, 10, generator=gen(30), dtype=torch.float64)
    out = M.normalize_and_noise_multi(g, clip_norm=1.0, sigma=1e-12, generator=gen(31))
    assert out.shape == (16, 10)
    assert torch.allclose(out, (g / (g.norm(dim=2, keepdim=True) + 1e-4)).sum(0) / 5, atol=1e-12)
    mean = M.normalize_and_noise_multi(g, clip_norm=1.0, sigma=1e-12, batch_mean=True, generator=gen(31))
    assert torch.allclose(mean, out / 16, atol=1e-12)
    bs = M.normalize_and_noise_multi(g, clip_norm=1.0, sigma=1e-12, granularity="batch_sum", generator=gen(32))
    assert bs.shape == (10,) and torch.allclose(bs, out.sum(0), atol=1e-12)
    zeros = torch.zeros(4, 2048, 10, dtype=torch.float64)
    noise = M.normalize_and_noise_multi(zeros, clip_norm=0.5, sigma=8.0, generator=gen(33)) * 4
    assert stats.kstest(noise.flatten().numpy(), stats.norm(scale=4.0).cdf).pvalue > P_MIN


# -------------------------------------------------------------------------------------------- DGD
def test_latent_perturbation_clamps_and_scale():
    codes = torch.randn(2000, 32, generator=gen(40), dtype=torch.float64) * 3
    out = M.laplace_latent_perturbation(codes, clip=1.0, epsilon1=10.0, generator=gen(41))
    noise = (out - codes.clamp(-1, 1)).flatten().numpy()
    assert stats.kstest(noise, stats.laplace(scale=2 * 32 / 10.0).cdf).pvalue > P_MIN


# --------------------------------------------------------------------------- generators, devices
def test_same_seed_same_noise_independent_of_global_state():
    votes = torch.randint(0, 50, (100, 10))
    torch.manual_seed(123)
    a = M.lnmax(votes, scale=40, generator=gen(7))
    torch.manual_seed(456)
    torch.rand(10)
    b = M.lnmax(votes, scale=40, generator=gen(7))
    assert torch.equal(a, b)
    assert not torch.equal(a, M.lnmax(votes, scale=40, generator=gen(8)))


def test_generator_seeds():
    assert isinstance(M.noise_source(3, secure=True), M.SecureNoise)  # the seed plays no part in secure noise
    assert M.noise_source(3).initial_seed() == 3
    with pytest.raises(PrivacyError, match="seed"):
        M.make_generator()
    with pytest.raises(PrivacyError, match="seed"):
        M.make_generator(-1)
    with pytest.raises(PrivacyError, match=r"\[0, 2\*\*64\)"):  # torch's own error would be a bare ValueError
        M.make_generator(2**64)
    assert M.make_generator(2**64 - 1).initial_seed() == 2**64 - 1


@CUDA
def test_mechanisms_on_cuda():
    dev = torch.device("cuda")
    g = M.make_generator(0, device=dev)
    votes = torch.randint(0, 50, (256, 10), device=dev)
    assert M.lnmax(votes, scale=40, generator=g).device.type == "cuda"
    assert M.gnmax(votes, sigma=40, generator=g).device.type == "cuda"
    lab, ans = M.confident_gnmax(votes, threshold=30, sigma1=5, sigma2=5, generator=g)
    assert lab.device.type == ans.device.type == "cuda"
    labels = torch.randint(0, 10, (256,), device=dev)
    assert M.randomized_response(labels, num_classes=10, epsilon=1, generator=g).device.type == "cuda"
    sp = torch.softmax(torch.randn(256, 10, device=dev), 1)
    assert M.selective_randomized_response(sp, labels, epsilon=1, generator=g).device.type == "cuda"
    grads = torch.randn(256, 10, device=dev)
    assert M.normalize_and_noise(grads, clip_norm=1e-3, sigma=100, generator=g).shape == (256, 10)
    assert M.normalize_and_noise_multi(grads[None].repeat(3, 1, 1), clip_norm=1e-3, sigma=100,
                                       generator=g).shape == (256, 10)
    assert M.laplace_latent_perturbation(grads, epsilon1=0.01, generator=g).device.type == "cuda"
    with pytest.raises(PrivacyError, match="generator is on"):
        M.lnmax(votes, scale=40, generator=gen(0))
    # the same statistics as on CPU: two-class LNMax tail
    v = torch.tensor([[30, 20]], device=dev).repeat(40000, 1)
    out = M.lnmax(v, scale=5.0, generator=M.make_generator(3, device=dev))
    p1 = (2 + 2) / 4 * math.exp(-2)
    assert chisq(counts(out, 2), np.array([1 - p1, p1])) > P_MIN


# ------------------------------------------------------------------------------------- bad input
class TestBadInput:
    def test_empty_or_malformed_votes(self):
        g = gen()
        for votes in (torch.zeros(0, 10), torch.zeros(5, 0), torch.zeros(10), torch.zeros(2, 3, 4),
                      torch.zeros(4, 1)):
            with pytest.raises(PrivacyError, match="votes"):
                M.lnmax(votes, scale=40, generator=g)
        with pytest.raises(PrivacyError, match="negative"):
            M.gnmax(torch.tensor([[1, -1]]), sigma=1, generator=g)
        with pytest.raises(PrivacyError, match="NaN"):
            M.gnmax(torch.tensor([[1.0, float("nan")]]), sigma=1, generator=g)
        with pytest.raises(PrivacyError, match="torch tensor"):
            M.lnmax([[1, 2]], scale=1, generator=g)

    @pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
    def test_nonpositive_noise(self, bad):
        g, votes = gen(), torch.ones(2, 3)
        with pytest.raises(PrivacyError):
            M.lnmax(votes, scale=bad, generator=g)
        with pytest.raises(PrivacyError):
            M.gnmax(votes, sigma=bad, generator=g)
        with pytest.raises(PrivacyError):
            M.confident_gnmax(votes, threshold=1, sigma1=bad, sigma2=1, generator=g)
        with pytest.raises(PrivacyError):
            M.normalize_and_noise(torch.ones(2, 3), clip_norm=1, sigma=bad, generator=g)
        with pytest.raises(PrivacyError):
            M.normalize_and_noise(torch.ones(2, 3), clip_norm=bad, sigma=1, generator=g)
        with pytest.raises(PrivacyError):
            M.randomized_response(torch.tensor([0, 1]), num_classes=2, epsilon=bad, generator=g)
        with pytest.raises(PrivacyError):
            M.laplace_latent_perturbation(torch.ones(2, 3), epsilon1=bad, generator=g)

    def test_mismatched_labels(self):
        g = gen()
        with pytest.raises(PrivacyError, match="teacher labels"):
            M.selective_randomized_response(torch.rand(5, 3), torch.tensor([0, 1]), epsilon=1, generator=g)
        with pytest.raises(PrivacyError, match="do not match"):
            M.selective_randomized_response(torch.rand(5, 3), torch.rand(5, 4), epsilon=1, generator=g)
        with pytest.raises(PrivacyError, match=r"\[0, 3\)"):
            M.selective_randomized_response(torch.rand(2, 3), torch.tensor([0, 3]), epsilon=1, generator=g)
        with pytest.raises(PrivacyError, match="labels"):
            M.randomized_response(torch.tensor([0, 5]), num_classes=3, epsilon=1, generator=g)
        with pytest.raises(PrivacyError, match="num_classes"):
            M.randomized_response(torch.tensor([0]), num_classes=1, epsilon=1, generator=g)
        with pytest.raises(PrivacyError, match="granularity"):
            M.normalize_and_noise(torch.ones(2, 3), clip_norm=1, sigma=1, granularity="x", generator=g)
        with pytest.raises(PrivacyError, match=r"\[n, B, K\]"):
            M.normalize_and_noise_multi(torch.ones(2, 3), clip_norm=1, sigma=1, generator=g)
        with pytest.raises(PrivacyError, match="generator"):
            M.lnmax(torch.ones(2, 3), scale=1, generator=None)
