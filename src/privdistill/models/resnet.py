"""ResNet-18/34 for small images (28x28, 32x32): torchvision's networks with the CIFAR-style stem
(3x3 stride-1 first convolution, no max-pool), so that 28/32-pixel inputs keep enough resolution."""

from __future__ import annotations

import torch
from torch import nn

from privdistill.models.registry import register_model


class SmallImageResNet(nn.Module):
    def __init__(self, name: str, in_channels: int, num_classes: int):
        super().__init__()
        # imported here: torchvision.models pulls in torch._dynamo (about 2 s), which no other model needs
        import torchvision.models

        net = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
        self.feature_dim = net.fc.in_features
        self.classifier = net.fc
        net.fc = nn.Identity()
        self.backbone = net

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@register_model("resnet18", kind="classifier", description="ResNet-18, CIFAR-style stem, any channels/classes")
def resnet18(in_channels: int = 3, num_classes: int = 10, image_size: int = 32) -> SmallImageResNet:
    return SmallImageResNet("resnet18", in_channels, num_classes)


@register_model("resnet34", kind="classifier", description="ResNet-34, CIFAR-style stem (SRR's teacher)")
def resnet34(in_channels: int = 3, num_classes: int = 10, image_size: int = 32) -> SmallImageResNet:
    return SmallImageResNet("resnet34", in_channels, num_classes)
