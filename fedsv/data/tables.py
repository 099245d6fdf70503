"""read_table: a .csv, .tsv or .parquet table as Samples: one column the labels, all others the features."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedsv.data.samples import DataError, Samples, check_classes, require_file, wrap_error

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")
"""File name endings read_table reads (case-insensitive)."""

_NUMERIC_KINDS = "biuf"
_TEXT_KINDS = "OSU"
_SHOWN_CLASSES = 20


def read_table(path: str | Path, label: str, classes: Sequence[str] | None = None) -> Samples:
    """Samples from a table with a header row: column `label` holds the class labels, every other column
    (in file order) is a numeric feature.

    Integer labels >= 0 are used as they are; string labels need `classes`, the class names in label order.
    """
    frame = _read_frame(path, require_file(path))
    if len(frame) == 0:
        raise DataError(f"{path}: the table has no data rows")
    columns = [str(c) for c in frame.columns]
    if label not in columns:
        raise DataError(f"{path}: no label column {label!r}; the columns are {columns}")
    label_at = columns.index(label)
    feature_at = [i for i in range(len(columns)) if i != label_at]
    if not feature_at:
        raise DataError(f"{path}: the table has no feature columns besides the label column {label!r}")
    x = np.stack([_feature(path, frame.iloc[:, i], columns[i]) for i in feature_at], axis=1)
    y = _labels(path, frame.iloc[:, label_at], label, classes)
    return Samples(x=x, y=y, name=str(path))


def _read_frame(path: str | Path, file: Path) -> Any:
    """The file as a pandas DataFrame; DataError if it is no table or cannot be parsed."""
    import pandas as pd

    suffix = file.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path, file)
    if suffix not in (".csv", ".tsv"):
        raise DataError(f"{path}: not a table; read_table reads {', '.join(TABLE_SUFFIXES)} files")
    try:
        with warnings.catch_warnings():
            # index_col=False: never take a first column as the index; pandas warns when rows have extra
            # (non-empty) fields, which it would drop.
            warnings.simplefilter("error", pd.errors.ParserWarning)
            return pd.read_csv(file, sep="," if suffix == ".csv" else "\t", index_col=False, low_memory=False)
    except pd.errors.ParserWarning as exc:
        raise DataError(f"{path}: some data rows have more fields than the header row") from exc
    except (OSError, ValueError) as exc:  # ParserError, EmptyDataError and UnicodeDecodeError are ValueErrors
        raise wrap_error(path, f"cannot read as a {suffix[1:].upper()} table", exc) from exc


def _read_parquet(path: str | Path, file: Path) -> Any:
    import pandas as pd

    try:
        import pyarrow
    except ImportError as exc:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install fedsv[tables]") from exc
    try:
        return pd.read_parquet(file, engine="pyarrow")
    except (OSError, ValueError, pyarrow.ArrowException) as exc:
        raise wrap_error(path, "cannot read as a Parquet table", exc) from exc


def _first_row(mask: np.ndarray) -> int | None:
    """1-based data row of the first True in `mask`, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) + 1 if hits.size else None


def _feature(path: str | Path, column: Any, name: str) -> np.ndarray:
    """One feature column as float32; DataError for a missing, non-numeric or infinite value."""
    import pandas as pd

    row = _first_row(column.isna().to_numpy())
    if row is not None:
        raise DataError(f"{path}: feature column {name!r} has a missing value in row {row}")
    kind = column.dtype.kind
    if kind not in _NUMERIC_KINDS:
        if kind not in _TEXT_KINDS:
            raise DataError(f"{path}: feature column {name!r} holds {column.dtype} values, not numbers")
        numbers = pd.to_numeric(column, errors="coerce")
        row = _first_row(numbers.isna().to_numpy())
        if row is not None:
            value = column.iloc[row - 1]
            raise DataError(
                f"{path}: feature column {name!r} is not numeric (row {row} holds {value!r}); "
                "encode it as numbers or drop the column"
            )
        column = numbers
    values = column.to_numpy(dtype=np.float64)
    row = _first_row(~np.isfinite(values))
    if row is not None:
        raise DataError(f"{path}: feature column {name!r} has an infinite value in row {row}")
    return values.astype(np.float32)


def _labels(path: str | Path, column: Any, label: str, classes: Sequence[str] | None) -> np.ndarray:
    """The label column as int64 class indices >= 0."""
    row = _first_row(column.isna().to_numpy())
    if row is not None:
        raise DataError(f"{path}: label column {label!r} has a missing value in row {row}")
    kind = column.dtype.kind
    if kind not in _NUMERIC_KINDS:
        return _named_labels(path, [str(v) for v in column.tolist()], label, classes)
    values = column.to_numpy(dtype=np.float64 if kind == "f" else np.int64)
    row = _first_row(~np.isfinite(values) | (values != np.round(values))) if kind == "f" else None
    if row is not None:
        raise DataError(
            f"{path}: label {values[row - 1]} in row {row} of column {label!r} is not an integer; "
            "labels are class indices 0..K-1"
        )
    y = values.astype(np.int64)
    row = _first_row(y < 0)
    if row is not None:
        raise DataError(
            f"{path}: label {y[row - 1]} in row {row} is negative; labels are class indices 0..K-1"
        )
    if classes is not None:
        names = check_classes(path, classes)
        row = _first_row(y >= len(names))
        if row is not None:
            raise DataError(
                f"{path}: label {y[row - 1]} in row {row} is not below len(classes) = {len(names)}"
            )
    return y


def _named_labels(
    path: str | Path, values: list[str], label: str, classes: Sequence[str] | None
) -> np.ndarray:
    """String labels mapped to their index in `classes`."""
    if classes is None:
        raise DataError(
            f"{path}: label column {label!r} holds strings such as {values[0]!r}; "
            "pass classes=[...] (the class names in label order) or encode labels as integers 0..K-1"
        )
    names = check_classes(path, classes)
    index = {name: i for i, name in enumerate(names)}
    for row, value in enumerate(values, start=1):
        if value not in index:
            shown = names[:_SHOWN_CLASSES] + (["..."] if len(names) > _SHOWN_CLASSES else [])
            raise DataError(f"{path}: label {value!r} in row {row} is not one of the classes {shown}")
    return np.array([index[v] for v in values], dtype=np.int64)
