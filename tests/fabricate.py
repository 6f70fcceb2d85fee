"""Tiny datasets in the real on-disk formats (IDX .gz, CIFAR pickles, SVHN .mat, ImageFolder, .npz).

Images are class-dependent patterns (a bright block whose position encodes the class, plus noise), so a
small network can learn them in seconds: tests can assert that training really works.
"""

from __future__ import annotations

import gzip
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np


def pattern_images(n: int, num_classes: int = 10, size: int = 28, channels: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n)
    images = rng.integers(0, 60, (n, channels, size, size)).astype(np.uint8)
    cell = size // 4
    for i, k in enumerate(labels):
        r, c = divmod(int(k) % 16, 4)
        images[i, :, r * cell:(r + 1) * cell, c * cell:(c + 1) * cell] = 230
    return images, labels.astype(np.int64)


def idx_bytes(array: np.ndarray) -> bytes:
    """Serialise a uint8 array in the IDX format (magic 0x0000 08 <ndim>, big-endian dims)."""
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


IDX_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def write_idx_gz(directory: Path, n_train: int = 200, n_test: int = 100, seed: int = 0) -> dict[str, bytes]:
    """The four MNIST-style .gz files; returns their uncompressed contents by name."""
    directory.mkdir(parents=True, exist_ok=True)
    xtr, ytr = pattern_images(n_train, seed=seed)
    xte, yte = pattern_images(n_test, seed=seed + 1)
    contents = dict(zip(IDX_NAMES, (idx_bytes(xtr[:, 0]), idx_bytes(ytr.astype(np.uint8)),
                                    idx_bytes(xte[:, 0]), idx_bytes(yte.astype(np.uint8)))))
    for name, data in contents.items():
        (directory / f"{name}.gz").write_bytes(gzip.compress(data))
    return contents


def spec_with_hashes(spec, contents: dict[str, bytes]):
    """A copy of a DatasetSpec whose content hashes match fabricated files."""
    from dataclasses import replace

    from privdistill.data.catalog import RawFile

    files = tuple(RawFile(name, hashlib.sha256(data).hexdigest(), len(data)) for name, data in contents.items())
    return replace(spec, raw_files=files, system_sources=())


def write_cifar10(root: Path, per_batch: int = 20, n_test: int = 20) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]):
        n = n_test if name == "test_batch" else per_batch
        x, y = pattern_images(n, size=32, channels=3, seed=10 + i)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": x.reshape(n, -1), "labels": y.tolist(), "batch_label": name}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                     "ship", "truck"]}, f)


def write_svhn(root: Path, n_train: int = 40, n_test: int = 20) -> None:
    from scipy.io import savemat

    root.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train_32x32.mat", n_train, 20), ("test_32x32.mat", n_test, 21)):
        x, y = pattern_images(n, size=32, channels=3, seed=seed)
        y_mat = np.where(y == 0, 10, y).reshape(-1, 1)  # SVHN stores digit 0 as label 10
        savemat(root / name, {"X": x.transpose(2, 3, 1, 0), "y": y_mat.astype(np.uint8)})


def write_image_folder(root: Path, n_per_class: int = 4, num_classes: int = 3, size: int = 20, mode: str = "L") -> None:
    from PIL import Image

    channels = 1 if mode == "L" else 3
    for k in range(num_classes):
        d = root / f"class_{k}"
        d.mkdir(parents=True, exist_ok=True)
        x, _ = pattern_images(n_per_class, size=size, channels=channels, seed=30 + k)
        for i in range(n_per_class):
            arr = x[i, 0] if mode == "L" else x[i].transpose(1, 2, 0)
            Image.fromarray(arr, mode=mode).save(d / f"{i}.png")


def write_npz(path: Path, n: int = 300, num_classes: int = 10, size: int = 28, channels: int = 1, seed: int = 0,
              with_test: bool = True) -> Path:
    x, y = pattern_images(n, num_classes, size, channels, seed)
    arrays = {"x": x if channels > 1 else x[:, 0], "y": y}
    if with_test:
        xt, yt = pattern_images(n // 3, num_classes, size, channels, seed + 100)
        arrays.update(x_test=xt if channels > 1 else xt[:, 0], y_test=yt)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path
