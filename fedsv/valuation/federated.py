"""Across-rounds accounting of the federated Shapley value: per-round values summed per participant."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedsv.valuation.accounting.completion import Completed, RoundMatrix
from fedsv.valuation.accounting.owners import Owners
from fedsv.valuation.accounting.round_matrices import RoundMatrices, merge_folds
from fedsv.valuation.accounting.rounds import TOTAL_KEYS, RoundValues, normalized, value_round
from fedsv.valuation.errors.rerun_noise import sum_rerun
from fedsv.valuation.errors.valuation_noise import COMPONENTS, Uncertainty, uncertainty
from fedsv.valuation.estimators.api import Plan
from fedsv.valuation.estimators.spec import ValuationSpec
from fedsv.valuation.games.game import Game
from fedsv.valuation.round.initial_spread import spread

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ClassTotals:
    """Values per validation label summed over rounds: `rounds_split` of the `rounds` were split by label
    (a round valued by GTG-Shapley is not); participant -> (labels,) arrays."""

    labels: int
    values: dict[str, FloatArray]
    stderr: dict[str, FloatArray]
    rounds_split: int
    rounds: int


class FederatedValuation:
    """The federated SV over rounds: a participant's value is the sum over the rounds it was selected in.

    `world`: every participant of the run (selected or not); the completed values (completion.py) value
    each of them in every round. None: the participants selected so far. `initial_scores`: the
    validation scores of other initial models (initial_spread.py), from which a rerun's error takes the
    pot's part; none (not measured) leaves a rerun's error of the FedSV totals unknown once round 1 is in.
    `balanced`: the run selected by the balanced rule (fedsv.fl.selection), so a rerun's error simulates
    its selections by that rule; else each round is drawn afresh.
    """

    def __init__(
        self,
        world: Sequence[str] | None = None,
        initial_scores: Sequence[float] = (),
        balanced: bool = False,
    ) -> None:
        self._rounds: dict[int, RoundValues] = {}
        self.balanced = balanced
        self.world = None if world is None else list(world)
        self.initial_scores = list(initial_scores)
        self._completed: tuple[int, Completed, list[str]] | None = None  # (rounds when computed, ...)
        self._uncertainty: tuple[int, Uncertainty] | None = None
        self._matrices: tuple[int, RoundMatrices] | None = None

    def add_round(self, rv: RoundValues) -> None:
        if rv.round in self._rounds:
            raise ValueError(f"round {rv.round} already recorded")
        self._rounds[rv.round] = rv

    def value_round(
        self,
        game: Game,
        participant_ids: Sequence[str],
        round: int,
        spec: ValuationSpec | None = None,
        on_plan: Callable[[Plan], None] | None = None,
        selected: Sequence[str] | None = None,
        groups: Sequence[Sequence[int]] | None = None,
        public: Sequence[int] = (),
        alike: Sequence[Sequence[int]] = (),
    ) -> RoundValues:
        """Compute one round's values (see value_round()), record them and return them; `selected`: the
        round's selection where some selected were not aggregated (they are valued 0 in it); `groups`:
        members valued as one player, `public`: members in every coalition, valued 0, `alike`: members
        that looked redundant, valued apart (value_round)."""
        if round in self._rounds:
            raise ValueError(f"round {round} already recorded")
        rv = value_round(game, participant_ids, round, spec, on_plan, groups, public, alike)
        if selected is not None and set(selected) != set(participant_ids):
            rv = dataclasses.replace(rv, selected=list(selected))
        self.add_round(rv)
        return rv

    def per_round(self) -> list[RoundValues]:
        """The recorded rounds in round order."""
        return [self._rounds[r] for r in sorted(self._rounds)]

    def participants(self) -> list[str]:
        """Every participant of the world, then any other selected in a round, in order of first
        appearance: every one of them is in every total."""
        seen: dict[str, None] = dict.fromkeys(self.world or [])
        for rv in self.per_round():
            seen.update(dict.fromkeys(rv.selected or rv.participants))
        return list(seen)

    def totals(self) -> dict[str, dict[str, float]]:
        """Per participant, the totals of TOTAL_KEYS: the sums(), fedsv_completed (completed()) and
        fedsv_shrunk (each completed total pulled by its noise towards the members the verdict cannot
        tell it from, averaged over the groups reruns would find: shrinkage.py, bagging.py)."""
        out = self.sums()
        out["fedsv_completed"], out["fedsv_shrunk"] = {}, {}
        if self._rounds:
            _, completed = self.completed()
            shrunk = self.uncertainty().shrunk(np.asarray(completed.totals))
            owners, ids = self.owners(), self.participants()
            out["fedsv_completed"] = dict(zip(ids, map(float, owners.split(completed.totals)), strict=True))
            out["fedsv_shrunk"] = dict(zip(ids, map(float, owners.split(shrunk)), strict=True))
        return {key: out[key] for key in TOTAL_KEYS}

    def owners(self) -> Owners:
        """The run's owners: participants that a round valued as one player (RoundValues.merged) are
        one owner for the whole run; the completed and shrunk totals value owners and split an owner's
        equally among its participants (owners.py)."""
        merged = [group for rv in self.per_round() for group in rv.merged]
        return Owners.linked(self.participants(), merged)

    def sums(self) -> dict[str, dict[str, float]]:
        """Per participant, fedsv, loo and their normalized variants summed over the rounds it was valued
        in (normalized: each round's vector divided by its L2 norm first; 0 for a participant never
        valued, as for one selected but not aggregated): the totals that move with every round,
        without the completion (what live metrics show)."""
        out: dict[str, dict[str, float]] = {
            key: dict.fromkeys(self.participants(), 0.0)
            for key in TOTAL_KEYS
            if key not in ("fedsv_completed", "fedsv_shrunk")
        }
        for rv in self.per_round():
            vectors = {
                "fedsv": rv.fedsv,
                "fedsv_normalized": normalized(rv.fedsv),
                "loo": rv.loo,
                "loo_normalized": normalized(rv.loo),
            }
            for key, vector in vectors.items():
                for pid, value in zip(rv.participants, vector, strict=True):
                    out[key][pid] += float(value)
        return out

    def class_totals(self) -> ClassTotals:
        """Per participant, its FedSV per validation label summed over the rounds valued by label; they
        add up to its FedSV when every round was. Each one's error: the estimator's and the validation
        set's per round (summed as independent: a label's validation luck persisting over rounds is not
        seen; NaN where a sampled round has none) and a rerun's from the label's own round values."""
        split = [rv for rv in self.per_round() if rv.classes is not None]
        labels = max((rv.classes.values.shape[1] for rv in split if rv.classes is not None), default=0)
        ids = self.participants()
        column = {pid: k for k, pid in enumerate(ids)}
        rounds = {rv.round: t for t, rv in enumerate(self.per_round())}
        values = np.zeros((len(rounds), len(ids), labels))
        variance = np.zeros((len(ids), labels))
        seen = np.zeros(len(ids), dtype=bool)
        for rv in split:
            assert rv.classes is not None
            width, cols = rv.classes.values.shape[1], [column[pid] for pid in rv.participants]
            validation = rv.classes.validation
            values[rounds[rv.round], cols, :width] = rv.classes.values
            variance[cols, :width] += np.square(rv.classes.stderr)
            variance[cols, :width] += np.nan if validation is None else np.square(validation)
            seen[cols] = True
        if split:
            matrices, owners = self.matrices(), self.owners()
            pooled = owners.pool_values(values)
            rerun = np.stack([sum_rerun(pooled[:, :, c], matrices) for c in range(labels)], axis=1)
            variance = variance + np.square(owners.split(rerun))
        totals = values.sum(axis=0)
        return ClassTotals(
            labels,
            {pid: totals[column[pid]] for pid in ids if seen[column[pid]]},
            {pid: np.sqrt(variance[column[pid]]) for pid in ids if seen[column[pid]]},
            len(split),
            len(self._rounds),
        )

    def completed(self) -> tuple[list[str], Completed]:
        """The completed totals (completion.complete) of every owner of the world (every participant,
        where no round merged any: owners()), in that order; computed once per number of rounds
        recorded (or adopted from a completion done elsewhere). totals() has them per participant."""
        if self._completed is None or self._completed[0] != len(self._rounds):
            matrix = self.round_matrix()
            self.adopt(matrix, matrix.complete())
        assert self._completed is not None
        return self._completed[2], self._completed[1]

    def round_matrix(self) -> RoundMatrix:
        """The rounds' values as the round-by-participant matrix a completion starts from (the world's
        participants first, then any other selected); a member selected but not aggregated (turned
        away, late) is observed at 0 in that round: it contributed nothing."""
        return self.matrices().completion_matrix()

    def matrices(self) -> RoundMatrices:
        """The rounds' FedSV and LOO, their estimator's variance and their values per validation fold as
        round-by-owner matrices (round_matrices.RoundMatrices; an owner of several participants is one
        column: owners()); built once per number of rounds recorded (the completion, the errors and
        the values per label all start from them)."""
        if self._matrices is None or self._matrices[0] != len(self._rounds):
            self._matrices = (len(self._rounds), self.owners().pool(self._build_matrices()))
        return self._matrices[1]

    def _build_matrices(self) -> RoundMatrices:
        ids = self.participants()
        column = {pid: k for k, pid in enumerate(ids)}
        rounds = self.per_round()
        shape = (len(rounds), len(ids))
        folds = min((rv.folds.folds for rv in rounds if rv.folds is not None), default=1)
        shares = np.ones(1)
        fedsv, loo, variance = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        fedsv_f, loo_f = np.zeros((*shape, folds)), np.zeros((*shape, folds))
        mask, accepted = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
        for t, rv in enumerate(rounds):
            mask[t, [column[pid] for pid in rv.selected or rv.participants]] = True
            cols = [column[pid] for pid in rv.participants]
            accepted[t, cols] = True
            accepted[t, [column[pid] for pid in rv.public]] = False  # every coalition held it: paid nothing
            fedsv[t, cols], loo[t, cols] = rv.fedsv, rv.loo
            variance[t, cols] = np.nan if rv.stderr is None else np.square(rv.stderr)
            if rv.folds is None:
                fedsv_f[t, cols], loo_f[t, cols] = np.nan, np.nan
                continue
            fedsv_f[t, cols], shares = merge_folds(rv.folds.fedsv, rv.folds.shares, folds)
            loo_f[t, cols] = merge_folds(rv.folds.loo, rv.folds.shares, folds)[0]
        selected = [len(rv.selected or rv.participants) for rv in rounds]
        # another w_0 moves round 1's gain; rounds after it start from the run's own model
        initial = spread(self.initial_scores) if rounds and rounds[0].round == 1 else 0.0
        return RoundMatrices(
            ids, fedsv, loo, mask, variance, selected, fedsv_f, loo_f, shares, accepted, initial,
            self.balanced,
        )  # fmt: skip

    def adopt(self, matrix: RoundMatrix, completed: Completed, errors: Uncertainty | None = None) -> None:
        """Use `completed` (and `errors`), the completion (and the uncertainty) of this accounting's
        round_matrix() when it held `matrix.rounds` rounds (as the valuation process returns them),
        until another round is added."""
        self._completed = (matrix.rounds, completed, matrix.ids)
        if errors is not None:
            self._uncertainty = (matrix.rounds, errors)

    def uncertainty(self) -> Uncertainty:
        """Every total's standard error by part (valuation_noise): the estimator's, the validation set's
        and a rerun's; computed once per number of rounds recorded."""
        if self._uncertainty is None or self._uncertainty[0] != len(self._rounds):
            _, completed = self.completed()
            found = uncertainty(self.matrices(), completed.chosen, np.asarray(completed.totals))
            self._uncertainty = (len(self._rounds), found)
        return self._uncertainty[1]

    def errors(self) -> dict[str, dict[str, float]]:
        """Per participant, the standard error of each total in totals() against a rerun of the same
        federation (the parts of error_parts() in quadrature; NaN: unknown, inf: never selected)."""
        return self._by_id(lambda u, key: u.stderr(key))

    def between_errors(self) -> dict[str, dict[str, float]]:
        """Per participant, the error of each total less the members' mean (valuation_noise.BETWEEN's
        parts: what moves every member alike cancels): what differences are weighed by."""
        return self._by_id(lambda u, key: u.between(key))

    def error_parts(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per part (valuation_noise.COMPONENTS), per total and participant, its standard error."""
        return {
            part: self._by_id(lambda u, key, part=part: u.parts[part][key])  # type: ignore[misc]
            for part in COMPONENTS
        }

    def _by_id(self, pick: Callable[[Uncertainty, str], FloatArray]) -> dict[str, dict[str, float]]:
        if not self._rounds:
            return {key: {} for key in TOTAL_KEYS}
        u, ids, owners = self.uncertainty(), self.participants(), self.owners()
        split = {key: owners.split(pick(u, key)) for key in TOTAL_KEYS}  # an owner's error over its members
        return {key: dict(zip(ids, map(float, split[key]), strict=True)) for key in TOTAL_KEYS}

    def sum_errors(self) -> dict[str, dict[str, float]]:
        """Per participant, the estimator's standard error of each of the sums() (what the live metrics
        show each round; errors() adds the validation set's and a rerun's): for FedSV the root of the
        summed per-round variances (rounds are valued independently), for a normalized total each
        round's divided by the round's norm; LOO is exact (0). A round whose errors were not recorded
        makes the error unknown (NaN)."""
        variance = dict.fromkeys(self.participants(), 0.0)
        normalized_variance = dict.fromkeys(self.participants(), 0.0)
        for rv in self.per_round():
            errors = np.full(len(rv.participants), np.nan) if rv.stderr is None else rv.stderr
            norm = float(np.linalg.norm(rv.fedsv)) or 1.0
            for pid, error in zip(rv.participants, errors, strict=True):
                variance[pid] += float(error) ** 2
                normalized_variance[pid] += (float(error) / norm) ** 2
        zeros = dict.fromkeys(self.participants(), 0.0)
        return {
            "fedsv": {pid: math.sqrt(v) for pid, v in variance.items()},
            "fedsv_normalized": {pid: math.sqrt(v) for pid, v in normalized_variance.items()},
            "loo": zeros,
            "loo_normalized": dict(zeros),
        }

    def group_rationality_residuals(self) -> dict[int, float]:
        """Per round: sum_i s_t(i) - (U_after - U_before)."""
        return {rv.round: rv.group_rationality_residual for rv in self.per_round()}
