"""FixMatch-style pseudo-labels (experiments/pseudo_label.py). Not collected by the default test run (the file
is not named test_*.py and lies outside tests/); run it by name:

    .venv/bin/python -m pytest experiments/check_pseudo_label.py -q -n 0
"""

import sys
from pathlib import Path

import torch
from torch import nn

from privdistill.models import create_model

sys.path.insert(0, str(Path(__file__).parent))
from pseudo_label import cutout, pseudo_label_loss, strong_view  # noqa: E402  (experiments/ is not a package)


class Fixed(nn.Module):
    """Answers class 3 with the given logit margin, whatever the input (its bias is the only parameter)."""

    def __init__(self, margin: float):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(10))
        with torch.no_grad():
            self.bias[3] = margin

    def forward(self, x):
        return self.bias.expand(len(x), 10) + 0 * x.flatten(1)[:, :1]


def test_cutout_blanks_one_square_of_the_requested_side_inside_the_image():
    x = torch.ones(64, 1, 28, 28)
    out = cutout(x, 14, torch.Generator().manual_seed(0))
    blank = (out == -1).flatten(1).sum(1)
    assert (blank > 0).all() and (blank <= 15 * 15).all(), "a clipped square of side 2 * 7 + 1 at most"
    assert (blank == 15 * 15).any(), "centred away from the border, the whole square"
    assert torch.equal(out[out != -1], x[out != -1]), "nothing else changes"


def test_the_strong_view_changes_every_image_and_keeps_the_range():
    x = torch.rand(16, 1, 28, 28) * 2 - 1
    out = strong_view(x, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.min() >= -1 - 1e-5 and out.max() <= 1 + 1e-5
    assert ((out - x).flatten(1).abs().amax(1) > 0).all()


def test_only_confident_answers_teach_and_they_teach_the_student_their_own_label():
    x = torch.rand(32, 1, 28, 28) * 2 - 1
    gen = torch.Generator().manual_seed(0)
    unsure = Fixed(margin=1.0)  # p(3) = e / (e + 9) ≈ 0.23 < 0.95: nothing is kept, the loss is exactly zero
    loss, parts = pseudo_label_loss(unsure, x, threshold=0.95, weak="shift", generator=gen)
    assert parts["confident_share"] == 0.0 and float(loss.detach()) == 0.0
    sure = Fixed(margin=5.0)  # p(3) ≈ 0.94: kept at a threshold of 0.9; the loss is CE towards class 3
    loss, parts = pseudo_label_loss(sure, x, threshold=0.9, weak="shift", generator=gen)
    assert parts["confident_share"] == 1.0
    assert torch.isclose(loss, -torch.log_softmax(sure.bias.detach(), 0)[3], atol=1e-5)
    loss.backward()
    assert sure.bias.grad[3] < 0, "a gradient step raises the pseudo-label's logit"


def test_pseudo_labelling_on_a_real_network_is_finite_and_decreases():
    torch.manual_seed(0)
    student = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28)
    x = torch.rand(64, 1, 28, 28) * 2 - 1
    opt = torch.optim.Adam(student.parameters(), 1e-2)
    losses = []
    for step in range(30):
        loss, _ = pseudo_label_loss(student, x, threshold=0.0, weak="flip-shift",
                                    generator=torch.Generator().manual_seed(step))
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert sum(losses[-5:]) < sum(losses[:5])


def test_without_the_strong_view_the_label_is_learnt_on_the_sample_itself():
    torch.manual_seed(0)
    student = create_model("small-cnn", in_channels=1, num_classes=10, image_size=28).eval()
    x = torch.rand(16, 1, 28, 28) * 2 - 1
    loss, parts = pseudo_label_loss(student, x, threshold=0.0, weak="none", strong=False,
                                    generator=torch.Generator().manual_seed(0))
    logits = student(x)
    expected = torch.nn.functional.cross_entropy(logits, logits.argmax(1))
    assert parts["confident_share"] == 1.0 and torch.isclose(loss, expected, atol=1e-5)
