"""read_image_folder: a folder of images, one sub-folder per class, as Samples of shape (n, C, H, W)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from fedsv.data.samples import DataError, Samples, check_classes, wrap_error

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
"""File name endings read as images (case-insensitive); other files in the class folders are ignored."""

_GRAY_8BIT = frozenset({"1", "L", "LA"})
_GRAY_16BIT = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})
_READ_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


def read_image_folder(path: str | Path, classes: Sequence[str] | None = None) -> Samples:
    """Samples from `path/CLASS_NAME/*.{png,jpg,jpeg,bmp,gif}`: label = index of CLASS_NAME in `classes`
    (default: the sorted sub-folder names).

    All images must have the same size. If every image is grayscale x has 1 channel, otherwise all are
    converted to RGB (3 channels); values are float32 in [0, 1]. Files are read in sorted order (by
    sub-folder, then file name) whatever the order of `classes`; hidden files and folders (names starting
    with ".") are skipped.
    """
    root = Path(path)
    if not root.exists():
        raise DataError(f"{path}: no such file or folder")
    if not root.is_dir():
        raise DataError(f"{path}: not a folder")
    names = _class_names(path, root, classes)
    label_of = {name: label for label, name in enumerate(names)}
    files = [(file, label_of[name]) for name in sorted(names) for file in _image_files(path, root / name)]
    if not files:
        raise DataError(
            f"{path}: no images ({', '.join(IMAGE_SUFFIXES)}) in the class sub-folders {names[:20]}"
        )
    images = _read_all(path, root, [file for file, _ in files])
    y = np.array([label for _, label in files], dtype=np.int64)
    return Samples(x=_stack(images), y=y, name=str(path))


def _listdir(path: str | Path, folder: Path) -> list[Path]:
    """The visible entries of `folder`, sorted by name."""
    try:
        return sorted(entry for entry in folder.iterdir() if not entry.name.startswith("."))
    except OSError as exc:
        raise wrap_error(path, f"cannot list {folder}", exc) from exc


def _class_names(path: str | Path, root: Path, classes: Sequence[str] | None) -> list[str]:
    found = [entry.name for entry in _listdir(path, root) if entry.is_dir()]
    if classes is None:
        if not found:
            raise DataError(f"{path}: no class sub-folders; expected images in {path}/CLASS_NAME/")
        return found
    names = check_classes(path, classes)
    extra = [name for name in found if name not in names]
    if extra:
        raise DataError(f"{path}: sub-folders {extra} are not among the classes {names[:20]}")
    return names


def _image_files(path: str | Path, folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    entries = _listdir(path, folder)
    return [entry for entry in entries if entry.suffix.lower() in IMAGE_SUFFIXES and entry.is_file()]


def _read_all(path: str | Path, root: Path, files: list[Path]) -> list[np.ndarray]:
    """Each file as float32 (C, H, W) in [0, 1]; DataError for an unreadable file or a differing size."""
    first_size: tuple[int, int] | None = None
    out = []
    for file in files:
        where = file.relative_to(root)
        try:
            with Image.open(file) as img:
                img.load()
                size = img.size
                array = _to_array(img)
        except _READ_ERRORS as exc:
            raise DataError(f"{path}: cannot read {where} as an image ({exc})") from exc
        if first_size is None:
            first_size = size
        elif size != first_size:
            raise DataError(
                f"{path}: {where} is {size[0]}x{size[1]} pixels but {files[0].relative_to(root)} is "
                f"{first_size[0]}x{first_size[1]}; all images must have the same size"
            )
        out.append(array)
    return out


def _to_array(img: Image.Image) -> np.ndarray:
    """float32 (1, H, W) for a grayscale image, (3, H, W) RGB for any other, values in [0, 1]."""
    if img.mode in _GRAY_8BIT:
        return (np.asarray(img.convert("L"), dtype=np.float32) / np.float32(255.0))[None]
    if img.mode in _GRAY_16BIT:
        gray = np.asarray(img, dtype=np.float32) / np.float32(65535.0)
        return np.clip(gray, 0.0, 1.0)[None]
    rgb = np.asarray(img.convert("RGB"), dtype=np.float32) / np.float32(255.0)
    return rgb.transpose(2, 0, 1)


def _stack(images: list[np.ndarray]) -> np.ndarray:
    """(n, C, H, W): C = 1 if every image is grayscale, else 3 (grayscale ones repeated to RGB)."""
    channels = max(image.shape[0] for image in images)
    return np.stack([np.repeat(image, channels // image.shape[0], axis=0) for image in images])
