"""Write the tabular example's files: each member's own CSV, the coordinator's validation and test sets.

Real data that ships with scikit-learn (no download): the Wisconsin breast-cancer table, 569 patients,
30 features, benign or malignant. Eight members of different sizes; member 5 has its labels wrong.

    python examples/tabular/prepare.py --out examples/tabular/data
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer

SIZES = (20, 24, 30, 34, 40, 44, 60, 67)  # rows per member, 319 in all
WRONG_LABELS = 5  # this member's labels are all flipped
VALIDATION, TEST = 150, 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).with_name("data")), help="folder to write into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle")
    args = parser.parse_args()
    table = load_breast_cancer(as_frame=True).frame  # 30 feature columns and "target"
    rng = np.random.default_rng(args.seed)
    table = table.iloc[rng.permutation(len(table))].reset_index(drop=True)
    features = table.columns.drop("target")
    # One scaling for every member (in a real federation the members agree on it up front).
    table[features] = (table[features] - table[features].mean()) / table[features].std()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.iloc[:VALIDATION].to_csv(out / "validation.csv", index=False)
    table.iloc[VALIDATION : VALIDATION + TEST].to_csv(out / "test.csv", index=False)
    start = VALIDATION + TEST
    for rank, size in enumerate(SIZES):
        part = table.iloc[start : start + size].copy()
        start += size
        if rank == WRONG_LABELS:
            part["target"] = 1 - part["target"]
        part.to_csv(out / f"member{rank}.csv", index=False)
    assert start == len(table), (start, len(table))
    print(f"wrote validation.csv, test.csv and member0..{len(SIZES) - 1}.csv into {out}")


if __name__ == "__main__":
    main()
