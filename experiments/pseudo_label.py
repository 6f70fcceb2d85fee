"""Confident pseudo-labels under two views (FixMatch: Sohn et al., NeurIPS 2020), for a student that holds far
more unlabelled inputs than labelled ones.

Kept as the evidence of a measured negative, out of the package: DGD's student with these pseudo-labels on the
unqueried samples instead of Eq. 1's energies (`student.objective=pseudo-label`, removed since) reached 61-73 %
on MNIST against 79.93 % for the Eq. 1 student on the same stages and votes (docs/research-log.md, "A student that
labels the unqueried samples itself"; the three runs' result files record the commit that ran them). Checked by
`.venv/bin/python -m pytest experiments/check_pseudo_label.py -q -n 0` (not part of the default test run).

For each unlabelled input the student's answer on a weakly augmented view (a shift of up to 2 pixels; with a
flip where the data allow one) is its own label for the input, kept only where the student is at least
`threshold` sure; the student then learns that label on a strongly augmented view (a larger affine
deformation and a cut-out square). Unlike minimising the entropy on every input (DGD's Eq. 6 term), an input
the student is unsure about teaches nothing, so early mistakes are not made confident.

Privacy: the loss reads the student and the unlabelled inputs only. Where those inputs are a generator's samples
(DGD), they sit on the generator's pathway, which the method's report already names: no ε is spent here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.engine.augment import augment_batch, random_affine

# Our reading of FixMatch's RandAugment + Cutout for 28x28 grey images: RandAugment's colour operations change
# little on a binary-looking digit, so the strong view is a larger deformation than the weak one plus Cutout
# (a square of half the side, FixMatch's largest, filled with the background).
STRONG_DEGREES, STRONG_SCALE, STRONG_SHIFT = 20.0, 0.2, 3


def cutout(x: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """Each image with one `size` x `size` square (centre uniform over the image, clipped at the border) set
    to the background value (-1)."""
    b, _, h, w = x.shape
    cy = torch.randint(0, h, (b,), generator=generator).to(x.device)
    cx = torch.randint(0, w, (b,), generator=generator).to(x.device)
    rows = torch.arange(h, device=x.device)[None, :, None]
    cols = torch.arange(w, device=x.device)[None, None, :]
    inside = ((rows - cy[:, None, None]).abs() <= size // 2) & ((cols - cx[:, None, None]).abs() <= size // 2)
    return torch.where(inside[:, None], torch.full_like(x, -1.0), x)


def strong_view(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    moved = random_affine(x, generator, degrees=STRONG_DEGREES, scale=STRONG_SCALE, max_shift=STRONG_SHIFT)
    return cutout(moved, x.shape[-1] // 2, generator)


def pseudo_label_loss(student: nn.Module, x: torch.Tensor, *, threshold: float, weak: str,
                      generator: torch.Generator, strong: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean over the batch of 1[max p(weak view) >= threshold] * CE(student(strong view), argmax p(weak view)).
    `x` is a float batch in [-1, 1] on the student's device; `weak` an `augment_batch` kind ("shift",
    "flip-shift", "none"); `strong=False` learns the label on the weak view itself (plain pseudo-labelling, Lee
    2013). Returns the loss and its parts: the loss and the share of the batch above the threshold."""
    weak_x = augment_batch(x, weak, generator)
    with torch.no_grad():
        probs = F.softmax(student(weak_x).float(), dim=1)
        confidence, labels = probs.max(dim=1)
        keep = (confidence >= threshold).float()
    per_input = F.cross_entropy(student(strong_view(x, generator) if strong else weak_x).float(), labels,
                                reduction="none")
    loss = (per_input * keep).mean()
    return loss, {"pseudo_label": float(loss.detach()), "confident_share": float(keep.mean())}
