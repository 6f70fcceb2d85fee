"""A user's own private data: a `.npz` file with arrays `x`, `y`, or an ImageFolder directory."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privdistill.data.dataset import DataSplits, ImageDataset
from privdistill.errors import DataError

NPZ_HELP = (
    "A .npz needs arrays 'x' (N x H x W or N x C x H x W, C in {1, 3}; uint8 0..255 or float 0..1) and 'y' "
    "(N integer labels 0..K-1); optional 'x_test', 'y_test', and 'value_range' ([lo, hi], for pixels on "
    "another scale; or write npz:PATH?range=LO,HI)."
)
# Pixels whose largest value is below this are not read as 0..255 without being told: 0..16 digits (sklearn's)
# would become nearly black images that every method trains to chance on, silently.
AMBIGUOUS_BELOW = 128


class PixelScaleError(DataError):
    """Pixel values whose scale is not read without being told. `finding` says what was seen, without the advice
    on how to state the scale, which depends on how the data came in (an npz file, or arrays passed to fit)."""

    def __init__(self, path: Path, finding: str, advice: str):
        super().__init__(f"{path}: {finding}{advice}")
        self.finding = finding


def _as_uint8_images(x: np.ndarray, path: Path, key: str,
                     value_range: tuple[float, float] | None = None) -> torch.Tensor:
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise DataError(f"{path}: array {key!r} has shape {x.shape}; expected N x H x W or N x C x H x W "
                        f"with C in {{1, 3}}. {NPZ_HELP}")
    if len(x) == 0:
        raise DataError(f"{path}: array {key!r} holds no images. {NPZ_HELP}")
    if x.dtype == np.uint8 and value_range is None:
        return torch.from_numpy(np.ascontiguousarray(x))
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{path}: array {key!r} has dtype {x.dtype}; expected numbers. {NPZ_HELP}")
    if not np.isfinite(x).all():
        raise DataError(f"{path}: array {key!r} holds NaN or infinite pixel values")
    lo, hi = float(np.min(x)), float(np.max(x))
    if value_range is not None:  # the user said what the scale is
        low, high = value_range
        if lo < low or hi > high:
            raise DataError(f"{path}: pixel values of {key!r} lie in [{lo:g}, {hi:g}], outside the stated range "
                            f"[{low:g}, {high:g}]")
        x = (x.astype(np.float64) - low) * (255.0 / (high - low))
    elif lo >= 0.0 and hi <= 1.0:
        x = x * 255.0
    elif lo < 0.0 or hi > 255.0:
        raise PixelScaleError(path, f"pixel values of {key!r} lie in [{lo:g}, {hi:g}]; expected [0, 1] or [0, 255]",
                              ", or state the scale: npz:PATH?range=LO,HI (or an array value_range in the file)")
    elif hi < AMBIGUOUS_BELOW:
        raise PixelScaleError(path, f"pixel values of {key!r} lie in [{lo:g}, {hi:g}]: is that scale 0..255 (dark "
                              f"images) or 0..{hi:g}?", f" State it: npz:PATH?range=0,{hi:g} (or an array value_range "
                              f"= [0, {hi:g}] in the file); 0..255 data is read without asking when stored as uint8")
    return torch.from_numpy(np.ascontiguousarray(np.rint(x).astype(np.uint8)))


def _value_range(spec: str | None, arrays, path: Path) -> tuple[float, float] | None:
    """The stated pixel scale: `?range=LO,HI` on the dataset name, else the file's `value_range` array."""
    if spec is not None:
        try:
            low, high = (float(v) for v in spec.split(","))
        except ValueError:
            raise DataError(f"{path}: range={spec!r}; write npz:PATH?range=LO,HI, e.g. ?range=0,16") from None
    elif "value_range" in arrays:
        stored = np.asarray(arrays["value_range"], dtype=np.float64).reshape(-1)
        if stored.shape != (2,):
            raise DataError(f"{path}: value_range must hold two numbers [lo, hi], got shape {stored.shape}")
        low, high = float(stored[0]), float(stored[1])
    else:
        return None
    if not (np.isfinite(low) and np.isfinite(high) and high > low):
        raise DataError(f"{path}: value range [{low:g}, {high:g}] must be finite with hi > lo")
    return low, high


def _as_labels(y: np.ndarray, n: int, path: Path, key: str) -> torch.Tensor:
    y = np.asarray(y).reshape(-1) if np.asarray(y).ndim == 2 and 1 in np.asarray(y).shape else np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        raise DataError(f"{path}: {key!r} has shape {y.shape} but there are {n} images. {NPZ_HELP}")
    if not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.mod(y, 1) == 0):
            y = y.astype(np.int64)
        else:
            raise DataError(f"{path}: labels {key!r} must be integers, got {y.dtype}. {NPZ_HELP}")
    if len(y) and y.min() < 0:
        raise DataError(f"{path}: labels {key!r} must be >= 0. {NPZ_HELP}")
    return torch.from_numpy(y.astype(np.int64))


def holdout_split(data: ImageDataset, fraction: float, seed: int) -> DataSplits:
    """Split a single labelled set into train and test (seeded)."""
    if not 0.0 < fraction < 1.0:
        raise DataError(f"test fraction must lie in (0, 1), got {fraction}")
    n_test = max(1, int(round(len(data) * fraction)))
    if n_test >= len(data):
        raise DataError(f"{data.name}: {len(data)} examples are too few to hold out a test split")
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    return DataSplits(train=data.subset(perm[n_test:]), test=data.subset(perm[:n_test]))


# Fewer examples than this cannot be split into partitions, batches and a test part meaningfully: refused
# rather than "trained" to a number that means nothing.
MIN_TRAIN_EXAMPLES = 20


def load_npz(path: str | Path, *, test_fraction: float = 0.1, seed: int = 0) -> DataSplits:
    """An .npz of arrays (NPZ_HELP); `path` may end in `?range=LO,HI` to state the pixel scale."""
    path, _, range_spec = str(path).partition("?range=")
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"npz dataset {path} does not exist. {NPZ_HELP}")
    try:
        arrays = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise DataError(f"{path} is not a readable .npz file ({err}). {NPZ_HELP}") from err
    with arrays:
        if "x" not in arrays or "y" not in arrays:
            raise DataError(f"{path} has arrays {sorted(arrays.files)}; 'x' and 'y' are required. {NPZ_HELP}")
        value_range = _value_range(range_spec or None, arrays, path)
        x = _as_uint8_images(arrays["x"], path, "x", value_range)
        y = _as_labels(arrays["y"], len(x), path, "y")
        test = None
        if "x_test" in arrays and "y_test" in arrays:
            xt = _as_uint8_images(arrays["x_test"], path, "x_test", value_range)
            yt = _as_labels(arrays["y_test"], len(xt), path, "y_test")
            test = (xt, yt)
    num_classes = int(max(int(y.max()), int(test[1].max()) if test else 0)) + 1
    present = len(torch.unique(y))
    if present < 2:
        raise DataError(f"{path}: the training labels hold {present} class; a classifier needs at least 2")
    if num_classes > max(2 * present, 100):  # a {1, 7} subset of MNIST is fine; {0, 1000} is not
        # labels are class indices: {0, 1000} would build a 1001-way model with 999 classes never seen
        raise DataError(f"{path}: labels run up to {num_classes - 1} but only {present} distinct values occur; "
                        "relabel the classes as 0..K-1")
    if test is not None:
        unseen = sorted(set(torch.unique(test[1]).tolist()) - set(torch.unique(y).tolist()))
        if unseen:  # a class only the test split holds: the model would get an output it can never learn
            raise DataError(f"{path}: y_test holds label(s) {unseen} that never occur in y; every test class "
                            "must be present in the training data")
    if len(x) < MIN_TRAIN_EXAMPLES:
        raise DataError(f"{path}: {len(x)} training images; privdistill needs at least {MIN_TRAIN_EXAMPLES} "
                        "(a private training set is split into teachers' partitions, batches and a test part)")
    name = f"npz:{path.name}" + (f"?range={range_spec}" if range_spec else "")  # another scale, other data
    train = ImageDataset(x, y, num_classes, name=name, source=str(path))
    if test is None:
        return holdout_split(train, test_fraction, seed)
    if test[0].shape[1:] != x.shape[1:]:
        raise DataError(f"{path}: x_test images {tuple(test[0].shape[1:])} differ from x {tuple(x.shape[1:])}")
    return DataSplits(train=train, test=ImageDataset(test[0], test[1], num_classes, name=name, source=str(path)))


def _read_image_folder(directory: Path, image_size: int | None, classes: list[str] | None):
    from PIL import Image
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import functional as F

    try:
        folder = ImageFolder(str(directory))
    except (FileNotFoundError, OSError) as err:
        raise DataError(f"ImageFolder {directory}: {err}. Expected one sub-directory of images per class.") from err
    if classes is not None and folder.classes != classes:
        raise DataError(f"{directory}: classes {folder.classes} differ from the training classes {classes}")
    images, labels, size, mode = [], [], None, None
    for path, label in folder.samples:
        try:
            with Image.open(path) as img:  # not folder.loader: it converts everything to RGB
                if mode is None:
                    mode = "L" if img.mode in ("L", "1", "I;16", "I") else "RGB"
                img = img.convert(mode)
                if image_size:
                    img = img.resize((image_size, image_size))
                t = F.pil_to_tensor(img)
        except (OSError, ValueError) as err:  # PIL's UnidentifiedImageError is an OSError
            raise DataError(f"{path} is not a readable image ({err})") from None
        if size is None:
            size = tuple(t.shape)
        elif tuple(t.shape) != size:
            raise DataError(f"{path} has shape {tuple(t.shape)} but earlier images have {size}; "
                            "pass an image size to resize them all.")
        images.append(t)
        labels.append(label)
    return torch.stack(images), torch.tensor(labels, dtype=torch.long), folder.classes


def load_image_folder(directory: str | Path, *, image_size: int | None = None, test_fraction: float = 0.1,
                      seed: int = 0) -> DataSplits:
    """`DIR/<class>/<image>` (a test split is held out), or `DIR/train/<class>/...` + `DIR/test/<class>/...`."""
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise DataError(f"ImageFolder directory {directory} does not exist")
    name = f"folder:{directory.name}"
    if (directory / "train").is_dir() and (directory / "test").is_dir():
        x, y, classes = _read_image_folder(directory / "train", image_size, None)
        xt, yt, _ = _read_image_folder(directory / "test", image_size, classes)
        k = len(classes)
        return DataSplits(train=ImageDataset(x, y, k, name=name, classes=tuple(classes), source=str(directory)),
                          test=ImageDataset(xt, yt, k, name=name, classes=tuple(classes), source=str(directory)))
    x, y, classes = _read_image_folder(directory, image_size, None)
    data = ImageDataset(x, y, len(classes), name=name, classes=tuple(classes), source=str(directory))
    return holdout_split(data, test_fraction, seed)


def as_dataset_spec(data: Any, labels: Any = None, *, value_range: tuple[float, float] | None = None) -> str:
    """A dataset given as data rather than by name, as the `npz:PATH` every command reads: arrays (`data` images
    N x H x W or N x C x H x W with `labels` N), a pair `(images, labels)`, or a torch Dataset of (image, label)
    items (e.g. torchvision's, with `transforms.PILToTensor()`). Names and `npz:`/`folder:` strings pass through.

    The arrays are written once to `<stage cache>/../arrays/<content hash>.npz`, so that the same data gives the
    same name (and the stage cache recognises it on the next fit). Values are checked like any npz (NPZ_HELP)."""
    import hashlib

    from privdistill.engine.cache import default_cache_root

    if data is None or isinstance(data, (str, os.PathLike)):
        if labels is not None:
            raise DataError("labels given with a dataset name: pass fit(images, labels) or fit('npz:PATH')")
        return None if data is None else str(data)
    if isinstance(data, tuple) and len(data) == 2 and labels is None:
        data, labels = data
    if labels is None and hasattr(data, "__getitem__") and hasattr(data, "__len__") and \
            not isinstance(data, (np.ndarray, torch.Tensor)):
        items = [data[i] for i in range(len(data))]
        try:
            images = np.stack([np.asarray(x) for x, _ in items])
            labels = np.asarray([int(y) for _, y in items])
        except (TypeError, ValueError) as err:
            raise DataError(f"a dataset passed to fit must yield (image, label) pairs of arrays or tensors ({err}); "
                            "for PIL images add transforms.PILToTensor()") from None
        data = images
    if labels is None:
        raise DataError("fit(images) needs the labels too: fit(images, labels)")
    x = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    y = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    extra = {} if value_range is None else {"value_range": np.asarray(value_range, dtype=np.float64)}
    digest = hashlib.sha256(x.tobytes() + str((x.dtype, x.shape, value_range)).encode() + y.tobytes()).hexdigest()[:16]
    path = default_cache_root().parent / "arrays" / f"arrays-{digest}.npz"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npz")
        np.savez(partial, x=x, y=y, **extra)
        os.replace(partial, path)
    try:
        load_npz(path)  # every check now, before any training
    except PixelScaleError as err:  # the npz advice (npz:PATH?range=...) names a file the user never wrote
        raise DataError(f"{err.finding.rstrip('?')}? State the scale of the arrays: fit(images, labels, "
                        "value_range=(LO, HI))") from None
    return f"npz:{path}"
