"""The in-memory dataset every stage works on.

Images are kept as a uint8 tensor [N, C, H, W] (60k MNIST images are 47 MB): batches are gathered by
index and converted to float on the fly, which on a CPU is several times faster than a DataLoader over
PIL images. Pixel values are mapped to [-1, 1], the range of the generators' tanh output, so real and
synthetic images live in the same space.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import torch

from privdistill.errors import DataError


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [-1, 1]. Float input is returned unchanged (already in model space)."""
    if images.dtype == torch.uint8:
        return images.float().div_(127.5).sub_(1.0)
    return images


#: Class names of the built-in datasets, in label order (a release's model card and `Release.classes` use them).
CLASS_NAMES = {
    "fashion-mnist": ("T-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                      "ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
}


def known_class_names(dataset: str, num_classes: int) -> list[str]:
    """The classes of a built-in dataset by name; the label numbers for digits (MNIST, SVHN) and for data of
    one's own (npz:, folder:)."""
    names = CLASS_NAMES.get(dataset)
    return list(names) if names and len(names) == num_classes else [str(i) for i in range(num_classes)]


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """float [-1, 1] -> uint8, for saving synthetic images and plotting."""
    return ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


@dataclass
class ImageDataset:
    """Images [N, C, H, W] (uint8, or float already in [-1, 1]) and integer labels [N]."""

    images: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    name: str = "custom"
    classes: tuple[str, ...] = field(default_factory=tuple)
    source: str = ""

    def __post_init__(self) -> None:
        if self.images.ndim != 4:
            raise DataError(f"{self.name}: images must have shape [N, C, H, W], got {tuple(self.images.shape)}")
        if self.images.shape[1] not in (1, 3):
            raise DataError(f"{self.name}: images must have 1 or 3 channels, got {self.images.shape[1]}")
        if self.labels.ndim != 1 or len(self.labels) != len(self.images):
            raise DataError(f"{self.name}: {len(self.images)} images but labels of shape {tuple(self.labels.shape)}")
        if len(self.labels) and (int(self.labels.min()) < 0 or int(self.labels.max()) >= self.num_classes):
            raise DataError(f"{self.name}: labels must lie in [0, {self.num_classes - 1}], "
                            f"found [{int(self.labels.min())}, {int(self.labels.max())}]")
        self.labels = self.labels.long()
        if not self.classes:
            self.classes = tuple(str(k) for k in range(self.num_classes))

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def channels(self) -> int:
        return int(self.images.shape[1])

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.images.shape[2]), int(self.images.shape[3])

    def subset(self, indices: torch.Tensor, name: str | None = None) -> "ImageDataset":
        return replace(self, images=self.images[indices], labels=self.labels[indices], name=name or self.name)

    def class_counts(self) -> torch.Tensor:
        return torch.bincount(self.labels, minlength=self.num_classes)

    def batch(self, indices: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Float images in [-1, 1] and labels for the given indices, on `device`."""
        x = to_float(self.images[indices].to(device, non_blocking=True))
        return x, self.labels[indices].to(device, non_blocking=True)

    def fingerprint(self) -> str:
        """A short content hash: stages cached on this dataset are keyed by it."""
        h = hashlib.sha256()
        h.update(str((tuple(self.images.shape), str(self.images.dtype), self.num_classes)).encode())
        h.update(self.images.contiguous().numpy().tobytes())
        h.update(self.labels.numpy().tobytes())
        return h.hexdigest()[:16]


@dataclass
class DataSplits:
    train: ImageDataset
    test: ImageDataset
    # where the test split came from, in words (a summary and a model card state it with "test accuracy")
    test_from: str = ""
    # the pixel scale of the data as given, before it was mapped to uint8 0..255 (a model card states both)
    value_range: tuple[float, float] = (0.0, 255.0)
    # labels that skipped class numbers, renumbered 0..K-1: {label as given: class index} (None: as given)
    label_map: dict[int, int] | None = None

    @property
    def num_classes(self) -> int:
        return self.train.num_classes

    @property
    def channels(self) -> int:
        return self.train.channels

    @property
    def image_size(self) -> tuple[int, int]:
        return self.train.image_size
