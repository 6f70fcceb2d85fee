import gzip
import warnings

import numpy as np
import pytest
import torch

from fabricate import (
    IDX_NAMES,
    spec_with_hashes,
    write_cifar10,
    write_idx_gz,
    write_image_folder,
    write_npz,
    write_svhn,
)
from privdistill.data import builtin, catalog, load_data, prepare, status
from privdistill.errors import DataError


@pytest.fixture
def fake_mnist_spec(monkeypatch, tmp_path):
    """MNIST's spec with content hashes of fabricated files, so the real prepare/verify path runs."""
    contents = write_idx_gz(tmp_path / "source")
    spec = spec_with_hashes(catalog.MNIST, contents)
    monkeypatch.setitem(catalog.BUILTIN, "mnist", spec)
    return tmp_path / "source", contents


def test_prepare_from_offline_gz_verifies_and_loads(data_root, fake_mnist_spec):
    source, _ = fake_mnist_spec
    how = prepare("mnist", data_root, source=source, download=False)
    assert "copied" in how
    for name in IDX_NAMES:
        assert (data_root / "MNIST" / "raw" / name).is_file()
    splits = load_data("mnist", data_root)
    assert splits.train.images.shape == (200, 1, 28, 28) and splits.train.images.dtype == torch.uint8
    assert len(splits.test) == 100 and splits.num_classes == 10
    st = status("mnist", data_root)
    assert st.present and st.verified and st.train_size == 200


def test_prepare_rejects_content_that_differs_from_the_official_files(data_root, tmp_path):
    write_idx_gz(tmp_path / "bogus")  # real MNIST hashes, fabricated content
    with pytest.raises(DataError, match="do not match the official content"):
        prepare("mnist", data_root, source=tmp_path / "bogus", download=False)
    assert not any((data_root / "MNIST" / "raw").glob("*-ubyte")), "rejected files must not stay behind"


def test_a_source_with_other_content_is_skipped_for_the_next_one(data_root, fake_mnist_spec, tmp_path, monkeypatch):
    good, _ = fake_mnist_spec
    write_idx_gz(tmp_path / "other", seed=7)  # same file names, other content (like MNIST vs Fashion-MNIST)
    monkeypatch.setenv("PRIVDISTILL_SOURCES", f"{tmp_path / 'other'}:{good}")
    assert prepare("mnist", data_root, download=False) == f"copied from {good}"


def test_truncated_gz_is_a_clear_error(data_root, fake_mnist_spec):
    source, _ = fake_mnist_spec
    gz = source / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:100])
    with pytest.raises(DataError, match="truncated or corrupt"):
        prepare("mnist", data_root, source=source, download=False)


def test_corrupt_prepared_file_is_reported_not_a_torchvision_traceback(data_root, fake_mnist_spec):
    source, _ = fake_mnist_spec
    prepare("mnist", data_root, source=source, download=False)
    path = data_root / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DataError, match="mnist.*could not be read"):
        load_data("mnist", data_root)
    st = status("mnist", data_root)
    assert st.verified is False and any("size" in p for p in st.problems)


def test_missing_dataset_names_where_it_looked_and_how_to_get_it(data_root, monkeypatch):
    from dataclasses import replace

    monkeypatch.setitem(catalog.BUILTIN, "fashion-mnist", replace(catalog.FASHION_MNIST, system_sources=()))
    with pytest.raises(DataError, match=r"fashion-mnist: source directory .*nowhere does not exist.*apt-get install"):
        prepare("fashion-mnist", data_root, source=data_root / "nowhere", download=False)
    with pytest.raises(DataError, match=r"fashion-mnist is not prepared in .*FashionMNIST/raw.*apt-get install"):
        prepare("fashion-mnist", data_root, download=False)
    with pytest.raises(DataError, match="data root .*no-such-root does not exist"):
        builtin.load_builtin("mnist", data_root / "no-such-root", auto_prepare=False)
    # an explicit root that does not exist is a clear error, never a new directory and a download
    with pytest.raises(DataError, match="data root .*typo-root does not exist.*leave --data-root out"):
        load_data("mnist", data_root / "typo-root")
    assert not (data_root / "typo-root").exists()


def test_unknown_dataset_name():
    with pytest.raises(DataError, match="unknown dataset 'imagenet'"):
        load_data("imagenet")


def test_fashion_mnist_from_debian_layout_with_different_gzip_headers(data_root, tmp_path, monkeypatch):
    contents = write_idx_gz(tmp_path / "debian")
    # Re-compress with another header (a file name and mtime), as Debian's package does: same content.
    for name, data in contents.items():
        with open(tmp_path / "debian" / f"{name}.gz", "wb") as raw:
            with gzip.GzipFile(filename=name, mode="wb", fileobj=raw, mtime=1234567) as gz:
                gz.write(data)
    spec = spec_with_hashes(catalog.FASHION_MNIST, contents)
    monkeypatch.setitem(catalog.BUILTIN, "fashion-mnist", spec)
    monkeypatch.setenv("PRIVDISTILL_SOURCES", str(tmp_path / "debian"))
    assert "copied" in prepare("fmnist", data_root, download=False)
    assert len(load_data("fashion-mnist", data_root).train) == 200


def test_cifar10_pickles(data_root):
    write_cifar10(data_root)
    splits = load_data("cifar10", data_root, verify=False)
    assert splits.train.images.shape == (100, 3, 32, 32)
    assert len(splits.test) == 20 and splits.train.classes[0] == "airplane"
    with pytest.raises(DataError, match="cifar10"):  # torchvision's md5 check rejects fabricated files
        load_data("cifar10", data_root, verify=True)


def test_svhn_mat_maps_label_10_to_0(data_root):
    write_svhn(data_root)
    splits = load_data("svhn", data_root, verify=False)
    assert splits.train.images.shape == (40, 3, 32, 32)
    assert int(splits.train.labels.min()) >= 0 and int(splits.train.labels.max()) <= 9


def test_image_folder_gray_and_rgb(tmp_path):
    write_image_folder(tmp_path / "gray", mode="L", num_classes=3, n_per_class=5, size=20)
    splits = load_data(f"folder:{tmp_path / 'gray'}", test_fraction=0.2)
    assert splits.train.channels == 1 and splits.image_size == (20, 20) and splits.num_classes == 3
    assert len(splits.train) + len(splits.test) == 15
    write_image_folder(tmp_path / "rgb" / "train", mode="RGB", num_classes=4, size=24)
    write_image_folder(tmp_path / "rgb" / "test", mode="RGB", num_classes=4, size=24, n_per_class=2)
    splits = load_data(f"folder:{tmp_path / 'rgb'}")
    assert splits.train.channels == 3 and len(splits.test) == 8 and splits.num_classes == 4


@pytest.mark.parametrize("channels,size,classes", [(1, 28, 10), (3, 20, 5), (1, 17, 2)])
def test_npz_any_size_channels_classes(tmp_path, channels, size, classes):
    path = write_npz(tmp_path / "d.npz", n=60, num_classes=classes, size=size, channels=channels)
    splits = load_data(f"npz:{path}")
    assert splits.train.images.shape[1:] == (channels, size, size)
    assert splits.num_classes == classes


def test_npz_channels_last_images_are_read_as_channels_first(tmp_path):
    """N x H x W x C (how PIL, TensorFlow and matplotlib lay images out) gives the same images as N x C x H x W."""
    x = np.random.default_rng(0).integers(0, 256, (30, 3, 12, 12), dtype=np.uint8)
    y = np.arange(30) % 3
    np.savez(tmp_path / "first.npz", x=x, y=y)
    np.savez(tmp_path / "last.npz", x=x.transpose(0, 2, 3, 1), y=y)
    first = load_data(f"npz:{tmp_path / 'first.npz'}", test_fraction=0.2)
    last = load_data(f"npz:{tmp_path / 'last.npz'}", test_fraction=0.2)
    assert last.train.images.shape[1:] == (3, 12, 12)
    assert torch.equal(first.train.images, last.train.images) and torch.equal(first.test.images, last.test.images)


def test_npz_in_keras_layout_is_read(tmp_path):
    """x_train / y_train / x_test / y_test (keras.datasets' mnist.npz) read as x / y with their own test split."""
    rng = np.random.default_rng(0)
    x, xt = rng.integers(0, 256, (40, 10, 10), dtype=np.uint8), rng.integers(0, 256, (12, 10, 10), dtype=np.uint8)
    np.savez(tmp_path / "k.npz", x_train=x, y_train=np.arange(40) % 4, x_test=xt, y_test=np.arange(12) % 4)
    splits = load_data(f"npz:{tmp_path / 'k.npz'}")
    assert len(splits.train) == 40 and len(splits.test) == 12 and splits.num_classes == 4
    assert torch.equal(splits.test.images[:, 0], torch.from_numpy(xt))


def test_images_that_are_not_square_are_refused_before_anything_trains(tmp_path):
    """Every model, generator and VAE is built for H = W: 12 x 20 images failed mid-run in DP-SGD's scattering."""
    x = np.random.default_rng(0).random((40, 12, 20)).astype(np.float32)
    np.savez(tmp_path / "r.npz", x=x, y=np.arange(40) % 2)
    with pytest.raises(DataError, match="12 x 20 .*square.*Pad them to 20 x 20"):
        load_data(f"npz:{tmp_path / 'r.npz'}")


def test_npz_float_images_and_holdout(tmp_path):
    x = np.random.default_rng(0).random((50, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "f.npz", x=x, y=np.arange(50) % 3)
    splits = load_data(f"npz:{tmp_path / 'f.npz'}", test_fraction=0.2)
    assert splits.train.images.dtype == torch.uint8 and len(splits.test) == 10 and len(splits.train) == 40


@pytest.mark.parametrize("arrays,message", [
    ({"x": np.zeros((10, 2, 8, 8), np.uint8), "y": np.zeros(10)}, "C in"),
    ({"x": np.zeros((10, 8), np.uint8), "y": np.zeros(10)}, "expected N x H x W"),
    ({"x": np.zeros((10, 8, 8), np.uint8), "y": np.zeros(9)}, "there are 10 images"),
    ({"x": np.zeros((10, 8, 8), np.uint8)}, "'x' and 'y' are required"),
    ({"x": np.full((10, 8, 8), 300.0), "y": np.zeros(10)}, "pixel values"),
    ({"x": np.zeros((10, 8, 8), np.uint8), "y": np.full(10, -1)}, ">= 0"),
    ({"x": np.zeros((0, 8, 8), np.uint8), "y": np.zeros(0)}, "holds no images"),
    ({"x": np.full((10, 8, 8), np.nan), "y": np.arange(10) % 2}, "NaN"),
    ({"x": np.zeros((10, 8, 8), np.uint8), "y": np.zeros(10)}, "at least 2"),
    ({"x": np.zeros((3, 8, 8), np.uint8), "y": np.arange(3) % 2}, "needs at least 20"),
    ({"x": np.zeros((30, 8, 8), np.uint8), "y": np.arange(30) % 2, "x_test": np.zeros((6, 8, 8), np.uint8),
      "y_test": np.arange(6) % 3}, r"y_test holds label\(s\) \[2\]"),
])
def test_npz_bad_shapes_are_clear_errors(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=message):
        load_data(f"npz:{tmp_path / 'bad.npz'}")


def test_labels_that_skip_class_numbers_are_renumbered_with_a_message(tmp_path):
    """Issue 64: labels 0..8 and 12 became a 13-class problem with only "some classes are rare". They are renumbered
    0..9 in order, said in a warning, the labels as given kept as the class names and the mapping recorded."""
    from privdistill.data.custom import LabelRemapWarning

    y = np.arange(60) % 10
    y[y == 9] = 12
    np.savez(tmp_path / "skips.npz", x=np.zeros((60, 8, 8), np.uint8), y=y)
    with pytest.warns(LabelRemapWarning, match=r"labels \(0\.\.8, 12\) skip class numbers.*renumbered 0\.\.9"):
        splits = load_data(f"npz:{tmp_path / 'skips.npz'}")
    assert splits.num_classes == 10 and splits.label_map == {**{k: k for k in range(9)}, 12: 9}
    assert splits.train.classes == tuple(str(k) for k in range(9)) + ("12",)
    assert sorted(set(splits.train.labels.tolist()) | set(splits.test.labels.tolist())) == list(range(10))
    np.savez(tmp_path / "far.npz", x=np.zeros((20, 8, 8), np.uint8), y=np.arange(20) % 2 * 1000,
             x_test=np.zeros((4, 8, 8), np.uint8), y_test=np.array([0, 1000, 1000, 0]))
    with pytest.warns(LabelRemapWarning):
        far = load_data(f"npz:{tmp_path / 'far.npz'}")
    assert far.num_classes == 2 and far.train.classes == ("0", "1000") and far.test.labels.tolist() == [0, 1, 1, 0]
    assert far.test_from == "x_test / y_test of far.npz"
    np.savez(tmp_path / "plain.npz", x=np.zeros((40, 8, 8), np.uint8), y=np.arange(40) % 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LabelRemapWarning)  # 0..K-1 as given: read as it is, without a word
        plain = load_data(f"npz:{tmp_path / 'plain.npz'}")
    assert plain.label_map is None and plain.train.classes == ("0", "1", "2", "3")
    assert plain.test_from.startswith("held out at random from the 40 labelled records given (10%")


def test_npz_not_a_zip(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_data(f"npz:{tmp_path / 'junk.npz'}")


def test_real_mnist_if_available(data_root):
    source = builtin.Path(__file__).resolve().parents[2] / "shared" / "data" / "MNIST" / "raw"
    if not source.is_dir():
        pytest.skip("no offline MNIST copy on this machine")
    prepare("mnist", data_root, source=source, download=False)
    st = status("mnist", data_root)
    assert st.verified and st.train_size == 60000 and st.test_size == 10000


def test_image_folder_with_a_corrupt_file_names_it(tmp_path):
    write_image_folder(tmp_path / "imgs", num_classes=2)
    bad = next((tmp_path / "imgs").glob("*/*.png"))
    bad.write_bytes(b"\x89PNG broken")
    with pytest.raises(DataError, match=f"{bad.name} is not a readable image"):
        load_data(f"folder:{tmp_path / 'imgs'}")


def test_npz_pixel_scale_is_never_guessed_when_ambiguous(tmp_path):
    """Issue 27: 0..16 digits were read as 0..255 (nearly black) and every method trained to chance, silently."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 17, size=(40, 8, 8)).astype(np.int64)
    np.savez(tmp_path / "digits.npz", x=x, y=np.arange(40) % 4)
    with pytest.raises(DataError, match=r"range=0,16"):
        load_data(f"npz:{tmp_path / 'digits.npz'}")
    stated = load_data(f"npz:{tmp_path / 'digits.npz'}?range=0,16")
    images = torch.cat([stated.train.images, stated.test.images])
    assert int(images.max()) == 255 and int(images.min()) == 0, "0..16 rescaled to the full 0..255"
    assert stated.train.name != load_data(f"npz:{tmp_path / 'digits.npz'}?range=0,32").train.name
    np.savez(tmp_path / "stored.npz", x=x, y=np.arange(40) % 4, value_range=[0, 16])  # the file may say it too
    assert int(load_data(f"npz:{tmp_path / 'stored.npz'}").train.images.max()) == 255
    with pytest.raises(DataError, match="outside the range they are read on"):
        load_data(f"npz:{tmp_path / 'digits.npz'}?range=0,8")
    with pytest.raises(DataError, match="LO,HI"):
        load_data(f"npz:{tmp_path / 'digits.npz'}?range=sixteen")
    # arrays passed to fit(): the advice names fit's own option, not a file the user never wrote
    from privdistill.data.custom import as_dataset_spec

    with pytest.raises(DataError, match=r"fit\(images, labels, value_range=\(LO, HI\)\)"):
        as_dataset_spec(x, np.arange(40) % 4)
    spec = as_dataset_spec(x, np.arange(40) % 4, value_range=(0, 16))
    assert int(load_data(spec).train.images.max()) == 255
    bright = rng.integers(0, 256, size=(40, 8, 8)).astype(np.int64)  # 0..255 in int64: unambiguous, as before
    np.savez(tmp_path / "bright.npz", x=bright, y=np.arange(40) % 4)
    assert int(load_data(f"npz:{tmp_path / 'bright.npz'}").train.images.max()) > 200
    # the same 0..16 digits cast to uint8 (as scikit-learn's are, saved to save space) were read as 0..255
    np.savez(tmp_path / "uint8.npz", x=x.astype(np.uint8), y=np.arange(40) % 4)
    with pytest.raises(DataError, match=r"range=0,16"):
        load_data(f"npz:{tmp_path / 'uint8.npz'}")
    assert int(load_data(f"npz:{tmp_path / 'uint8.npz'}?range=0,16").train.images.max()) == 255
    # a test split is read on the training images' scale, not guessed again: [0, 1] floats against 0..255 uint8
    np.savez(tmp_path / "mixed.npz", x=rng.random((40, 8, 8)), y=np.arange(40) % 4,
             x_test=bright[:10].astype(np.uint8), y_test=np.arange(10) % 4)
    with pytest.raises(DataError, match=r"x_test.*outside the range they are read on, \[0, 1\]"):
        load_data(f"npz:{tmp_path / 'mixed.npz'}")


def test_data_inspect_shows_scale_counts_and_a_grid(tmp_path, tiny_npz):
    from typer.testing import CliRunner

    from privdistill.cli import get_app

    result = CliRunner().invoke(get_app(), ["data", "inspect", f"npz:{tiny_npz}", "--grid", str(tmp_path / "g.png")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "training and" in text and "pixels as read" in text and (tmp_path / "g.png").stat().st_size > 0
    dark = np.zeros((40, 8, 8), np.uint8)
    dark[:, 2:4, 2:4] = 3
    np.savez(tmp_path / "dark.npz", x=dark, y=np.arange(40) % 2)
    # uint8 pixels that never pass 127 are not read as 0..255 without being told (sklearn's 0..16 digits cast to
    # uint8 would train as black images): asked for the scale; told 0..255, inspect still warns of the dark images
    result = CliRunner().invoke(get_app(), ["data", "inspect", f"npz:{tmp_path / 'dark.npz'}"])
    assert result.exit_code != 0 and "range=0,3" in " ".join(str(result.exception).split())
    result = CliRunner().invoke(get_app(), ["data", "inspect", f"npz:{tmp_path / 'dark.npz'}?range=0,255"])
    assert "nearly uniform images" in " ".join(result.output.split())


def test_labels_given_as_class_names_are_numbered_in_sorted_order(tmp_path):
    """y = ["dog", "cat", ...] (how labels often come): classes numbered by sorted name, train and test alike, the
    names kept as the classes and in label_map; names in one split and numbers in the other are refused."""
    x = np.random.default_rng(0).integers(0, 256, (30, 8, 8), dtype=np.uint8)
    names = np.array(["dog", "cat", "emu"])[np.arange(30) % 3]
    np.savez(tmp_path / "n.npz", x=x, y=names, x_test=x[:6], y_test=names[:6])
    splits = load_data(f"npz:{tmp_path / 'n.npz'}")
    assert splits.train.classes == ("cat", "dog", "emu") and splits.label_map == {"cat": 0, "dog": 1, "emu": 2}
    assert splits.train.labels[:3].tolist() == [1, 0, 2] and splits.test.labels[:3].tolist() == [1, 0, 2]
    np.savez(tmp_path / "mixed.npz", x=x, y=names, x_test=x[:6], y_test=np.arange(6) % 3)
    with pytest.raises(DataError, match="class names but the test labels are numbers"):
        load_data(f"npz:{tmp_path / 'mixed.npz'}")


def test_a_folder_of_photos_in_mixed_shapes_is_brought_to_one_square_size(tmp_path):
    """Photos come in many sizes, rarely square: refused with the fix, then `folder:DIR?size=N` scales the shorter
    side to N and keeps the centre square (nothing stretched)."""
    from PIL import Image

    for k, shape in enumerate([(30, 20), (40, 24), (30, 20), (36, 36)]):  # (width, height)
        d = tmp_path / "photos" / f"class_{k % 2}"
        d.mkdir(parents=True, exist_ok=True)
        pixels = np.zeros(shape[::-1], np.uint8)
        pixels[:, shape[0] // 2:] = 255  # the right half white: a centre crop keeps both halves
        Image.fromarray(pixels, mode="L").save(d / f"{k}.png")
    with pytest.raises(DataError, match=r"folder:DIR\?size=N"):
        load_data(f"folder:{tmp_path / 'photos'}", test_fraction=0.25)
    splits = load_data(f"folder:{tmp_path / 'photos'}?size=16", test_fraction=0.25)
    assert splits.image_size == (16, 16) and splits.train.name.endswith("?size=16")
    images = torch.cat([splits.train.images, splits.test.images])
    assert (images[:, 0, :, :6] < 60).all() and (images[:, 0, :, -6:] > 195).all()
    with pytest.raises(DataError, match="whole number of pixels"):
        load_data(f"folder:{tmp_path / 'photos'}?size=big")
