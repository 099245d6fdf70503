"""The ledger's valuation view: a round's values as rows, and rows back as valuation's accounting."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedsv.ledger.records import (
    ClassValueRow,
    FoldValueRow,
    RoundRecord,
    RoundStatus,
    ValuationSummary,
    ValueRow,
)
from fedsv.valuation import FederatedValuation, RoundValues
from fedsv.valuation.accounting.by_class import ClassValues, FoldValues
from fedsv.valuation.accounting.rounds import normalized


def status_of(values: RoundValues) -> RoundStatus:
    """VALUED, or NOT_VALUED for the utilities-only values of a run with valuation off."""
    return RoundStatus.NOT_VALUED if values.method == "none" else RoundStatus.VALUED


def value_rows(values: RoundValues) -> list[ValueRow]:
    """A round's values as ledger rows, with each vector's normalized form; none when valuation is off."""
    if values.method == "none":  # valuation off: the round's utilities only
        return []
    fedsv_norm, loo_norm = normalized(values.fedsv), normalized(values.loo)
    errors = np.full(len(values.participants), np.nan) if values.stderr is None else values.stderr
    player = {pid: group[0] for group in values.merged for pid in group}
    public = set(values.public)
    alike = {pid: group[0] for group in values.alike for pid in group}
    return [
        ValueRow(
            values.round,
            pid,
            float(values.fedsv[i]),
            float(values.loo[i]),
            float(fedsv_norm[i]),
            float(loo_norm[i]),
            float(errors[i]),
            player.get(pid, ""),
            pid in public,
            alike.get(pid, ""),
        )
        for i, pid in enumerate(values.participants)
    ]


def class_rows(values: RoundValues) -> list[ClassValueRow | FoldValueRow]:
    """A round's values per validation label and per validation fold as ledger rows; none where the
    round was not split."""
    if values.method == "none":
        return []
    rows: list[ClassValueRow | FoldValueRow] = []
    if values.classes is not None:
        classes = values.classes
        validation = (
            np.full(classes.values.shape, np.nan) if classes.validation is None else classes.validation
        )
        rows += [
            ClassValueRow(values.round, pid, label, float(value), float(error), float(valid))
            for i, pid in enumerate(values.participants)
            for label, (value, error, valid) in enumerate(
                zip(classes.values[i], classes.stderr[i], validation[i], strict=True)
            )
        ]
    if values.folds is not None:
        folds = values.folds
        rows += [
            FoldValueRow(values.round, pid, fold, float(folds.shares[fold]), float(fedsv), float(loo))
            for i, pid in enumerate(values.participants)
            for fold, (fedsv, loo) in enumerate(zip(folds.fedsv[i], folds.loo[i], strict=True))
        ]
    return rows


def valuation_summary(values: RoundValues, valued_at: float) -> ValuationSummary:
    """The fields a round's record gains from its values."""
    return ValuationSummary(
        utility_before=values.utility_before,
        utility_after=values.utility_after,
        method=values.method,
        evaluations=values.evaluations,
        valuation_seconds=values.seconds,
        group_rationality_residual=values.group_rationality_residual,
        valued_at=valued_at,
        max_stderr=values.max_stderr,
        status=status_of(values),
        valuation_cpu_seconds=values.cpu_seconds,
        valuation_choice=values.choice,
    )


def federated_valuation(
    records: Sequence[RoundRecord],
    rows: Sequence[ValueRow],
    world: Sequence[str] | None = None,
    classes: Sequence[ClassValueRow] = (),
    folds: Sequence[FoldValueRow] = (),
    initial_scores: Sequence[float] = (),
    balanced: bool = False,
) -> FederatedValuation:
    """The per-round values the ledger holds, back as valuation's accounting (rounds valued "none": none);
    `world`: every participant of the run and `initial_scores` the validation scores of other initial
    models, `balanced` whether it selected by the balanced rule (FederatedValuation; drew_balanced).

    A value row of a round the ledger has no record of is refused (ValueError): the two tables are
    written in one transaction, so such a row means the file was altered.
    """
    record_of = {record.round: record for record in records}
    by_round: dict[int, list[ValueRow]] = {}
    for row in rows:
        by_round.setdefault(row.round, []).append(row)
    accounting = FederatedValuation(world, initial_scores, balanced)
    classes_of: dict[int, list[ClassValueRow]] = {}
    for class_row in classes:
        classes_of.setdefault(class_row.round, []).append(class_row)
    folds_of: dict[int, list[FoldValueRow]] = {}
    for fold_row in folds:
        folds_of.setdefault(fold_row.round, []).append(fold_row)
    for number, round_rows in sorted(by_round.items()):
        record = record_of.get(number)
        if record is None:
            raise ValueError(f"the ledger holds values of round {number} but no record of that round")
        accounting.add_round(
            RoundValues(
                round=number,
                participants=[r.participant for r in round_rows],
                fedsv=np.array([r.fedsv for r in round_rows], dtype=np.float64),
                loo=np.array([r.loo for r in round_rows], dtype=np.float64),
                utility_before=record.utility_before,
                utility_after=record.utility_after,
                method=record.method,
                evaluations=record.evaluations,
                seconds=record.valuation_seconds,
                stderr=_recorded([r.fedsv_stderr for r in round_rows]),
                classes=_by_label(classes_of.get(number, []), [r.participant for r in round_rows]),
                folds=_by_fold(folds_of.get(number, []), [r.participant for r in round_rows]),
                selected=list(record.selected),
                merged=_linked(round_rows, "player"),
                public=[r.participant for r in round_rows if r.public],
                alike=_linked(round_rows, "alike"),
            )
        )
    return accounting


def _linked(rows: list[ValueRow], column: str) -> list[list[str]]:
    """The round's members linked by `column` (player: valued as one player; alike: looked redundant,
    valued apart), from each value's first member (a group of one is dropped: an altered file cannot
    name it)."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        if first := getattr(row, column):
            groups.setdefault(first, []).append(row.participant)
    return [group for group in groups.values() if len(group) > 1]


def _recorded(errors: list[float]) -> np.ndarray | None:
    """A round's standard errors as read back; None when the ledger did not record them."""
    array = np.array(errors, dtype=np.float64)
    return None if np.any(np.isnan(array)) else array


def _by_label(rows: list[ClassValueRow], participants: list[str]) -> ClassValues | None:
    """A round's values per label as read back (participants in the round's order); None if none."""
    if not rows:
        return None
    labels = 1 + max(r.label for r in rows)
    index = {pid: i for i, pid in enumerate(participants)}
    shape = (len(participants), labels)
    values, errors, validation = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for r in rows:
        at = (index[r.participant], r.label)
        values[at], errors[at], validation[at] = r.fedsv, r.stderr, r.validation
    return ClassValues(values, errors, None if np.isnan(validation).all() else validation)


def _by_fold(rows: list[FoldValueRow], participants: list[str]) -> FoldValues | None:
    """A round's values per validation fold as read back; None where the round was not split by fold."""
    if not rows:
        return None
    folds = 1 + max(r.fold for r in rows)
    index = {pid: i for i, pid in enumerate(participants)}
    fedsv, loo, shares = (
        np.zeros((len(participants), folds)),
        np.zeros((len(participants), folds)),
        np.zeros(folds),
    )
    for r in rows:
        fedsv[index[r.participant], r.fold], loo[index[r.participant], r.fold] = r.fedsv, r.loo
        shares[r.fold] = r.share
    return FoldValues(fedsv, loo, shares)


def drew_balanced(config: Mapping[str, Any]) -> bool:
    """Whether a run's recorded config selected by the balanced rule (a run recorded before the `draw`
    setting drew each round afresh, and its record has no `draw`)."""
    return config.get("draw") == "balanced"
