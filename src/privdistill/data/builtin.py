"""Built-in datasets: find, prepare (offline copy or download), verify and load.

Parsing is torchvision's. What we add: offline sources (a folder of the official .gz files, Debian's
dataset-fashion-mnist package), content verification, and one clear error instead of a traceback from
inside torchvision when something is missing or corrupt.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from privdistill.atomic import file_sha256
from privdistill.data.catalog import BUILTIN, DatasetSpec, canonical_name
from privdistill.data.dataset import DataSplits, ImageDataset
from privdistill.errors import DataError

ENV_DATA_ROOT = "PRIVDISTILL_DATA"
ENV_SOURCES = "PRIVDISTILL_SOURCES"  # extra directories (os.pathsep-separated) searched for raw files


def default_data_root() -> Path:
    """`$PRIVDISTILL_DATA`, else `$XDG_CACHE_HOME/privdistill/data` (~/.cache/privdistill/data)."""
    if os.environ.get(ENV_DATA_ROOT):
        return Path(os.environ[ENV_DATA_ROOT]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "privdistill" / "data"


def resolve_data_root(data_root: str | os.PathLike | None) -> Path:
    return Path(data_root).expanduser() if data_root else default_data_root()


def get_spec(name: str) -> DatasetSpec:
    key = canonical_name(name)
    if key not in BUILTIN:
        raise DataError(f"unknown dataset {name!r}. Built-in: {', '.join(BUILTIN)}; your own data: "
                        "'npz:PATH' (arrays x, y) or 'folder:DIR' (an ImageFolder directory).")
    return BUILTIN[key]


# --------------------------------------------------------------------------------------------- IDX files
def _raw_dir(spec: DatasetSpec, root: Path) -> Path:
    return root / spec.folder / "raw"


def _candidate_source_dirs(spec: DatasetSpec, explicit: Path | None) -> list[Path]:
    dirs: list[Path] = []
    if explicit is not None:
        dirs.append(explicit)
    for entry in os.environ.get(ENV_SOURCES, "").split(os.pathsep):
        if entry:
            dirs += [Path(entry), Path(entry) / spec.folder / "raw"]
    dirs += [Path(d) for d in spec.system_sources]
    return dirs


def _find_source_file(directory: Path, raw_name: str) -> Path | None:
    for candidate in (directory / raw_name, directory / f"{raw_name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _copy_decompressed(src: Path, dst: Path) -> None:
    """Copy (and gunzip) `src` to `dst` atomically: a half-written file never carries the final name."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            opener = gzip.open if src.suffix == ".gz" else open
            with opener(src, "rb") as inp:
                shutil.copyfileobj(inp, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dst)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        Path(tmp).unlink(missing_ok=True)
        raise DataError(f"could not read {src}: {err}. The file is truncated or corrupt; get a fresh copy.") from err


@dataclass
class FileCheck:
    name: str
    path: Path
    ok: bool
    problem: str = ""


def verify_idx_files(spec: DatasetSpec, root: Path) -> list[FileCheck]:
    """Check every raw file's size and content hash."""
    checks = []
    for rf in spec.raw_files:
        path = _raw_dir(spec, root) / rf.name
        if not path.is_file():
            checks.append(FileCheck(rf.name, path, False, "missing"))
        elif path.stat().st_size != rf.size:
            checks.append(FileCheck(rf.name, path, False, f"size {path.stat().st_size} != {rf.size}"))
        elif file_sha256(path) != rf.sha256:
            checks.append(FileCheck(rf.name, path, False, "content hash differs from the official file"))
        else:
            checks.append(FileCheck(rf.name, path, True))
    return checks


def _prepare_idx(spec: DatasetSpec, root: Path, source: Path | None, download: bool) -> str:
    raw = _raw_dir(spec, root)
    missing = [rf for rf in spec.raw_files if not (raw / rf.name).is_file()]
    if not missing:
        return f"already in {raw}"
    searched = _candidate_source_dirs(spec, source)
    rejected = []
    for directory in searched:
        found = {rf.name: _find_source_file(directory, rf.name) for rf in missing}
        if not all(found.values()):
            continue
        for rf in missing:
            _copy_decompressed(found[rf.name], raw / rf.name)
        bad = [c for c in verify_idx_files(spec, root) if not c.ok]
        if not bad:
            return f"copied from {directory}"
        # Same file names, other content (e.g. MNIST's files where Fashion-MNIST's were looked for):
        # discard them and try the next source.
        for c in bad:
            c.path.unlink(missing_ok=True)
        rejected.append(f"{directory} ({'; '.join(f'{c.name}: {c.problem}' for c in bad)})")
    if rejected:
        raise DataError(f"{spec.name}: files found in {', '.join(rejected)} do not match the official content. "
                        f"{spec.how_to_get}")
    if source is not None and not source.is_dir():
        raise DataError(f"{spec.name}: source directory {source} does not exist. {spec.how_to_get}")
    if download:
        _download(spec, root)
        return "downloaded"
    where = ", ".join(str(d) for d in searched) or "(no source directories)"
    raise DataError(f"{spec.name} is not prepared in {raw} and no offline copy was found in: {where}. "
                    f"{spec.how_to_get}")


def _torchvision_class(spec: DatasetSpec, verify: bool = True):
    from torchvision import datasets

    cls = {"mnist": datasets.MNIST, "fashion-mnist": datasets.FashionMNIST,
           "cifar10": datasets.CIFAR10, "svhn": datasets.SVHN}[spec.name]
    return cls if verify or spec.raw_files else _unverified(cls)  # IDX files: no md5 check to turn off


def _open_split(cls, spec: DatasetSpec, root: Path, split: str, download: bool):
    """torchvision's dataset of one split, "train" or "test" (SVHN's takes it by name, the others as a flag)."""
    if spec.name == "svhn":
        return cls(str(root), split=split, download=download)
    return cls(str(root), train=split == "train", download=download)


def _download(spec: DatasetSpec, root: Path) -> None:
    cls = _torchvision_class(spec)
    try:
        for split in ("train", "test"):
            _open_split(cls, spec, root, split, download=True)
    except Exception as err:  # network errors come in many types (URLError, socket errors, HTTP errors)
        raise DataError(f"{spec.name}: download failed ({err}). {spec.how_to_get}") from err


# ------------------------------------------------------------------------------------------- prepare
def prepare(name: str, data_root: str | os.PathLike | None = None, *, source: str | os.PathLike | None = None,
            download: bool = True) -> str:
    """Make a built-in dataset available under the data root. Returns a line saying how."""
    spec = get_spec(name)
    root = resolve_data_root(data_root)
    src = Path(source).expanduser() if source else None
    if spec.raw_files:
        return _prepare_idx(spec, root, src, download)
    if _present(spec, root):
        return f"already in {root}"
    if src is not None:
        _copy_tree_files(spec, src, root)
        return f"copied from {src}"
    if download:
        _download(spec, root)
        return "downloaded"
    raise DataError(f"{spec.name} not found in {root}. {spec.how_to_get}")


def _copy_tree_files(spec: DatasetSpec, src: Path, root: Path) -> None:
    if spec.name == "cifar10":
        folder = src / spec.folder if (src / spec.folder).is_dir() else src
        if not (folder / "data_batch_1").is_file():
            raise DataError(f"cifar10: no data_batch_1 in {folder}. {spec.how_to_get}")
        shutil.copytree(folder, root / spec.folder, dirs_exist_ok=True)
    else:  # svhn
        for f in ("train_32x32.mat", "test_32x32.mat"):
            if not (src / f).is_file():
                raise DataError(f"svhn: {src / f} not found. {spec.how_to_get}")
            root.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / f, root / f)


def _present(spec: DatasetSpec, root: Path) -> bool:
    if spec.raw_files:
        return all((_raw_dir(spec, root) / rf.name).is_file() for rf in spec.raw_files)
    if spec.name == "cifar10":
        return (root / spec.folder / "data_batch_1").is_file()
    return (root / "train_32x32.mat").is_file()


# ---------------------------------------------------------------------------------------------- load
def load_builtin(name: str, data_root: str | os.PathLike | None = None, *, verify: bool = True,
                 auto_prepare: bool = True) -> DataSplits:
    """Load train and test splits of a built-in dataset into memory.

    `verify=False` skips torchvision's md5 checks of CIFAR/SVHN files (tests use tiny fabricated files in
    the real formats). IDX content hashes are checked by `prepare` and `privdistill data`, not on every load.
    """
    spec = get_spec(name)
    root = resolve_data_root(data_root)
    if data_root is not None and not root.exists():  # a typo must not become a new directory and a download
        raise DataError(f"{spec.name}: data root {root} does not exist. Create it (or fix the path), or leave "
                        f"--data-root out to use the default cache. {spec.how_to_get}")
    if not root.exists() and not auto_prepare:
        raise DataError(f"{spec.name}: data root {root} does not exist. {spec.how_to_get}")
    if not _present(spec, root):
        if not auto_prepare:
            raise DataError(f"{spec.name} not found under {root}. {spec.how_to_get}")
        prepare(spec.name, root, download=True)
    try:
        train, test = _load_torchvision(spec, root, verify)
    except DataError:
        raise
    except Exception as err:  # torchvision raises RuntimeError, ValueError, OSError, EOFError ...
        raise DataError(f"{spec.name}: files under {root} could not be read ({type(err).__name__}: {err}). They are "
                        f"probably truncated or corrupt: delete them and prepare again. {spec.how_to_get}") from err
    return DataSplits(train=train, test=test, test_from=f"the {spec.name} test set")


def _load_torchvision(spec: DatasetSpec, root: Path, verify: bool) -> tuple[ImageDataset, ImageDataset]:
    cls = _torchvision_class(spec, verify)
    out = []
    for split in ("train", "test"):
        ds = _open_split(cls, spec, root, split, download=False)
        if spec.name == "svhn":
            images, labels = ds.data, ds.labels  # SVHN data is already [N, 3, 32, 32]; label 10 -> 0
        elif spec.name == "cifar10":
            images, labels = ds.data.transpose(0, 3, 1, 2), ds.targets
        else:
            images, labels = ds.data.unsqueeze(1), ds.targets
        out.append(ImageDataset(images=torch.as_tensor(np.asarray(images)).contiguous(),
                                labels=torch.as_tensor(np.asarray(labels), dtype=torch.long),
                                num_classes=spec.num_classes, name=spec.name, classes=spec.classes,
                                source=f"{root} ({split})"))
    return out[0], out[1]


def _unverified(cls):
    """The torchvision dataset class with its md5 check turned off (for fabricated test files)."""
    attrs = {"_check_integrity": lambda self: True}
    if hasattr(cls, "meta"):  # CIFAR also checks the md5 of batches.meta; md5=None means "exists"
        attrs["meta"] = {**cls.meta, "md5": None}
    return type(f"Unverified{cls.__name__}", (cls,), attrs)


# --------------------------------------------------------------------------------------------- status
@dataclass
class DatasetStatus:
    name: str
    present: bool
    location: Path
    train_size: int | None
    test_size: int | None
    verified: bool | None  # None: no content hashes known for this dataset
    problems: list[str]


def status(name: str, data_root: str | os.PathLike | None = None, *, verify: bool = True) -> DatasetStatus:
    spec = get_spec(name)
    root = resolve_data_root(data_root)
    location = _raw_dir(spec, root) if spec.raw_files else root / spec.folder  # SVHN's folder "": the root
    if not _present(spec, root):
        return DatasetStatus(spec.name, False, location, None, None, None, ["not prepared: " + spec.how_to_get])
    problems: list[str] = []
    verified: bool | None = None
    if spec.raw_files and verify:
        bad = [c for c in verify_idx_files(spec, root) if not c.ok]
        verified = not bad
        problems += [f"{c.name}: {c.problem}" for c in bad]
    try:
        splits = load_builtin(spec.name, root, verify=verify, auto_prepare=False)
        sizes = (len(splits.train), len(splits.test))
        if verify and verified is None:
            verified = True  # torchvision's md5 checks passed during loading
    except DataError as err:
        return DatasetStatus(spec.name, True, location, None, None, False, problems + [str(err)])
    return DatasetStatus(spec.name, True, location, sizes[0], sizes[1], verified, problems)
