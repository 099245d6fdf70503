"""fedsv.data.sources: every format written to tmp_path and read back, and one-line DataErrors."""

from __future__ import annotations

import gzip
import pickle
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedsv.data.mnist_idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC
from fedsv.data.sources import (
    DataError,
    Samples,
    read_cifar10_samples,
    read_data,
    read_idx_samples,
    read_image_folder,
    read_npz,
    read_table,
)


def assert_one_line(exc: pytest.ExceptionInfo[DataError], path: Path | str) -> str:
    message = str(exc.value)
    assert "\n" not in message and "\r" not in message, message
    assert str(path) in message, message
    return message


def write_idx(path: Path, magic: int, array: np.ndarray, *, compress: bool = False) -> None:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def write_png(path: Path, array: np.ndarray, mode: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode=mode).save(path)


def gray(value: int, size: tuple[int, int] = (4, 5)) -> np.ndarray:
    return np.full(size, value, dtype=np.uint8)


def make_gray_folder(root: Path) -> Path:
    write_png(root / "cat" / "b.png", gray(255), "L")
    write_png(root / "cat" / "a.png", gray(0), "L")
    write_png(root / "dog" / "c.png", gray(51), "L")
    (root / "dog" / "notes.txt").write_text("not an image, ignored")
    return root


# ---- Samples ---------------------------------------------------------------------------------------------


def test_samples_properties_and_subset() -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    s = Samples(x=x, y=np.array([0, 2, 1, 2], dtype=np.int64), name="mem")
    assert len(s) == 4 and s.num_classes == 3 and s.feature_shape == (3,)
    sub = s.subset([3, 0])
    assert sub.y.tolist() == [2, 0] and sub.x[0].tolist() == [9.0, 10.0, 11.0] and sub.name == "mem"


@pytest.mark.parametrize(
    ("x", "y", "words"),
    [
        (np.zeros((2, 3), np.float64), np.zeros(2, np.int64), "float32"),
        (np.zeros(2, np.float32), np.zeros(2, np.int64), "ndim"),
        (np.zeros((2, 3), np.float32), np.zeros(2, np.int32), "int64"),
        (np.zeros((2, 3), np.float32), np.zeros(3, np.int64), "3 labels"),
        (np.zeros((0, 3), np.float32), np.zeros(0, np.int64), "no samples"),
        (np.array([[0.0, np.nan]], np.float32), np.zeros(1, np.int64), "NaN"),
        (np.zeros((1, 3), np.float32), np.array([-1], np.int64), ">= 0"),
    ],
)
def test_samples_validation(x: np.ndarray, y: np.ndarray, words: str) -> None:
    with pytest.raises(DataError) as exc:
        Samples(x=x, y=y, name="mem-name")
    assert words in assert_one_line(exc, "mem-name")


# ---- reading every format ------------------------------------------------------------------------------


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz(tmp_path: Path, save: Callable[..., None]) -> None:
    path = tmp_path / "d.npz"
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    save(path, x=x, y=np.array([1, 0], dtype=np.uint8))
    s = read_npz(path)
    assert s.x.dtype == np.float32 and s.x.shape == (2, 3, 4) and np.array_equal(s.x, x)
    assert s.y.dtype == np.int64 and s.y.tolist() == [1, 0] and s.name == str(path)
    assert read_data(path).feature_shape == (3, 4)


def test_npz_whole_float_labels_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((2, 2), np.int32), y=np.array([2.0, 0.0]))
    assert read_npz(path).y.tolist() == [2, 0]


def test_csv_with_integer_labels(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("f1,label,f2\n1.5,0,2\n-3,2,4\n0,1,0.25\n")
    s = read_table(path, "label")
    assert s.x.dtype == np.float32 and s.x.tolist() == [[1.5, 2.0], [-3.0, 4.0], [0.0, 0.25]]
    assert s.y.dtype == np.int64 and s.y.tolist() == [0, 2, 1] and s.num_classes == 3
    assert read_data(path, label="label").x.shape == (3, 2)


def test_tsv(tmp_path: Path) -> None:
    path = tmp_path / "t.tsv"
    path.write_text("a\tb\ty\n1\t2\t1\n3\t4\t0\n")
    s = read_data(path, label="y")
    assert s.x.tolist() == [[1.0, 2.0], [3.0, 4.0]] and s.y.tolist() == [1, 0]


def test_csv_with_string_labels_and_classes(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("species,w\nsetosa,1\nvirginica,2\nversicolor,3\nsetosa,4\n")
    s = read_table(path, "species", classes=["setosa", "versicolor", "virginica"])
    assert s.y.tolist() == [0, 2, 1, 0] and s.x.tolist() == [[1.0], [2.0], [3.0], [4.0]]


def test_parquet(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    path = tmp_path / "t.parquet"
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [4, 5, 6], "flag": [True, False, True], "y": [1, 1, 0]})
    frame.to_parquet(path, engine="pyarrow")
    s = read_data(path, label="y")
    assert s.x.dtype == np.float32 and s.x.tolist() == [[1.0, 4.0, 1.0], [2.0, 5.0, 0.0], [3.0, 6.0, 1.0]]
    assert s.y.tolist() == [1, 1, 0]


def test_parquet_with_string_labels(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    path = tmp_path / "t.parquet"
    pd.DataFrame({"x": [0.5, 1.5], "kind": ["b", "a"]}).to_parquet(path, engine="pyarrow")
    assert read_table(path, "kind", classes=["a", "b"]).y.tolist() == [1, 0]


def test_image_folder_grayscale(tmp_path: Path) -> None:
    root = make_gray_folder(tmp_path / "imgs")
    s = read_image_folder(root)
    assert s.x.dtype == np.float32 and s.x.shape == (3, 1, 4, 5)
    # sorted classes (cat, dog), files sorted within a class: cat/a (0), cat/b (255), dog/c (51)
    assert s.y.tolist() == [0, 0, 1]
    assert s.x[:, 0, 0, 0].tolist() == pytest.approx([0.0, 1.0, 0.2])
    assert read_data(root).x.shape == (3, 1, 4, 5)


def test_image_folder_with_given_classes(tmp_path: Path) -> None:
    root = make_gray_folder(tmp_path / "imgs")
    s = read_image_folder(root, classes=["dog", "bird", "cat"])
    assert s.y.tolist() == [2, 2, 0]  # still read in sorted order: cat/a, cat/b, dog/c


def test_image_folder_rgb_mixed_with_grayscale(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    rgb = np.zeros((4, 5, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 255, 51, 0
    write_png(root / "a" / "red.png", rgb, "RGB")
    write_png(root / "b" / "gray.png", gray(102), "L")
    s = read_image_folder(root)
    assert s.x.shape == (2, 3, 4, 5) and s.y.tolist() == [0, 1]
    assert s.x[0, :, 2, 3].tolist() == pytest.approx([1.0, 0.2, 0.0])
    assert s.x[1, :, 2, 3].tolist() == pytest.approx([0.4, 0.4, 0.4])


@pytest.mark.parametrize("compress", [False, True])
def test_idx_pair(tmp_path: Path, compress: bool) -> None:
    suffix = ".gz" if compress else ""
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4) * 10
    path = tmp_path / f"train-images-idx3-ubyte{suffix}"
    write_idx(path, IDX_IMAGES_MAGIC, images, compress=compress)
    write_idx(
        tmp_path / f"train-labels-idx1-ubyte{suffix}", IDX_LABELS_MAGIC, np.array([7, 3]), compress=compress
    )
    s = read_idx_samples(path)
    assert s.x.dtype == np.float32 and s.x.shape == (2, 1, 3, 4)
    assert np.allclose(s.x[:, 0], images / 255.0) and s.y.tolist() == [7, 3]
    assert read_data(path).y.tolist() == [7, 3]


def test_cifar10_batch(tmp_path: Path) -> None:
    data = np.zeros((2, 3072), dtype=np.uint8)
    data[0, :1024] = 255  # red plane of image 0
    data[1, 2048:] = 51  # blue plane of image 1
    path = tmp_path / "data_batch_1"
    with path.open("wb") as f:
        pickle.dump({b"batch_label": b"training batch 1 of 5", b"data": data, b"labels": [6, 9]}, f)
    s = read_cifar10_samples(path)
    assert s.x.dtype == np.float32 and s.x.shape == (2, 3, 32, 32) and s.y.tolist() == [6, 9]
    assert s.x[0, :, 5, 5].tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert s.x[1, :, 5, 5].tolist() == pytest.approx([0.0, 0.0, 0.2])
    assert read_data(path).num_classes == 10


# ---- failures: one-line DataError naming the path -------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.npz"
    for read in (read_data, read_npz, read_idx_samples, read_cifar10_samples, read_image_folder):
        with pytest.raises(DataError) as exc:
            read(path)
        assert "no such file" in assert_one_line(exc, path)


def test_npz_without_y(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((2, 2)), labels=np.zeros(2))
    with pytest.raises(DataError) as exc:
        read_data(path)
    message = assert_one_line(exc, path)
    assert "'y'" in message and "labels" in message


def test_npz_with_non_integer_labels(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((2, 2)), y=np.array([1.0, 1.5]))
    with pytest.raises(DataError) as exc:
        read_npz(path)
    assert "1.5" in assert_one_line(exc, path)


def test_npz_that_is_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    path.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(DataError) as exc:
        read_npz(path)
    assert_one_line(exc, path)


def test_csv_without_the_label_column(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(DataError) as exc:
        read_table(path, "label")
    message = assert_one_line(exc, path)
    assert "'label'" in message and "['a', 'b']" in message


def test_csv_with_non_numeric_feature(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,color,y\n1,2,0\n3,red,1\n")
    with pytest.raises(DataError) as exc:
        read_table(path, "y")
    message = assert_one_line(exc, path)
    assert "'color'" in message and "row 2" in message and "red" in message


def test_csv_with_empty_cell(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,y\n1,2,0\n3,4,1\n5,,1\n")
    with pytest.raises(DataError) as exc:
        read_table(path, "y")
    message = assert_one_line(exc, path)
    assert "'b'" in message and "row 3" in message and "missing" in message


def test_csv_with_string_labels_without_classes(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,y\n1,cat\n2,dog\n")
    with pytest.raises(DataError) as exc:
        read_table(path, "y")
    message = assert_one_line(exc, path)
    assert "classes=[...]" in message and "integers 0..K-1" in message


def test_csv_with_unknown_string_label(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,y\n1,cat\n2,emu\n")
    with pytest.raises(DataError) as exc:
        read_table(path, "y", classes=["cat", "dog"])
    message = assert_one_line(exc, path)
    assert "'emu'" in message and "row 2" in message


def test_csv_with_non_integer_label(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,y\n1,0\n2,1.5\n")
    with pytest.raises(DataError) as exc:
        read_table(path, "y")
    assert "1.5" in assert_one_line(exc, path)


def test_image_folder_with_mixed_sizes(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    write_png(root / "a" / "1.png", gray(0, (4, 5)), "L")
    write_png(root / "b" / "2.png", gray(0, (6, 5)), "L")
    with pytest.raises(DataError) as exc:
        read_image_folder(root)
    message = assert_one_line(exc, root)
    assert "2.png" in message and "5x6" in message and "5x4" in message


def test_image_folder_with_a_broken_png(tmp_path: Path) -> None:
    root = make_gray_folder(tmp_path / "imgs")
    (root / "dog" / "broken.png").write_bytes(b"this is not a png")
    with pytest.raises(DataError) as exc:
        read_data(root)
    assert "broken.png" in assert_one_line(exc, root)


def test_empty_folder(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    with pytest.raises(DataError) as exc:
        read_data(root)
    assert_one_line(exc, root)
    (root / "cat").mkdir()
    with pytest.raises(DataError) as exc:
        read_image_folder(root)
    assert "no images" in assert_one_line(exc, root)


def test_image_folder_with_a_folder_not_in_classes(tmp_path: Path) -> None:
    root = make_gray_folder(tmp_path / "imgs")
    with pytest.raises(DataError) as exc:
        read_image_folder(root, classes=["cat"])
    assert "'dog'" in assert_one_line(exc, root)


def test_unsupported_extension(tmp_path: Path) -> None:
    path = tmp_path / "sheet.xlsx"
    path.write_bytes(b"PK")
    with pytest.raises(DataError) as exc:
        read_data(path, label="y")
    message = assert_one_line(exc, path)
    assert ".npz" in message and ".csv" in message


def test_idx_images_without_labels_file(tmp_path: Path) -> None:
    path = tmp_path / "t10k-images-idx3-ubyte"
    write_idx(path, IDX_IMAGES_MAGIC, np.zeros((2, 3, 3)))
    with pytest.raises(DataError) as exc:
        read_data(path)
    assert "t10k-labels-idx1-ubyte" in assert_one_line(exc, path)


def test_truncated_idx_file(tmp_path: Path) -> None:
    path = tmp_path / "train-images-idx3-ubyte"
    write_idx(path, IDX_IMAGES_MAGIC, np.zeros((2, 3, 3)))
    path.write_bytes(path.read_bytes()[:-5])
    write_idx(tmp_path / "train-labels-idx1-ubyte", IDX_LABELS_MAGIC, np.zeros(2))
    with pytest.raises(DataError) as exc:
        read_idx_samples(path)
    assert "truncated" in assert_one_line(exc, path)


def test_truncated_gzip_idx_file(tmp_path: Path) -> None:
    path = tmp_path / "train-images-idx3-ubyte.gz"
    write_idx(path, IDX_IMAGES_MAGIC, np.zeros((2, 3, 3)), compress=True)
    path.write_bytes(path.read_bytes()[:-6])
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", IDX_LABELS_MAGIC, np.zeros(2), compress=True)
    with pytest.raises(DataError) as exc:
        read_data(path)
    assert_one_line(exc, path)


def test_cifar10_batch_that_is_not_one(tmp_path: Path) -> None:
    path = tmp_path / "test_batch"
    with path.open("wb") as f:
        pickle.dump({b"data": [1, 2]}, f)
    with pytest.raises(DataError) as exc:
        read_data(path)
    assert_one_line(exc, path)


def test_table_without_label(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,y\n1,0\n")
    with pytest.raises(DataError) as exc:
        read_data(path)
    assert "a table needs --label COLUMN" in assert_one_line(exc, path)


def test_relative_path_is_named_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("t.csv").write_text("a,y\n1,0\n2,x\n")
    with pytest.raises(DataError) as exc:
        read_data("./t.csv", label="y")
    assert_one_line(exc, "./t.csv")


def test_parquet_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` raise ImportError
    with pytest.raises(DataError) as exc:
        read_table(path, "y")
    assert "pip install fedsv[tables]" in assert_one_line(exc, path)


def test_csv_rows_longer_than_the_header(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,y\n1,0,\n2,1,\n")  # a trailing empty field is dropped
    assert read_table(path, "y").x.tolist() == [[1.0], [2.0]]
    path.write_text("a,y\n0,0,5\n1,1,5\n")
    with pytest.raises(DataError) as exc:
        read_table(path, "y")
    assert "more fields than the header" in assert_one_line(exc, path)


def test_npz_that_holds_one_npy_array(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    with path.open("wb") as f:
        np.save(f, np.zeros((2, 2)))
    with pytest.raises(DataError) as exc:
        read_npz(path)
    assert ".npy" in assert_one_line(exc, path)


def test_labelled_arrays_from_pairs_datasets_and_loaders() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from fedsv.data.collect import labelled_arrays

    x = torch.arange(24, dtype=torch.float32).reshape(6, 1, 2, 2)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    want_x, want_y = x.numpy(), y.numpy()
    dicts = [{"img": x[i : i + 2], "label": y[i : i + 2]} for i in range(0, 6, 2)]
    for data in (
        (x, y),
        (x.numpy(), y.numpy().astype(np.float64)),
        TensorDataset(x, y),
        DataLoader(TensorDataset(x, y), batch_size=4),
        dicts,  # a list of batches is a sequence of three: read as batches below
    ):
        if data is dicts:
            got_x, got_y = labelled_arrays(iter(dicts))
        else:
            got_x, got_y = labelled_arrays(data)
        assert got_x.dtype == np.float32 and got_y.dtype == np.int64
        np.testing.assert_array_equal(got_x, want_x)
        np.testing.assert_array_equal(got_y, want_y)
    with pytest.raises(ValueError, match="one label key"):
        labelled_arrays(iter([{"a": x, "b": x, "label": y}]))
    with pytest.raises(ValueError, match="whole class numbers"):
        labelled_arrays((x, y + 0.5))
    with pytest.raises(ValueError, match="need features"):
        labelled_arrays((x[:3], y))
