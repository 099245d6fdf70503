"""One owner, one share: identities a round valued as one player are one owner for the whole run, so
joining twice with the same data does not earn more in total than joining once (owners.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedsv.app.payout import _group_means, payout
from fedsv.app.report import build_report
from fedsv.app.report_page import render_page
from fedsv.app.report_text import format_table
from fedsv.ledger import Checkpoint, Ledger
from fedsv.ledger.valuation_view import class_rows, federated_valuation, value_rows
from fedsv.valuation import FederatedValuation, RoundValues
from fedsv.valuation.accounting.by_class import FoldValues
from fedsv.valuation.accounting.owners import Owners
from fedsv.valuation.accounting.round_matrices import RoundMatrices
from fedsv.valuation.accounting.verdict import owners_verdict, verdict
from tests.support.records import make_record

ROUNDS, FOLDS = 10, 4
QUALITY = np.array([0.4, 0.6, 0.8, 1.0, 1.6, 1.2, 1.4, 0.2])  # owner 4 joins twice below
PAYING = ("fedsv_completed", "fedsv_shrunk")


def _round(
    t: int, ids: list[str], values: np.ndarray, folds: np.ndarray, merged: list[list[str]] | None = None
) -> RoundValues:
    zeros = np.zeros(len(ids))
    return RoundValues(
        t, ids, values, values * 1.2, 0.0, float(values.sum()), "exact", 1, 0.0, zeros,
        folds=FoldValues(folds, folds * 1.2, np.full(FOLDS, 1 / FOLDS)), merged=merged or [],
    )  # fmt: skip


def _runs(seed: int, picked: int) -> tuple[FederatedValuation, FederatedValuation, FederatedValuation]:
    """The same federation three ways: owner p004 once; p004 and its copy p008 merged where both were
    selected (each half of the one player's value); and the two valued apart, each with the owner's
    value. The copy
    is selected whenever p004 was selected in the first run but not every time with it, so the owner
    is selected by either identity as often as it was alone (partial selection: twice the chances)."""
    rng = np.random.default_rng(seed)
    ids = [f"p{i:03d}" for i in range(8)]
    once = FederatedValuation(ids, list(rng.normal(0.5, 0.01, 16)))
    twice = FederatedValuation([*ids, "p008"], once.initial_scores)
    apart = FederatedValuation([*ids, "p008"], once.initial_scores)
    gain = np.linspace(1.0, 0.1, ROUNDS) * 0.03
    for t in range(1, ROUNDS + 1):
        chosen = np.sort(rng.choice(8, picked, replace=False))
        values = QUALITY[chosen] * gain[t - 1] + rng.normal(0.0, 0.003, picked)
        spread = rng.normal(0.0, 0.002, (picked, FOLDS))  # each value on each validation fold
        folds = values[:, None] / FOLDS + spread - spread.mean(axis=1, keepdims=True)
        names = [ids[i] for i in chosen]
        once.add_round(_round(t, names, values, folds))
        if "p004" not in names:
            twice.add_round(_round(t, names, values, folds))
            apart.add_round(_round(t, names, values, folds))
            continue
        if t % 3 == 0:  # a round where one identity stands in for the owner alone
            twice.add_round(_round(t, names, values, folds))
            apart.add_round(_round(t, names, values, folds))
            continue
        k = names.index("p004")
        half, half_folds = values.copy(), folds.copy()
        half[k], half_folds[k] = values[k] / 2, folds[k] / 2
        both, split = [*names, "p008"], np.append(half, half[k])
        split_folds = np.vstack([half_folds, half_folds[k]])
        twice.add_round(_round(t, both, split, split_folds, [["p004", "p008"]]))
        # valued apart, a copy is worth about what its original is (each is pivotal with the other out)
        apart.add_round(_round(t, both, np.append(values, values[k]), np.vstack([folds, folds[k]])))
    return once, twice, apart


def _shares(totals: dict[str, float]) -> dict[str, float]:
    paid = {pid: max(value, 0.0) for pid, value in totals.items()}
    return {pid: value / sum(paid.values()) for pid, value in paid.items()}


@pytest.mark.parametrize("picked", [8, 4])
@pytest.mark.parametrize("seed", range(3))
def test_an_owner_that_joins_twice_is_paid_what_it_is_paid_once(seed: int, picked: int) -> None:
    once, twice, apart = _runs(seed, picked)
    alone, merged, valued_apart = once.totals(), twice.totals(), apart.totals()
    for key in PAYING:
        owner = alone[key]["p004"]
        assert merged[key]["p004"] + merged[key]["p008"] == pytest.approx(owner, rel=1e-9, abs=1e-12), key
        assert merged[key]["p004"] == merged[key]["p008"]  # one owner's identities alike
        for pid in ("p000", "p003", "p007"):  # the others as if the owner had joined once
            assert merged[key][pid] == pytest.approx(alone[key][pid], rel=1e-9, abs=1e-12), (key, pid)
        share = _shares(merged[key])
        assert share["p004"] + share["p008"] == pytest.approx(_shares(alone[key])["p004"], rel=1e-9)
    errors, errors_once = twice.errors()["fedsv_shrunk"], once.errors()["fedsv_shrunk"]
    assert errors["p004"] == pytest.approx(errors_once["p004"] / 2, rel=1e-6)
    # valued apart, the copy is paid as a member of its own: the pooling is what keeps the owner's share
    gained = valued_apart["fedsv_completed"]["p004"] + valued_apart["fedsv_completed"]["p008"]
    assert gained > 1.1 * alone["fedsv_completed"]["p004"]


def test_owners_link_across_rounds_and_split_equally() -> None:
    owners = Owners.linked(["a", "b", "c", "d", "e"], [["b", "d"], ["d", "e"], ["x", "a"]])
    assert owners.shared() == [["b", "d", "e"]] and owners.labels == ["a", "b", "c"]
    assert owners.split(np.array([3.0, 6.0, 1.0])).tolist() == [3.0, 2.0, 1.0, 2.0, 2.0]
    values = np.arange(10.0).reshape(2, 5)
    assert owners.pool_values(values).tolist() == [[0.0, 1.0 + 3.0 + 4.0, 2.0], [5.0, 6.0 + 8.0 + 9.0, 7.0]]
    lone = Owners.linked(["a", "b"], [])
    assert not lone.pooled and lone.split(np.array([1.0, 2.0])).tolist() == [1.0, 2.0]


def test_the_ledger_keeps_who_was_valued_as_one_player() -> None:
    """The report and a restarted coordinator read the owners back from the ledger's value rows."""
    _, twice, _ = _runs(0, 8)
    records, rows = [], []
    for rv in twice.per_round():
        records.append(make_record(rv.round, rv.participants, rv.participants))
        rows += value_rows(rv)
    back = federated_valuation(records, rows, twice.participants())
    assert [rv.merged for rv in back.per_round()] == [rv.merged for rv in twice.per_round()]
    assert back.owners().shared() == [["p004", "p008"]]
    assert back.totals()["fedsv_completed"] == pytest.approx(twice.totals()["fedsv_completed"])


def test_a_merged_group_must_hold_two_distinct_participants_of_the_round() -> None:
    values = np.array([0.1, 0.2])
    for merged in ([["a", "zz"]], [["a"]], [["a", "b"], ["b", "a"]]):
        with pytest.raises(ValueError, match="merged"):
            _round(1, ["a", "b"], values, np.zeros((2, FOLDS)), merged)


def test_the_verdict_and_the_group_payout_count_an_owner_once() -> None:
    """p004 and p008 hold halves of one owner's 1.0: tested as one member beside p001's 1.0 they cannot
    be told apart from it, and paid by their group's mean over owners they get half of it each."""
    values = {"p001": 1.0, "p004": 0.5, "p008": 0.5, "p002": 0.2}
    errors = {"p001": 0.05, "p004": 0.025, "p008": 0.025, "p002": 0.05}
    owner = [["p004", "p008"]]
    found = owners_verdict(values, errors, owner)
    assert found.members == 3 and found.groups == [["p001", "p004", "p008"], ["p002"]]
    assert verdict(values, errors).groups[0] == ["p001"]  # identity by identity, the halves look small
    # the group's mean over owners: p001's 1.2 and the owner's 0.4 + 0.4 average 1.0; the owner's half
    # each (its input unchanged would pay 1.2 and 0.4; a mean over identities, 0.667 each)
    paid = _group_means([1.2, 0.4, 0.4, 0.2], [1, 1, 1, 2], [["p001"], *owner * 2, ["p002"]])
    assert paid == pytest.approx([1.0, 0.5, 0.5, 0.2])


def test_the_report_and_the_payout_treat_an_owner_as_one_member(tmp_path: Path) -> None:
    """From the ledger: report.json names the owner, its identities share one verdict group, and paying
    by groups gives the owner (both identities together) what each other owner of its group gets."""
    _, twice, _ = _runs(2, 4)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-owners", {"rounds": ROUNDS, "participants": 9})
        ledger.record_initial_scores(dict(enumerate(twice.initial_scores)))
        for rv in twice.per_round():
            record = make_record(rv.round, rv.participants, rv.participants)
            checkpoint = Checkpoint(rv.round, b"w", "{}")
            ledger.commit_round(record, value_rows(rv), [], checkpoint, classes=class_rows(rv))
    report = build_report(tmp_path)
    assert report["owners"] == [["p004", "p008"]]
    group = next(g for g in report["verdict"]["groups"] if "p004" in g)
    assert "p008" in group and report["verdict"]["members_tested"] == 8
    assert "p004 and p008: valued as one owner" in format_table(report)
    assert "p004 and p008: valued as one owner" in render_page(report)
    paid = {share.participant: share.amount or 0.0 for share in payout(tmp_path, 1000.0, rule="groups")}
    assert paid["p004"] == pytest.approx(paid["p008"])
    others = [pid for pid in group if pid not in ("p004", "p008")]
    assert others, group  # the owner shares its group with other owners
    for pid in others:  # every owner of the group paid alike: the owner's two identities together
        assert paid["p004"] + paid["p008"] == pytest.approx(paid[pid], rel=1e-9)


def test_an_owners_estimator_errors_add_as_fully_correlated() -> None:
    """Sampled values: an owner of two identities with estimator errors 0.01 and 0.02 in a round holds
    0.03 (its identities' shares of one player's value move together), not the independent 0.022 and
    not 0; an owner of one identity keeps its own."""
    ids = ["p000", "p001", "p002"]
    shape = (2, 3)
    matrices = RoundMatrices(
        ids=ids,
        fedsv=np.array([[0.1, 0.2, 0.3], [0.0, 0.1, 0.2]]),
        loo=np.zeros(shape),
        mask=np.ones(shape, dtype=bool),
        estimator_variance=np.array([[1e-4, 4e-4, 9e-4], [0.0, 4e-4, 1e-4]]),
        selected=[3, 3],
        fedsv_folds=np.full((*shape, 1), np.nan),
        loo_folds=np.full((*shape, 1), np.nan),
        shares=np.ones(1),
        accepted=np.ones(shape, dtype=bool),
    )
    pooled = Owners.linked(ids, [["p000", "p001"]]).pool(matrices)
    assert pooled.ids == ["p000", "p002"] and pooled.selected == [2, 2]
    assert pooled.fedsv == pytest.approx(np.array([[0.3, 0.3], [0.1, 0.2]]))
    assert np.sqrt(pooled.estimator_variance) == pytest.approx(np.array([[0.03, 0.03], [0.02, 0.01]]))
