"""A user's own private data: a `.npz` file with arrays `x`, `y`, an ImageFolder directory, or arrays passed to fit
(kept in memory, never written to disk)."""

from __future__ import annotations

import hashlib
import os
import re
import warnings
import zipfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privdistill.data.dataset import DataSplits, ImageDataset
from privdistill.errors import DataError

NPZ_HELP = (
    "A .npz needs arrays 'x' (N x H x W, N x C x H x W or N x H x W x C, C in {1, 3}; uint8 0..255 or float 0..1) "
    "and 'y' (N integer labels 0..K-1 or class names), or 'x_train' and 'y_train' as Keras writes them; optional "
    "'x_test', 'y_test', and 'value_range' ([lo, hi], for pixels on another scale; or write npz:PATH?range=LO,HI)."
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


def _as_uint8_images(x: np.ndarray, path: Path | str, key: str,
                     value_range: tuple[float, float] | None = None) -> tuple[torch.Tensor, tuple[float, float]]:
    """The images as uint8 0..255, and the scale they were given on (mapped linearly onto 0..255)."""
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim == 4 and x.shape[1] not in (1, 3) and x.shape[3] in (1, 3):
        # channels last (PIL, TensorFlow, matplotlib write images so). Where both readings fit (images 1 or 3
        # pixels high) channels first wins, as torchvision stores them.
        x = x.transpose(0, 3, 1, 2)
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise DataError(f"{path}: array {key!r} has shape {x.shape}; expected N x H x W, N x C x H x W or "
                        f"N x H x W x C with C in {{1, 3}}. {NPZ_HELP}")
    if len(x) == 0:
        raise DataError(f"{path}: array {key!r} holds no images. {NPZ_HELP}")
    if x.dtype == np.uint8 and value_range is None and x.size and int(x.max()) >= AMBIGUOUS_BELOW:
        return torch.from_numpy(np.ascontiguousarray(x)), (0.0, 255.0)
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{path}: array {key!r} has dtype {x.dtype}; expected numbers. {NPZ_HELP}")
    if not np.isfinite(x).all():
        raise DataError(f"{path}: array {key!r} holds NaN or infinite pixel values")
    lo, hi = float(np.min(x)), float(np.max(x))
    if value_range is not None:  # the user said what the scale is
        low, high = value_range
        if lo < low or hi > high:
            raise DataError(f"{path}: pixel values of {key!r} lie in [{lo:g}, {hi:g}], outside the range they are "
                            f"read on, [{low:g}, {high:g}] (the stated one, or that of the training images 'x')")
        x = (x.astype(np.float64) - low) * (255.0 / (high - low))
        scale = (float(low), float(high))
    elif lo >= 0.0 and hi <= 1.0:
        x = x * 255.0
        scale = (0.0, 1.0)
    elif lo < 0.0 or hi > 255.0:
        raise PixelScaleError(path, f"pixel values of {key!r} lie in [{lo:g}, {hi:g}]; expected [0, 1] or [0, 255]",
                              ", or state the scale: npz:PATH?range=LO,HI (or an array value_range in the file)")
    elif hi < AMBIGUOUS_BELOW:  # uint8 too: sklearn's 0..16 digits cast to uint8 would read as black images
        raise PixelScaleError(path, f"pixel values of {key!r} lie in [{lo:g}, {hi:g}]: is that scale 0..255 (dark "
                              f"images) or 0..{hi:g}?", f" State it: npz:PATH?range=0,{hi:g} (or an array value_range "
                              f"= [0, {hi:g}] in the file; range=0,255 for dark images)")
    else:
        scale = (0.0, 255.0)
    return torch.from_numpy(np.ascontiguousarray(np.rint(x).astype(np.uint8))), scale


def _value_range(spec: str | None, arrays, path: Path | str) -> tuple[float, float] | None:
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


def _as_labels(y: np.ndarray, n: int, path: Path | str, key: str) -> torch.Tensor:
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
    """Split a single labelled set into train and test (seeded); `test_from` says so."""
    if not 0.0 < fraction < 1.0:
        raise DataError(f"test fraction must lie in (0, 1), got {fraction}")
    n_test = max(1, int(round(len(data) * fraction)))
    if n_test >= len(data):
        raise DataError(f"{data.name}: {len(data)} examples are too few to hold out a test split")
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    return DataSplits(train=data.subset(perm[n_test:]), test=data.subset(perm[:n_test]),
                      test_from=f"held out at random from the {len(data):,} labelled records given ({fraction:.0%}, "
                                f"seeded with run.seed {seed}; the other {len(data) - n_test:,} train), as no test "
                                "split was given")


# Fewer examples than this cannot be split into partitions, batches and a test part meaningfully: refused
# rather than "trained" to a number that means nothing.
MIN_TRAIN_EXAMPLES = 20


class LabelRemapWarning(UserWarning):
    """Labels that skip class numbers were renumbered 0..K-1 (the mapping is recorded with the run)."""


def _show_labels(values: list[int]) -> str:
    """0, 1, ..., 8, 12 rather than ten numbers: runs of consecutive labels shortened."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def _class_names(y: Any, y_test: Any) -> list[str] | None:
    """The sorted class names where the labels are strings (train and test together), else None."""
    if np.asarray(y).dtype.kind not in "US":
        return None
    both = [np.asarray(y).reshape(-1)] + ([] if y_test is None else [np.asarray(y_test).reshape(-1)])
    return sorted(str(v) for v in np.unique(np.concatenate(both).astype(str)))


def _numbered(y: Any, named: list[str] | None) -> Any:
    """String labels as their class numbers (their index in `named`); other labels unchanged."""
    if named is None:
        return y
    if np.asarray(y).dtype.kind not in "US":
        raise DataError("the training labels are class names but the test labels are numbers: give both as names")
    index = {name: k for k, name in enumerate(named)}
    return np.asarray([index[str(v)] for v in np.asarray(y).reshape(-1).astype(str)]).reshape(np.asarray(y).shape)


def _renumber(y: torch.Tensor, test: tuple[torch.Tensor, torch.Tensor] | None, where: str):
    """Labels that are not 0..K-1 (a class number skipped, e.g. 0..8 and 12, or 1..10) renumbered in order, with a
    LabelRemapWarning; returns (y, test, classes named by the labels as given, {label: class} or None)."""
    present = sorted(set(torch.unique(y).tolist()) | (set(torch.unique(test[1]).tolist()) if test else set()))
    if present == list(range(len(present))):
        return y, test, (), None
    mapping = {int(v): k for k, v in enumerate(present)}
    lookup = torch.full((present[-1] + 1,), -1, dtype=torch.long)
    lookup[torch.tensor(present)] = torch.arange(len(present))
    y = lookup[y]
    test = None if test is None else (test[0], lookup[test[1]])
    warnings.warn(f"{where}: the labels ({_show_labels(present)}) skip class numbers, so they are renumbered "
                  f"0..{len(present) - 1} in order, a {len(present)}-class model (label {present[-1]} is class "
                  f"{len(present) - 1}); the run's summary (label_map) and the model card record the labels as given",
                  LabelRemapWarning, stacklevel=4)
    return y, test, tuple(str(v) for v in present), mapping


def _splits(arrays, where: Path | str, *, name: str, source: str, range_spec: str | None, test_fraction: float,
            seed: int, test_given: str) -> DataSplits:
    """The checked train and test splits of arrays `x`, `y` (optional `x_test`, `y_test`, `value_range`: NPZ_HELP),
    from an npz file or from arrays passed to fit; `where` names them in messages, `test_given` says where a given
    test split came from."""
    value_range = _value_range(range_spec, arrays, where)
    x, scale = _as_uint8_images(np.asarray(arrays["x"]), where, "x", value_range)
    _check_square(x, where)
    has_test = "x_test" in arrays and "y_test" in arrays
    named = _class_names(arrays["y"], arrays["y_test"] if has_test else None)
    y = _as_labels(_numbered(arrays["y"], named), len(x), where, "y")
    test = None
    if has_test:
        # on the training images' scale: a test split whose darkest-brightest span differs is not re-guessed
        xt, _ = _as_uint8_images(np.asarray(arrays["x_test"]), where, "x_test", value_range or scale)
        yt = _as_labels(_numbered(arrays["y_test"], named), len(xt), where, "y_test")
        test = (xt, yt)
    present = len(torch.unique(y))
    if present < 2:
        raise DataError(f"{where}: the training labels hold {present} class; a classifier needs at least 2")
    if test is not None:
        unseen = sorted(set(torch.unique(test[1]).tolist()) - set(torch.unique(y).tolist()))
        if unseen:  # a class only the test split holds: the model would get an output it can never learn
            raise DataError(f"{where}: y_test holds label(s) {unseen} that never occur in y; every test class "
                            "must be present in the training data")
    if len(x) < MIN_TRAIN_EXAMPLES:
        raise DataError(f"{where}: {len(x)} training images; privdistill needs at least {MIN_TRAIN_EXAMPLES} "
                        "(a private training set is split into teachers' partitions, batches and a test part)")
    # labels are class indices: {0..8, 12} would build a 13-way model with 3 classes never seen, {0, 1000} a
    # 1001-way one; renumbered 0..K-1 instead, the labels as given kept as the class names
    if named:  # class names ("cat", "dog"): numbered in sorted order, the names kept as the classes
        classes, label_map = tuple(named), {name: k for k, name in enumerate(named)}
    else:
        y, test, classes, label_map = _renumber(y, test, str(where))
    num_classes = int(max(int(y.max()), int(test[1].max()) if test else 0)) + 1
    train = ImageDataset(x, y, num_classes, name=name, classes=classes, source=source)
    if test is None:
        splits = holdout_split(train, test_fraction, seed)
    else:
        if test[0].shape[1:] != x.shape[1:]:
            raise DataError(f"{where}: x_test images {tuple(test[0].shape[1:])} differ from x {tuple(x.shape[1:])}")
        splits = DataSplits(train=train, test=ImageDataset(test[0], test[1], num_classes, name=name, classes=classes,
                                                           source=source), test_from=test_given)
    splits.value_range, splits.label_map = scale, label_map
    return splits


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
        if not {"x", "y"} & set(arrays.files) and {"x_train", "y_train"} <= set(arrays.files):  # Keras's layout
            arrays = {("x" if k == "x_train" else "y" if k == "y_train" else k): arrays[k] for k in arrays.files}
        if "x" not in arrays or "y" not in arrays:
            raise DataError(f"{path} has arrays {sorted(arrays)}; 'x' and 'y' are required. {NPZ_HELP}")
        name = f"npz:{path.name}" + (f"?range={range_spec}" if range_spec else "")  # another scale, other data
        return _splits(arrays, path, name=name, source=str(path), range_spec=range_spec or None,
                       test_fraction=test_fraction, seed=seed, test_given=f"x_test / y_test of {path.name}")


def _check_square(x: torch.Tensor, where: Path | str, fix: str = "") -> None:
    """Refuse images that are not square, before anything trains: every model, generator and VAE here is built
    for H = W (an `image_size`), and a scattering or a generator would fail mid-run."""
    h, w = x.shape[-2:]
    if h != w:
        side = max(h, w)
        raise DataError(f"{where}: images are {h} x {w} (height x width); privdistill's models take square images. "
                        f"Pad them to {side} x {side} (e.g. np.pad with zeros, or the background value) or "
                        f"crop or resize them to a square first{fix}")


FOLDER_FIX = " (folder:DIR?size=N does that: the shorter side scaled to N, then the centre square)"


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
                if image_size:  # the shorter side to image_size, then the centre square: no image is stretched
                    img = F.center_crop(F.resize(img, image_size), [image_size, image_size])
                t = F.pil_to_tensor(img)
        except (OSError, ValueError) as err:  # PIL's UnidentifiedImageError is an OSError
            raise DataError(f"{path} is not a readable image ({err})") from None
        if size is None:
            size = tuple(t.shape)
        elif tuple(t.shape) != size:
            raise DataError(f"{path} has shape {tuple(t.shape)} but earlier images have {size}; "
                            "write folder:DIR?size=N to bring them all to N x N (the shorter side scaled to N, then "
                            "the centre square)")
        images.append(t)
        labels.append(label)
    return torch.stack(images), torch.tensor(labels, dtype=torch.long), folder.classes


def load_image_folder(directory: str | Path, *, image_size: int | None = None, test_fraction: float = 0.1,
                      seed: int = 0) -> DataSplits:
    """`DIR/<class>/<image>` (a test split is held out), or `DIR/train/<class>/...` + `DIR/test/<class>/...`."""
    directory, _, size_spec = str(directory).partition("?size=")
    if size_spec:
        if not size_spec.isdigit() or not 4 <= int(size_spec) <= 512:
            raise DataError(f"folder:{directory}?size={size_spec}: the size must be a whole number of pixels, 4..512")
        image_size = int(size_spec)
    directory = Path(directory).expanduser()
    if not directory.is_dir():
        raise DataError(f"ImageFolder directory {directory} does not exist")
    name = f"folder:{directory.name}" + (f"?size={image_size}" if image_size else "")
    given_test = (directory / "train").is_dir() and (directory / "test").is_dir()
    x, y, classes = _read_image_folder(directory / "train" if given_test else directory, image_size, None)
    test = _read_image_folder(directory / "test", image_size, classes)[:2] if given_test else None
    _check_square(x, directory, FOLDER_FIX)
    dataset = partial(ImageDataset, num_classes=len(classes), name=name, classes=tuple(classes), source=str(directory))
    if test is None:
        return holdout_split(dataset(x, y), test_fraction, seed)
    return DataSplits(train=dataset(x, y), test=dataset(*test), test_from=f"the test/ folder of {directory.name}")


#: Arrays passed to fit, in this process's memory only, by their dataset name ("arrays:NAME"): never written to disk.
_IN_MEMORY: dict[str, dict[str, np.ndarray]] = {}
ARRAYS_PREFIX = "arrays:"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _as_pair(data: Any, labels: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels) as numpy arrays from arrays, an (images, labels) pair or a torch Dataset of pairs."""
    if isinstance(data, tuple) and len(data) == 2 and labels is None:
        data, labels = data
    if labels is None and hasattr(data, "__getitem__") and hasattr(data, "__len__") and \
            not isinstance(data, (np.ndarray, torch.Tensor)):
        items = [data[i] for i in range(len(data))]
        try:
            images = np.stack([np.asarray(x) for x, _ in items])
            labels = np.asarray([int(y) for _, y in items])
        except (TypeError, ValueError) as err:
            raise DataError(f"{what} must yield (image, label) pairs of arrays or tensors ({err}); for PIL images "
                            "add transforms.PILToTensor()") from None
        data = images
    if labels is None:
        raise DataError("fit(images) needs the labels too: fit(images, labels)")
    x = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    y = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    return np.array(x, copy=True), np.array(y, copy=True)  # copies: the caller may change theirs afterwards


def as_dataset_spec(data: Any, labels: Any = None, *, value_range: tuple[float, float] | None = None,
                    name: str | None = None, test: Any = None) -> str | None:
    """A dataset given as data rather than by name, as the `arrays:NAME` that `load_data` reads: arrays (`data`
    images N x H x W, N x C x H x W or N x H x W x C with `labels` N), a pair `(images, labels)`, or a torch
    Dataset of (image, label) items (e.g. torchvision's, with `transforms.PILToTensor()`). Names and
    `npz:`/`folder:` strings pass through. `test`: the held-out split the test accuracy is measured on, in the same
    forms (default: 10 % of the records held out at random, which are then not trained on).

    The arrays stay in this process's memory (a copy, held for the process's lifetime so that a later audit or
    resumed fit finds them); nothing is written to disk. NAME is `name` (letters, digits, '.', '_', '-'), or else
    `sha256-` and a hash of the content, so that the same data gives the same name; summaries and model cards name
    the data by it. Values are checked like any npz (NPZ_HELP), now, before anything trains."""
    if data is None or isinstance(data, (str, os.PathLike)):
        if labels is not None or test is not None:
            raise DataError("labels or test arrays given with a dataset name: pass fit(images, labels, test=...) or "
                            "fit('npz:PATH') (an npz holds its own x_test, y_test)")
        return None if data is None else str(data)
    if name is not None and not _NAME.fullmatch(str(name)):
        raise DataError(f"name={name!r}: a dataset name is 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                        "letter or digit (it names the data in summaries, run directories and model cards)")
    x, y = _as_pair(data, labels, "a dataset passed to fit")
    arrays = {"x": x, "y": y}
    if test is not None:
        arrays["x_test"], arrays["y_test"] = _as_pair(test, None, "the test set passed to fit")
    if value_range is not None:
        arrays["value_range"] = np.asarray(value_range, dtype=np.float64)
    h = hashlib.sha256()
    for key in sorted(arrays):
        h.update(f"{key}{arrays[key].dtype}{arrays[key].shape}".encode())
        h.update(np.ascontiguousarray(arrays[key]).tobytes())
    spec = ARRAYS_PREFIX + (str(name) if name is not None else f"sha256-{h.hexdigest()[:16]}")
    previous = _IN_MEMORY.get(spec)
    _IN_MEMORY[spec] = arrays
    try:
        load_arrays(spec)  # every check now, before any training
    except DataError as err:
        if previous is None:
            _IN_MEMORY.pop(spec, None)
        else:
            _IN_MEMORY[spec] = previous
        if isinstance(err, PixelScaleError):  # the npz advice (npz:PATH?range=...) names a file the user never wrote
            raise DataError(f"{err.finding.rstrip('?')}? State the scale of the arrays: fit(images, labels, "
                            "value_range=(LO, HI))") from None
        raise
    return spec


def load_arrays(spec: str, *, test_fraction: float = 0.1, seed: int = 0) -> DataSplits:
    """The splits of arrays passed to fit in this process (`as_dataset_spec`), by their name `arrays:NAME`."""
    arrays = _IN_MEMORY.get(spec)
    if arrays is None:
        raise DataError(f"{spec} names arrays passed to fit() in another process: they are kept in memory only, "
                        "never on disk. Pass them to fit again, or save them (np.savez('data.npz', x=images, "
                        "y=labels)) and name the file: npz:data.npz")
    return _splits(arrays, "the arrays passed to fit", name=spec, source="arrays passed to fit (in memory)",
                   range_spec=None, test_fraction=test_fraction, seed=seed,
                   test_given="the test arrays passed to fit (test=...)")
