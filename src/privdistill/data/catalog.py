"""What we know about each built-in dataset: on-disk layout, shape, and how to get it.

The on-disk layouts are torchvision's (``<root>/MNIST/raw/...``, ``<root>/cifar-10-batches-py/...``,
``<root>/train_32x32.mat``), so a data root prepared by torchvision works here and vice versa.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RawFile:
    """One file of an IDX dataset, identified by the SHA-256 of its *decompressed* content.

    We hash the content, not the .gz: Debian's ``dataset-fashion-mnist`` re-compresses the upstream
    files (other gzip headers, identical content), so the upstream .gz md5 cannot verify it.
    """

    name: str  # uncompressed file name, as torchvision expects it in <folder>/raw/
    sha256: str
    size: int


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    folder: str  # torchvision's folder under the data root ("" for SVHN, whose files sit at the root)
    channels: int
    image_size: int
    num_classes: int
    classes: tuple[str, ...]
    train_size: int
    test_size: int
    how_to_get: str
    raw_files: tuple[RawFile, ...] = field(default_factory=tuple)
    system_sources: tuple[str, ...] = field(default_factory=tuple)  # directories searched for .gz files


_DIGITS = tuple(str(d) for d in range(10))
_IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_IDX_SIZES = (47040016, 60008, 7840016, 10008)  # the four files of a 28x28 60k/10k IDX dataset


def _idx_files(*sha256: str) -> tuple[RawFile, ...]:
    """The four files of a 28x28 IDX dataset (MNIST's layout), given their content hashes in that order."""
    return tuple(RawFile(name, digest, size) for name, digest, size in zip(_IDX_NAMES, sha256, _IDX_SIZES))

# Content hashes computed from MNIST files whose .gz md5 matched torchvision's published list, and from
# Debian's dataset-fashion-mnist 0.0~git20200523 (same content as upstream).
MNIST = DatasetSpec(
    name="mnist", folder="MNIST", channels=1, image_size=28, num_classes=10, classes=_DIGITS,
    train_size=60000, test_size=10000,
    how_to_get="Run `privdistill data prepare mnist --from DIR` with DIR holding the four official .gz files "
               "(train-images-idx3-ubyte.gz, ...), or `privdistill data prepare mnist` on a machine with internet "
               "access (downloads through torchvision).",
    raw_files=_idx_files("ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
                         "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
                         "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
                         "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"),
    system_sources=("/usr/share/datasets/mnist",),
)

FASHION_MNIST = DatasetSpec(
    name="fashion-mnist", folder="FashionMNIST", channels=1, image_size=28, num_classes=10,
    classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
    train_size=60000, test_size=10000,
    how_to_get="On Debian/Ubuntu: `sudo apt-get install dataset-fashion-mnist` (files land in "
               "/usr/share/datasets/fashion-mnist/ and are found automatically), or "
               "`privdistill data prepare fashion-mnist --from DIR`, or with internet access "
               "`privdistill data prepare fashion-mnist`.",
    raw_files=_idx_files("c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
                         "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
                         "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
                         "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
    system_sources=("/usr/share/datasets/fashion-mnist",),
)

CIFAR10 = DatasetSpec(
    name="cifar10", folder="cifar-10-batches-py", channels=3, image_size=32, num_classes=10,
    classes=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
    train_size=50000, test_size=10000,
    how_to_get="Extract cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) into the data root so "
               "that <root>/cifar-10-batches-py/ exists, or run `privdistill data prepare cifar10` with internet "
               "access.",
)

SVHN = DatasetSpec(
    name="svhn", folder="", channels=3, image_size=32, num_classes=10, classes=_DIGITS,
    train_size=73257, test_size=26032,
    how_to_get="Put train_32x32.mat and test_32x32.mat (http://ufldl.stanford.edu/housenumbers/) in the data root, "
               "or run `privdistill data prepare svhn` with internet access.",
)

BUILTIN: dict[str, DatasetSpec] = {s.name: s for s in (MNIST, FASHION_MNIST, CIFAR10, SVHN)}

# Spellings users type for the same dataset.
ALIASES = {"fmnist": "fashion-mnist", "fashion_mnist": "fashion-mnist", "fashionmnist": "fashion-mnist",
           "cifar-10": "cifar10"}


def canonical_name(name: str) -> str:
    key = name.strip().lower()
    return ALIASES.get(key, key)
