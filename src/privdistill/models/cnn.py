"""The papers' small CNN (DGD Sec. IV, used by DPDFD and SRR for MNIST/Fashion-MNIST too).

conv3x3(64) -> ReLU -> maxpool2 -> conv3x3(128) -> ReLU -> maxpool2 -> [FC 384 -> FC 192 (SVHN)] -> linear K,
stride 1, padding 1, Xavier initialisation. `features(x)` is the backbone output before the last linear layer.
"""

from __future__ import annotations

import torch
from torch import nn

from privdistill.models.registry import register_model


class PaperCNN(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int | tuple[int, int] = 28,
                 widths: tuple[int, int] = (64, 128), hidden: tuple[int, ...] = (), batchnorm: bool = False):
        super().__init__()
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size

        def block(cin: int, cout: int) -> list[nn.Module]:
            norm = [nn.BatchNorm2d(cout)] if batchnorm else []
            return [nn.Conv2d(cin, cout, 3, stride=1, padding=1), *norm, nn.ReLU(inplace=True), nn.MaxPool2d(2)]

        self.conv = nn.Sequential(*block(in_channels, widths[0]), *block(widths[0], widths[1]), nn.Flatten())
        dim = widths[1] * (h // 4) * (w // 4)
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(dim, width), nn.ReLU(inplace=True)]
            dim = width
        self.hidden = nn.Sequential(*layers)
        self.classifier = nn.Linear(dim, num_classes)
        self.feature_dim = dim
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.hidden(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register_model("paper-cnn", kind="classifier", description="DGD/DPDFD MNIST CNN: conv64-pool-conv128-pool-linear")
def paper_cnn(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> PaperCNN:
    return PaperCNN(in_channels, num_classes, image_size)


@register_model("paper-cnn-svhn", kind="classifier", description="the paper CNN with FC 384 and 192 (SVHN)")
def paper_cnn_svhn(in_channels: int = 3, num_classes: int = 10, image_size: int = 32) -> PaperCNN:
    return PaperCNN(in_channels, num_classes, image_size, hidden=(384, 192))


@register_model("paper-cnn-bn", kind="classifier",
                description="the paper CNN with BatchNorm after each convolution (for BN-statistics generator losses)")
def paper_cnn_bn(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> PaperCNN:
    return PaperCNN(in_channels, num_classes, image_size, batchnorm=True)


@register_model("small-cnn", kind="classifier",
                description="the paper CNN at quarter width (16/32): for CPU-scale teacher ensembles")
def small_cnn(in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> PaperCNN:
    return PaperCNN(in_channels, num_classes, image_size, widths=(16, 32))
