"""`fedsv report`: a run's values, accuracy and traffic from its ledger, as JSON, CSV, a plot and a table."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsv.app.report_owners import lookalikes, round_alike
from fedsv.app.report_verdict import verdict_entry
from fedsv.app.run_dirs import resolve_run
from fedsv.fl.ranks import participant_id
from fedsv.ledger import (
    EffectRow,
    Ledger,
    RoundRecord,
    UpdateRow,
    ValueRow,
    drew_balanced,
    federated_valuation,
)
from fedsv.settings.run import RunConfig
from fedsv.valuation.accounting.rounds import TOTAL_KEYS
from fedsv.valuation.accounting.verdict import differ
from fedsv.valuation.errors.valuation_noise import COMPONENTS

RECOMMENDED = "fedsv_shrunk"
"""The value to pay by (docs/valuation.md, "Which value to use"): every member valued in every round, so
that selection luck does not decide the pay, and pulled towards the members of its verdict group by
its noise, so that what the values cannot tell apart is paid nearly alike; reports rank by it and
`fedsv payout` splits by it."""

VERDICT_VALUE = "fedsv_completed"
"""The value the verdict tests: the evidence before the shrinkage (which pulls members together by the
very noise the test weighs; the recommended value is ranked and grouped the same way)."""

CSV_COLUMNS = (
    "participant",
    "rounds_selected",
    "rounds_refused",
    "rounds_quarantined",
    "rounds_public",
    "num_samples",
    *TOTAL_KEYS,
    *(f"{key}_stderr" for key in TOTAL_KEYS),
    "rank",
    "group",
    "separated_from_next",
)
"""values.csv: a participant's rounds (selected in; turned away or absent in; quarantined in; public in:
aggregated with the guard's screens off, its update holding nothing beyond the global model's recent
steps, so valued 0), its totals and their standard errors against a rerun (empty: unknown), its rank
by the recommended value, its group (members the verdict cannot tell apart share one), and whether it is
separated from the next rank at 95%."""


def _num(x: float | None) -> float | None:
    """JSON has no NaN or infinity: those become null."""
    return None if x is None or not math.isfinite(x) else float(x)


def _corrupted(config: dict[str, Any]) -> dict[str, str]:
    """Participant id -> corruption spec of the run's `corrupt` setting; empty if none or not a RunConfig."""
    try:
        ranks = RunConfig.from_record(config).corruptions()
    except (TypeError, ValueError):
        return {}
    return {participant_id(rank): spec for rank, spec in sorted(ranks.items())}


def _world(config: dict[str, Any]) -> list[str] | None:
    """Every participant id of a fedsv run's config (its `participants` count); None for other ledgers."""
    count = config.get("participants")
    return [participant_id(r) for r in range(count)] if isinstance(count, int) and count > 0 else None


def _round_entry(
    rec: RoundRecord, rows: list[ValueRow], updates: list[UpdateRow], effects: list[EffectRow]
) -> dict[str, Any]:
    return {
        "round": rec.round,
        "selected": rec.selected,
        "received": rec.received,
        "stragglers": rec.stragglers,
        "utility_before": _num(rec.utility_before),
        "utility_after": _num(rec.utility_after),
        "test_accuracy": _num(rec.test_accuracy),
        "test_loss": _num(rec.test_loss),
        "values": {r.participant: r.fedsv for r in rows},
        "public": [r.participant for r in rows if r.public],  # in every coalition, valued 0
        "alike": round_alike(rows),  # updates far more alike than independent data give, valued apart
        "stderr": {r.participant: _num(r.fedsv_stderr) for r in rows},
        "max_stderr": _num(rec.max_stderr),
        "status": str(rec.status),
        "absent": {pid: rec.absence(pid) for pid in rec.selected if rec.absence(pid) is not None},
        "loo": {r.participant: r.loo for r in rows},
        "num_samples": {u.participant: u.num_samples for u in updates},
        # the guard's reputation evidence: each update's effect on the round's validation loss
        "effects": {e.participant: {"effect": e.effect, "stderr": e.stderr} for e in effects},
        "method": rec.method,
        "valuation_choice": rec.valuation_choice,  # why that method, how its target ended ("": not recorded)
        "valuation_seconds": rec.valuation_seconds,
        "utility_evaluations": rec.evaluations,
        "round_seconds": rec.round_seconds,
        "bytes_up": rec.bytes_up,
        "bytes_down": rec.bytes_down,
        "messages_up": rec.messages_up,
        "messages_down": rec.messages_down,
        "model_bytes": rec.model_bytes,
        "physical_minimum_bytes": rec.physical_minimum_bytes,
        "bytes_ratio_to_minimum": _num(rec.bytes_ratio_to_minimum),
        "group_rationality_residual": _num(rec.group_rationality_residual),
    }


def build_report(run_dir: str | Path) -> dict[str, Any]:
    """The JSON-serializable report of the run in `run_dir` (its ledger opened read-only); a folder of
    runs (FedSVStrategy's ledger folder) reports its latest run (run_dirs.resolve_run)."""
    path, _ = resolve_run(run_dir)
    with Ledger(path, read_only=True) as ledger:
        run = ledger.run_config()
        records, rows, traffic_rows = ledger.rounds(), ledger.values(), ledger.traffic()
        updates, class_rows, fold_rows = ledger.updates(), ledger.class_values(), ledger.fold_values()
        initial, effects = ledger.initial_scores(), ledger.effects()
    if run is None:
        raise ValueError(f"{path} records no run yet")
    # every participant the run had, and any selected (in a round not valued yet too)
    world = list(dict.fromkeys([*(_world(run[1]) or []), *(p for rec in records for p in rec.selected)]))
    # refuses value rows of rounds it has no record of
    balanced = drew_balanced(run[1])
    valuation = federated_valuation(records, rows, world, class_rows, fold_rows, initial, balanced)
    classes = valuation.class_totals()
    completion = valuation.completed()[1] if valuation.per_round() else None
    rows_of: dict[int, list[ValueRow]] = {rec.round: [] for rec in records}
    for row in rows:
        rows_of[row.round].append(row)
    updates_of: dict[int, list[UpdateRow]] = {rec.round: [] for rec in records}
    for update in updates:
        updates_of.setdefault(update.round, []).append(update)
    effects_of: dict[int, list[EffectRow]] = {rec.round: [] for rec in records}
    for effect in effects:
        effects_of.setdefault(effect.round, []).append(effect)
    traffic: dict[str, dict[str, dict[str, int]]] = {}
    for t in traffic_rows:
        cell = traffic.setdefault(t.rpc, {}).setdefault(t.direction, {"bytes": 0, "messages": 0})
        cell["bytes"] += t.bytes
        cell["messages"] += t.messages
    total_bytes = sum(rec.bytes_up + rec.bytes_down for rec in records)
    minimum = sum(rec.physical_minimum_bytes for rec in records)
    n = max(1, len(records))
    # never selected in any round: no value at all, shown as not valued (never as a certain 0)
    drawn = {pid for rec in records for pid in rec.selected}
    not_valued = [pid for pid in valuation.participants() if pid not in drawn]
    values = _values(valuation, records, not_valued)
    owners = valuation.owners().shared()  # participants valued as one owner (merged in a round)
    rounds = [
        _round_entry(rec, rows_of[rec.round], updates_of[rec.round], effects_of[rec.round]) for rec in records
    ]
    return {
        "run_id": run[0],
        "config": run[1],
        "rounds": rounds,
        "recommended": RECOMMENDED,
        "totals": values.totals,
        "stderr": values.stderr,
        "stderr_between": values.between,
        "stderr_parts": values.parts,
        "pending_rounds": values.pending,
        "not_valued": not_valued,
        "owners": owners,
        "lookalikes": lookalikes(rounds),  # members valued apart whose updates looked like copies
        "verdict": verdict_entry(
            values.totals[VERDICT_VALUE],
            values.between[VERDICT_VALUE],
            owners,
            values.totals[RECOMMENDED],
            VERDICT_VALUE,
            RECOMMENDED,
        ),
        "completion": None
        if completion is None
        else {
            "model": completion.model,
            "holdout_rmse": _num(completion.holdout_rmse),
            "observed": completion.observed,
        },
        "classes": {
            "labels": classes.labels,
            "rounds_split": classes.rounds_split,
            "rounds": classes.rounds,
            "totals": {pid: [float(v) for v in values] for pid, values in classes.values.items()},
            "stderr": {pid: [_num(float(e)) for e in errors] for pid, errors in classes.stderr.items()},
        },
        "final_accuracy": _num(records[-1].test_accuracy) if records else None,
        "traffic": traffic,
        "summary": {
            "rounds": len(records),
            "participants": valuation.participants(),
            "bytes_up_per_round": sum(rec.bytes_up for rec in records) / n,
            "bytes_down_per_round": sum(rec.bytes_down for rec in records) / n,
            "bytes_per_round": total_bytes / n,
            "physical_minimum_bytes_per_round": minimum / n,
            "bytes_ratio_to_minimum": total_bytes / minimum if minimum > 0 else None,
            "corrupted": _corrupted(run[1]),
        },
    }


Table = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Values:
    """A run's totals with their errors against a rerun (`stderr`), against another member's (`between`:
    without the parts that move every member alike) and by part, and the rounds awaiting values."""

    totals: Table
    stderr: Table
    between: Table
    parts: dict[str, Table]
    pending: list[int]


def _values(valuation: Any, records: list[RoundRecord], not_valued: list[str]) -> Values:
    """Every participant's totals, their standard errors and their parts, and the rounds still awaiting
    their values. Nothing unknown is shown as known: with no round valued every total is None; a
    participant selected in a round awaiting its values has partial totals whose errors are None, and
    so has every completed total (it depends on every round); a participant of `not_valued` (never
    selected) has every total and error None."""
    pending = [rec.round for rec in records if rec.pending]
    ids = valuation.participants()
    if not valuation.per_round():
        empty: Table = {key: dict.fromkeys(ids) for key in TOTAL_KEYS}

        def copy() -> Table:
            return {k: dict(v) for k, v in empty.items()}

        return Values(empty, copy(), copy(), {p: copy() for p in COMPONENTS}, pending)
    partial = {pid for rec in records if rec.pending for pid in rec.selected}
    whole_run = ("fedsv_completed", "fedsv_shrunk")  # they depend on every round

    def known(table: Table) -> Table:
        return {
            key: {
                pid: None if (key in whole_run and pending) or pid in partial else _num(e)
                for pid, e in errors.items()
            }
            for key, errors in table.items()
        }

    by_part = {
        part: {key: {pid: _num(e) for pid, e in values.items()} for key, values in table.items()}
        for part, table in valuation.error_parts().items()
    }
    found = Values(
        valuation.totals(), known(valuation.errors()), known(valuation.between_errors()), by_part, pending
    )
    for table in (found.totals, found.stderr, found.between, *found.parts.values()):
        for column in table.values():
            column.update(dict.fromkeys(set(not_valued) & set(column)))
    return found


def ranked_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per participant of the run (the world and every one ever selected), best recommended value
    first; a total not known yet is None.

    Each row holds whether it was `valued` (False: never selected, every total None), every total with
    its standard error (None: unknown), its verdict group, its `owner`
    (the participants valued as one owner with it, owners.py; None: an owner alone), and
    `separated_from_next`: whether its recommended value differs from the next rank's at 95% (None for
    the last, or where an error is unknown)."""
    totals, errors = report["totals"], report.get("stderr", {})
    between = report.get("stderr_between", errors)  # a report written before it: the whole error
    recommended = report.get("recommended", "fedsv")
    selected: dict[str, int] = {}
    refused: dict[str, int] = {}
    quarantined: dict[str, int] = {}
    identical: dict[str, int] = {}
    public: dict[str, int] = {}
    samples: dict[str, int] = {}  # the count each declared in the last round it was aggregated in
    for entry in report["rounds"]:
        for pid in entry["selected"]:
            selected[pid] = selected.get(pid, 0) + 1
        for pid, why in entry.get("absent", {}).items():
            refused[pid] = refused.get(pid, 0) + 1
            if why == "quarantined":
                quarantined[pid] = quarantined.get(pid, 0) + 1
            if why == "identical_update":
                identical[pid] = identical.get(pid, 0) + 1
        for pid in entry.get("public", []):
            public[pid] = public.get(pid, 0) + 1
        samples.update(entry.get("num_samples", {}))
    ids = list(dict.fromkeys([*report["summary"]["participants"], *selected, *totals["fedsv"]]))
    groups = report.get("verdict", {}).get("groups", [])
    group_of = {pid: k for k, group in enumerate(groups, start=1) for pid in group}
    owner_of = {pid: owner for owner in report.get("owners", []) for pid in owner}
    not_valued = set(report.get("not_valued", []))

    def total(key: str, pid: str) -> float | None:
        value = totals.get(key, {}).get(pid)
        return None if value is None else float(value)

    rows: list[dict[str, Any]] = [
        {
            "participant": pid,
            "rounds_selected": selected.get(pid, 0),
            "valued": pid not in not_valued,
            "rounds_refused": refused.get(pid, 0),
            "rounds_quarantined": quarantined.get(pid, 0),
            "rounds_identical": identical.get(pid, 0),
            "rounds_public": public.get(pid, 0),
            "num_samples": samples.get(pid),
        }
        | {key: total(key, pid) for key in TOTAL_KEYS}
        | {f"{key}_stderr": errors.get(key, {}).get(pid) for key in TOTAL_KEYS}
        | {f"{key}_stderr_between": between.get(key, {}).get(pid) for key in TOTAL_KEYS}
        | {"group": group_of.get(pid), "owner": owner_of.get(pid)}
        for pid in ids
    ]
    rows.sort(key=lambda r: (r[recommended] is None, -(r[recommended] or 0.0), r["participant"]))
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
    for row, below in itertools.zip_longest(rows, rows[1:]):
        row["separated_from_next"] = None if below is None else separated(row, below, recommended)
    return rows


def separated(a: dict[str, Any], b: dict[str, Any], key: str = RECOMMENDED) -> bool | None:
    """Whether two rows' `key` totals differ at 95%, by their errors against each other (the parts that
    move every member alike left out); None when either is unknown."""
    error = f"{key}_stderr_between"
    if a[key] is None or b[key] is None or a.get(error) is None or b.get(error) is None:
        return None
    return differ(a[key], a[error], b[key], b[error])
