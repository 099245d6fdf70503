"""Loaders on tiny fixtures in the exact MNIST IDX / CIFAR-10 pickle formats, and the embedded data set."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from fedsv.data import (
    IDX_IMAGES_MAGIC,
    IDX_LABELS_MAGIC,
    ArrayDataset,
    DatasetSplits,
    load_dataset,
    load_embedded,
    read_idx_images,
)

N_TRAIN, N_TEST = 12, 5


def idx_bytes(magic: int, array: np.ndarray) -> bytes:
    """An IDX file: big-endian magic, big-endian uint32 dimensions, then the raw ubyte data."""
    dims = struct.pack(f">{array.ndim}I", *array.shape)
    return struct.pack(">I", magic) + dims + array.astype(np.uint8).tobytes()


def mnist_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    images[:, 0, 0] = 0
    images[:, 27, 27] = 255
    labels = (np.arange(n) * 3 % 10).astype(np.uint8)
    return images, labels


def write_mnist(directory: Path, gz: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    directory.mkdir(parents=True, exist_ok=True)
    data = {"train": mnist_arrays(N_TRAIN, 1), "t10k": mnist_arrays(N_TEST, 2)}
    for prefix, (images, labels) in data.items():
        files = {
            f"{prefix}-images-idx3-ubyte": idx_bytes(IDX_IMAGES_MAGIC, images),
            f"{prefix}-labels-idx1-ubyte": idx_bytes(IDX_LABELS_MAGIC, labels),
        }
        for name, payload in files.items():
            if gz:
                (directory / f"{name}.gz").write_bytes(gzip.compress(payload))
            else:
                (directory / name).write_bytes(payload)
    return data


def image_table(images: np.ndarray, labels: np.ndarray) -> dict[bytes, int]:
    return {img.tobytes(): int(lab) for img, lab in zip(images, labels, strict=True)}


def check_mnist_split(splits: DatasetSplits, data: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    train_table = image_table(*data["train"])
    for ds in (splits.train, splits.validation, splits.test):
        assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64
        assert ds.x.shape[1:] == (1, 28, 28) and ds.input_shape == (1, 28, 28)
        assert ds.num_classes == 10 and ds.name == "mnist"
        assert float(ds.x.min()) == 0.0 and float(ds.x.max()) == 1.0
    seen = []
    for ds in (splits.train, splits.validation):
        raw = np.rint(ds.x[:, 0] * 255).astype(np.uint8)
        np.testing.assert_array_equal(ds.x[:, 0], raw.astype(np.float32) / np.float32(255))
        for img, lab in zip(raw, ds.y, strict=True):
            assert train_table[img.tobytes()] == lab
            seen.append(img.tobytes())
    assert sorted(seen) == sorted(train_table)  # train + validation == the train files, disjoint
    test_images, test_labels = data["t10k"]
    np.testing.assert_array_equal(splits.test.x[:, 0], test_images.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(splits.test.y, test_labels)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_torchvision_layout(tmp_path: Path, gz: bool) -> None:
    data = write_mnist(tmp_path / "MNIST" / "raw", gz=gz)
    splits = load_dataset("mnist", tmp_path, validation_size=4, test_size=N_TEST)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (8, 4, 5)
    check_mnist_split(splits, data)


def test_mnist_flat_layout_and_determinism(tmp_path: Path) -> None:
    data = write_mnist(tmp_path)
    a = load_dataset("mnist", str(tmp_path), seed=3, validation_size=3, test_size=N_TEST)
    b = load_dataset("mnist", tmp_path, seed=3, validation_size=3, test_size=N_TEST)
    c = load_dataset("mnist", tmp_path, seed=4, validation_size=3, test_size=N_TEST)
    check_mnist_split(a, data)
    np.testing.assert_array_equal(a.validation.x, b.validation.x)
    np.testing.assert_array_equal(a.train.y, b.train.y)
    assert not np.array_equal(a.validation.x, c.validation.x)


def test_mnist_test_subsample(tmp_path: Path) -> None:
    data = write_mnist(tmp_path)
    splits = load_dataset("mnist", tmp_path, validation_size=2, test_size=3)
    assert len(splits.test) == 3
    table = image_table(*data["t10k"])
    raw = np.rint(splits.test.x[:, 0] * 255).astype(np.uint8)
    assert len({img.tobytes() for img in raw}) == 3
    assert all(table[img.tobytes()] == lab for img, lab in zip(raw, splits.test.y, strict=True))


def test_validation_from_the_test_files_keeps_every_training_image(tmp_path: Path) -> None:
    """The paper's split: N x 600 of MNIST's 60,000 train, validation a separate set (from the test files)."""
    data = write_mnist(tmp_path)
    splits = load_dataset("mnist", tmp_path, validation_size=2, test_size=0, validation_from="test")
    np.testing.assert_array_equal(splits.train.y, data["train"][1])  # all of train, in file order
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (N_TRAIN, 2, N_TEST - 2)
    test_table = image_table(*data["t10k"])
    seen = [np.rint(ds.x[:, 0] * 255).astype(np.uint8) for ds in (splits.validation, splits.test)]
    keys = [img.tobytes() for part in seen for img in part]
    assert sorted(keys) == sorted(test_table)  # validation + test == the test files, disjoint
    again = load_dataset("mnist", tmp_path, validation_size=2, test_size=2, validation_from="test")
    np.testing.assert_array_equal(again.validation.x, splits.validation.x)  # test_size never moves it
    assert len(again.test) == 2
    everything = load_dataset("mnist", tmp_path, validation_size=2, test_size=0)
    assert len(everything.test) == N_TEST and len(everything.train) == N_TRAIN - 2
    for bad, match in (
        ({"validation_from": "val"}, "validation_from"),
        ({"validation_from": "test", "validation_size": N_TEST}, "validation_size"),
        ({"validation_from": "test", "test_size": N_TEST}, "test_size"),
        ({"test_size": -1}, "test_size"),
    ):
        with pytest.raises(ValueError, match=match):
            load_dataset("mnist", tmp_path, **{"validation_size": 2, **bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="validation_from=train"):
        load_dataset("embedded", validation_from="test")


def test_fashion_mnist_layout(tmp_path: Path) -> None:
    write_mnist(tmp_path / "FashionMNIST" / "raw", gz=True)
    splits = load_dataset("fashion-mnist", tmp_path, validation_size=2, test_size=2)
    assert splits.train.name == "fashion_mnist" and len(splits.train) == N_TRAIN - 2


def test_mnist_bad_magic(tmp_path: Path) -> None:
    write_mnist(tmp_path)
    labels = mnist_arrays(N_TRAIN, 1)[1]
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(IDX_IMAGES_MAGIC, labels))
    with pytest.raises(ValueError, match="bad IDX magic number 0x00000803, expected 0x00000801"):
        load_dataset("mnist", tmp_path, validation_size=2, test_size=2)


@pytest.mark.parametrize("cut", [2, 10, 100])
def test_mnist_truncated(tmp_path: Path, cut: int) -> None:
    write_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    payload = path.read_bytes()
    path.write_bytes(payload[:cut] if cut < 16 else payload[:-cut])
    with pytest.raises(ValueError, match="truncated"):
        read_idx_images(path)
    with pytest.raises(ValueError, match="truncated"):
        load_dataset("mnist", tmp_path, validation_size=2, test_size=2)


def test_mnist_truncated_gzip(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=True)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ValueError, match="truncated"):
        load_dataset("mnist", tmp_path, validation_size=2, test_size=2)


def test_mnist_trailing_bytes_and_count_mismatch(tmp_path: Path) -> None:
    write_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes() + b"\x00")
    with pytest.raises(ValueError, match="unexpected bytes"):
        read_idx_images(path)
    labels = mnist_arrays(N_TRAIN - 1, 1)[1]
    write_mnist(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(IDX_LABELS_MAGIC, labels))
    with pytest.raises(ValueError, match=r"12 images but .* 11 labels"):
        load_dataset("mnist", tmp_path, validation_size=2, test_size=2)


def test_mnist_missing_file(tmp_path: Path) -> None:
    write_mnist(tmp_path / "MNIST" / "raw")
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_dataset("mnist", tmp_path, validation_size=2, test_size=2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset("mnist", tmp_path / "nowhere")


def cifar_batch(n: int, first_label: int, tag: int) -> dict[bytes, object]:
    """One batch in the official layout: rows of 1024 red, 1024 green, 1024 blue values."""
    planes = np.zeros((n, 3, 32, 32), dtype=np.uint8)
    planes[:, 0] = 10
    planes[:, 1] = 20
    planes[:, 2] = 30
    for i in range(n):
        planes[i, 0, 0, 5] = 255
        planes[i, 2, 31, 31] = tag  # identifies the batch and image
        planes[i, 1, 7, 3] = i
    return {
        b"batch_label": b"training batch",
        b"labels": [(first_label + i) % 10 for i in range(n)],
        b"data": planes.reshape(n, 3072),
        b"filenames": [f"img_{tag}_{i}.png".encode() for i in range(n)],
    }


def write_cifar(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for b in range(1, 6):
        with (directory / f"data_batch_{b}").open("wb") as f:
            pickle.dump(cifar_batch(3, b, tag=b), f, protocol=2)
    with (directory / "test_batch").open("wb") as f:
        pickle.dump(cifar_batch(4, 7, tag=99), f, protocol=2)


def test_cifar10_loader(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar-10-batches-py")
    splits = load_dataset("cifar10", tmp_path, validation_size=5, test_size=4)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (10, 5, 4)
    assert splits.input_shape == (3, 32, 32) and splits.num_classes == 10
    for ds in (splits.train, splits.validation, splits.test):
        assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64 and ds.x.shape[1:] == (3, 32, 32)
        np.testing.assert_array_equal(ds.x[:, 0, 0, 5], 1.0)
        np.testing.assert_array_equal(ds.x[:, 0, 0, 0], np.float32(10) / np.float32(255))
        np.testing.assert_array_equal(ds.x[:, 1, 31, 0], np.float32(20) / np.float32(255))
        np.testing.assert_array_equal(ds.x[:, 2, 0, 0], np.float32(30) / np.float32(255))
    np.testing.assert_array_equal(splits.test.y, [7, 8, 9, 0])
    np.testing.assert_array_equal(np.rint(splits.test.x[:, 1, 7, 3] * 255), [0, 1, 2, 3])
    pool = np.concatenate([splits.train.x, splits.validation.x])
    pool_y = np.concatenate([splits.train.y, splits.validation.y])
    keys = sorted(
        (round(float(t) * 255), round(float(i) * 255), int(lab))
        for t, i, lab in zip(pool[:, 2, 31, 31], pool[:, 1, 7, 3], pool_y, strict=True)
    )
    assert keys == sorted((b, i, (b + i) % 10) for b in range(1, 6) for i in range(3))


def test_cifar10_flat_layout(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    splits = load_dataset("cifar10", tmp_path, validation_size=1, test_size=2)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (14, 1, 2)


def test_cifar10_errors(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    (tmp_path / "test_batch").unlink()
    with pytest.raises(FileNotFoundError, match="test_batch"):
        load_dataset("cifar10", tmp_path, validation_size=1, test_size=1)
    bad = cifar_batch(2, 0, tag=1)
    bad[b"data"] = np.zeros((2, 3000), dtype=np.uint8)
    with (tmp_path / "test_batch").open("wb") as f:
        pickle.dump(bad, f, protocol=2)
    with pytest.raises(ValueError, match=r"shape \(n, 3072\)"):
        load_dataset("cifar10", tmp_path, validation_size=1, test_size=1)
    (tmp_path / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a readable CIFAR-10 python batch"):
        load_dataset("cifar10", tmp_path, validation_size=1, test_size=1)


class _Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("unpickled a foreign global",))


def test_cifar10_refuses_foreign_globals(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    with (tmp_path / "data_batch_3").open("wb") as f:
        pickle.dump({b"data": _Exploit(), b"labels": []}, f, protocol=2)
    with pytest.raises(ValueError, match=r"\.print is not allowed"):
        load_dataset("cifar10", tmp_path, validation_size=1, test_size=1)


def test_registry_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pass data_dir"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="unknown data set"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="leaves no training images"):
        load_dataset("embedded", validation_size=2500, test_size=2500)
    with pytest.raises(ValueError, match="validation_size must be >= 1"):
        load_dataset("embedded", validation_size=0)
    write_mnist(tmp_path)
    with pytest.raises(ValueError, match="test files hold only 5 images"):
        load_dataset("mnist", tmp_path, validation_size=2, test_size=6)
    with pytest.raises(ValueError, match="leaves no training images"):
        load_dataset("mnist", tmp_path, validation_size=N_TRAIN, test_size=2)


def test_embedded_full_set() -> None:
    full = load_embedded()
    assert len(full) == 5000 and full.num_classes == 10 and full.input_shape == (1, 28, 28)
    assert full.x.dtype == np.float32 and full.y.dtype == np.int64
    assert float(full.x.min()) == 0.0 and float(full.x.max()) == 1.0
    np.testing.assert_array_equal(np.bincount(full.y), [500] * 10)
    full.y[0] = 9  # callers get copies: the cache stays intact
    assert load_embedded().y[0] == 0


def test_embedded_splits() -> None:
    splits = load_dataset()
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (3000, 1000, 1000)
    full = load_embedded()
    keys = [ds.x.reshape(len(ds), -1) for ds in (splits.train, splits.validation, splits.test)]
    rows = np.concatenate(keys)
    # Each split is a subset of the full set and together they are a permutation of it (disjoint).
    order = np.lexsort(rows.T[::-1])
    full_rows = full.x.reshape(5000, -1)
    np.testing.assert_array_equal(rows[order], full_rows[np.lexsort(full_rows.T[::-1])])
    for ds in (splits.train, splits.validation, splits.test):
        assert set(np.unique(ds.y)) == set(range(10))
    again = load_dataset("embedded", seed=0)
    np.testing.assert_array_equal(again.validation.x, splits.validation.x)
    np.testing.assert_array_equal(again.test.y, splits.test.y)
    other = load_dataset("embedded", seed=1)
    assert not np.array_equal(other.validation.y, splits.validation.y)
    small = load_dataset("embedded", validation_size=100, test_size=200)
    assert (len(small.train), len(small.validation), len(small.test)) == (4700, 100, 200)


def test_array_dataset_validation() -> None:
    x = np.zeros((3, 1, 2, 2), dtype=np.float32)
    y = np.array([0, 1, 2], dtype=np.int64)
    ds = ArrayDataset(x=x, y=y, num_classes=3, name="t")
    assert len(ds.subset([2, 0])) == 2 and ds.subset([2, 0]).y.tolist() == [2, 0]
    with pytest.raises(ValueError, match="float32"):
        ArrayDataset(x=x.astype(np.float64), y=y, num_classes=3, name="t")
    with pytest.raises(ValueError, match="int64"):
        ArrayDataset(x=x, y=y.astype(np.int32), num_classes=3, name="t")
    with pytest.raises(ValueError, match=r"labels must lie in 0\.\.1"):
        ArrayDataset(x=x, y=y, num_classes=2, name="t")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ArrayDataset(x=x + 2, y=y, num_classes=3, name="t")
    with pytest.raises(ValueError, match="shape"):
        ArrayDataset(x=x[:, 0], y=y, num_classes=3, name="t")
    with pytest.raises(ValueError, match="3 images but y has 2"):
        ArrayDataset(x=x, y=y[:2], num_classes=3, name="t")
    with pytest.raises(ValueError, match="subset indices"):
        ds.subset([3])
