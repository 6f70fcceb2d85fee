"""Datasets: built-in (MNIST, Fashion-MNIST, CIFAR-10, SVHN), a user's own (.npz, ImageFolder), partitions.

`load_data("mnist")`, `load_data("npz:/path/private.npz")`, `load_data("folder:/path/images")` all return
:class:`DataSplits` with in-memory :class:`ImageDataset` train and test splits.
"""

from __future__ import annotations

import os

from privdistill.data.builtin import default_data_root, get_spec, load_builtin, prepare, resolve_data_root, status
from privdistill.data.catalog import BUILTIN, canonical_name
from privdistill.data.custom import ARRAYS_PREFIX, load_arrays, load_image_folder, load_npz
from privdistill.data.dataset import DataSplits, ImageDataset, to_float, to_uint8
from privdistill.data.partition import missing_classes, partition_indices

__all__ = [
    "BUILTIN", "DataSplits", "dataset_slug", "ImageDataset", "canonical_name", "default_data_root", "get_spec",
    "load_data", "load_image_folder", "load_npz", "missing_classes", "partition_indices", "prepare",
    "resolve_data_root", "status", "to_float", "to_uint8",
]


def dataset_slug(name: str) -> str:
    """A file-name-safe short name: 'mnist', 'npz:/a/b/tiny.npz' -> 'npz-tiny', 'folder:/x/faces' -> 'folder-faces'."""
    if ":" in name:
        kind, path = name.split(":", 1)
        stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
        name = f"{kind}-{stem}"
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in canonical_name(name))[:60]


def load_data(name: str, data_root: str | os.PathLike | None = None, *, verify: bool = True, seed: int = 0,
              test_fraction: float = 0.1, image_size: int | None = None) -> DataSplits:
    """Load a dataset by name: a built-in name, 'npz:PATH', 'folder:DIR' or 'arrays:NAME' (arrays passed to fit)."""
    if name.startswith("npz:"):
        return load_npz(name[4:], test_fraction=test_fraction, seed=seed)
    if name.startswith(ARRAYS_PREFIX):  # arrays passed to fit, in this process's memory (data.custom.as_dataset_spec)
        return load_arrays(name, test_fraction=test_fraction, seed=seed)
    if name.startswith("folder:"):
        return load_image_folder(name[7:], image_size=image_size, test_fraction=test_fraction, seed=seed)
    if name.endswith(".npz") and os.path.isfile(name):
        return load_npz(name, test_fraction=test_fraction, seed=seed)
    return load_builtin(name, data_root, verify=verify)
