"""DPDFD's losses: the distillation loss L_T and its per-sample gradients with respect to the student's logits,
the student's L_S and the generator's L_G (Eq. 5).

L_T is "the distillation loss ... same as [Zhao et al., 2022]": decoupled knowledge distillation (DKD) with the
teacher's argmax as the target, p = softmax(logits / T):

    DKD = alpha * TCKD + beta * NCKD, both multiplied by T^2
    TCKD = KL(b_t || b_s),  b = [p_target, 1 - p_target]           (target vs. all non-target classes)
    NCKD = KL(p~_t || p~_s), p~ = softmax over the non-target logits  (how the rest is distributed)

Losses are per sample (A_{C,sigma} normalises and averages); the per-sample gradients are ``vmap(grad(...))``
(tested equal to autograd of the batch sum); multi-teacher gradients are [n, B, K].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.func import grad, vmap


def _dkd_one(s: torch.Tensor, t: torch.Tensor, temperature: float, alpha: float, beta: float) -> torch.Tensor:
    """DKD loss of ONE sample: s, t are [K] logits; the target is argmax(t)."""
    k = s.shape[-1]
    gt = (torch.arange(k, device=s.device) == t.argmax(-1)).to(s.dtype)  # one-hot target, vmap-safe
    ps = torch.softmax(s / temperature, -1)
    pt = torch.softmax(t / temperature, -1)
    eps = 1e-12
    # TCKD: binary (target, rest) distributions
    bs_t = (ps * gt).sum(-1)
    bt_t = (pt * gt).sum(-1)
    bs = torch.stack([bs_t, 1.0 - bs_t]).clamp_min(eps)
    bt = torch.stack([bt_t, 1.0 - bt_t]).clamp_min(eps)
    tckd = (bt * (bt.log() - bs.log())).sum()
    # NCKD: distribution over the non-target classes (mask the target logit out, as DKD's code does)
    log_ps_nt = torch.log_softmax(s / temperature - 1000.0 * gt, -1)
    pt_nt = torch.softmax(t / temperature - 1000.0 * gt, -1)
    nckd = (pt_nt * (torch.log(pt_nt.clamp_min(eps)) - log_ps_nt)).sum()
    return (alpha * tckd + beta * nckd) * temperature**2


def logit_gradients(student_logits: torch.Tensor, teacher_logits: torch.Tensor, *, temperature: float = 4.0,
                    alpha: float = 1.0, beta: float = 8.0) -> torch.Tensor:
    """Per-sample gradients g_i = dL_T(t_i, s_i)/ds_i of the DKD loss, shape of ``teacher_logits`` ([B, K] or
    [n, B, K]).

    Everything is detached: the result is a plain tensor, the input of A_{C,sigma}."""
    s = student_logits.detach().float()
    t = teacher_logits.detach().float()
    k = s.shape[-1]
    s_full = s.expand_as(t).reshape(-1, k)
    per_sample = vmap(grad(_dkd_one), in_dims=(0, 0, None, None, None))
    return per_sample(s_full, t.reshape(-1, k), temperature, alpha, beta).view(t.shape).contiguous()


# ----------------------------------------------------------------------------------- L_S and L_G
def student_loss(logits: torch.Tensor, anchor: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """L_S(s, y_s) with y_s = anchor - step (anchor: the detached logits s of the step's first forward pass,
    step: gamma * g~), summed over the batch.

    1/2 ||s - y_s||^2 (the paper's choice is the soft cross-entropy), written as 1/2 ||(s - anchor) + step||^2 so
    that at s = anchor its gradient is exactly gamma * g~ (forming y_s first would round g~ against logits ~10^3
    times larger)."""
    return 0.5 * ((logits - anchor.detach()) + step.detach()).pow(2).sum()


def generator_loss(logits: torch.Tensor, feats: torch.Tensor, *, one_hot_weight: float, entropy_weight: float,
                   activation_weight: float, targets: torch.Tensor | None = None,
                   revive_absent: bool | None = None
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """L_G of Eq. 5 on the STUDENT's outputs: w_ce * CE(s, argmax s) + alpha * sum_k pbar_k log pbar_k
    - beta * RMS(features). As in engine.datafree ("dpdfd"), the activation term REWARDS high activation (the
    paper writes +beta||f||; its text and DAFL mean the opposite) and is divided by sqrt(d).

    `revive_absent`: True, CE's targets are the argmax but for the classes it leaves out of the batch
    (`absent_class_targets`; not the paper's: dpdfd.revive_classes_from); False, those classes are only counted
    (`lg_absent_classes`); None (the paper), neither."""
    logits, feats = logits.float(), feats.float()
    revived = {}
    if targets is None:
        targets = logits.argmax(1)
        if revive_absent is not None:
            revived_targets, absent = absent_class_targets(logits.detach(), targets)
            targets = revived_targets if revive_absent else targets
            revived = {"lg_absent_classes": float(absent)}
    one_hot = F.cross_entropy(logits, targets)
    mean_p = torch.softmax(logits, 1).mean(0)
    neg_entropy = (mean_p * torch.log(mean_p + 1e-12)).sum()
    activation = -(feats.norm(dim=1) / math.sqrt(feats.shape[1])).mean()
    loss = one_hot_weight * one_hot + entropy_weight * neg_entropy + activation_weight * activation
    return loss, {"lg_one_hot": float(one_hot.detach()), "lg_entropy": float(-neg_entropy.detach()),
                  "lg_activation": float(activation.detach()), **revived}


def absent_class_targets(logits: torch.Tensor, argmax: torch.Tensor) -> tuple[torch.Tensor, int]:
    """L_G's CE targets when the student's argmax leaves classes out of the batch: each absent class takes the
    batch's fair share (B // K) of the samples the student rates most likely to be it, the rest keep their argmax;
    also the number of absent classes.

    Why: the information-entropy term cannot bring such a class back. Its gradient on the class's logit is
    about -p log p, which vanishes as the student's probability p of that class does, so the generator stops
    making the class, and the student never again sees a sample the teachers would call one (DPDFD MNIST ε 10
    lost the ones so in two of four full runs; docs/research-log.md, "DPDFD's missed class"). CE towards the class
    has gradient p - 1 on its logit instead. Only absent classes are aimed at, and only a fair share of the
    batch: aiming every sample at a class drawn for it (a conditional generator) sends the student to chance."""
    batch, classes = logits.shape
    absent = (torch.bincount(argmax, minlength=classes) == 0).nonzero().flatten().tolist()
    if not absent:
        return argmax, 0
    targets = argmax.clone()
    log_p = torch.log_softmax(logits, 1)
    share = max(1, batch // classes)
    for k in absent:  # a sample in two absent classes' shares goes to the later one (the earlier falls short)
        targets[log_p[:, k].topk(share).indices] = k
    return targets, len(absent)
