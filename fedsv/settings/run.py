"""What a run trains and how it is valued (RunConfig), the same on every restart of the run."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import model_validator

from fedsv.config.checks import require
from fedsv.data.corruptions import parse_corruption
from fedsv.data.shards import Holdout
from fedsv.fl.aggregation import AggregationRule
from fedsv.fl.ranks import parse_ranks
from fedsv.fl.selection import Selector
from fedsv.fl.update_bounds import NormBound
from fedsv.fl.update_guard import GuardSettings
from fedsv.settings import run_settings as rs  # the settings' declarations
from fedsv.settings.choices import (
    Draw,
    ValuationMethod,
)
from fedsv.settings.model import ConfigModel
from fedsv.settings.schema import DECLARED, added_later, earlier_value
from fedsv.task.interface import LoadedTask
from fedsv.task.sources import SimulationSettings, run_task
from fedsv.task.validation_step import LocalTraining
from fedsv.valuation import ValuationSpec

VALUATION_METHODS = tuple(ValuationMethod)
"""What a run may value with: any method but the random baseline (a study's reference), or none."""


UNGUARDED: dict[str, Any] = {
    "update_count_multiple": 0.0,
    "update_direction": False,
    "update_norm_history": 0,
    "update_quarantine": False,
    "update_trusted_step": False,
}
"""The settings that turn the update guard (fedsv.fl.update_guard) off: FedAvg over the declared counts,
the norm bound over the round's own norms, no direction check, no quarantine, no trusted step (the paper's
studies run so)."""


class RunConfig(ConfigModel):
    """What a run trains and how it is valued; identical on every restart of the run."""

    participants: rs.participants = DECLARED
    fraction: rs.fraction = DECLARED
    rounds: rs.rounds = DECLARED
    seed: rs.seed = DECLARED
    task: rs.task = DECLARED
    validation_data: rs.validation_data = DECLARED
    test_data: rs.test_data = DECLARED
    dataset: rs.dataset = DECLARED
    data_dir: rs.data_dir = DECLARED
    partition: rs.partition = DECLARED
    model: rs.model = DECLARED
    epochs: rs.epochs = DECLARED
    batch_size: rs.batch_size = DECLARED
    lr: rs.lr = DECLARED
    validation_size: rs.validation_size = DECLARED
    metric: rs.metric = DECLARED
    validation_from: rs.validation_from = DECLARED
    test_size: rs.test_size = DECLARED
    valuation: rs.valuation = DECLARED
    eps: rs.eps = DECLARED
    delta: rs.delta = DECLARED
    valuation_budget: rs.valuation_budget = DECLARED
    valuation_target_stderr: rs.valuation_target_stderr = DECLARED
    valuation_noise_fraction: rs.valuation_noise_fraction = DECLARED
    valuation_surrogate: rs.valuation_surrogate = DECLARED
    valuation_merge_redundant: rs.valuation_merge_redundant = DECLARED
    valuation_exact_seconds: rs.valuation_exact_seconds = DECLARED
    valuation_max_evaluations: rs.valuation_max_evaluations = DECLARED
    valuation_budget_seconds: rs.valuation_budget_seconds = DECLARED
    aggregation: rs.aggregation = DECLARED
    aggregation_trim: rs.aggregation_trim = DECLARED
    aggregation_byzantine: rs.aggregation_byzantine = DECLARED
    aggregation_keep: rs.aggregation_keep = DECLARED
    update_norm_policy: rs.update_norm_policy = DECLARED
    update_norm_bound: rs.update_norm_bound = DECLARED
    update_norm_multiple: rs.update_norm_multiple = DECLARED
    update_norm_reject_multiple: rs.update_norm_reject_multiple = DECLARED
    update_count_multiple: rs.update_count_multiple = DECLARED
    update_direction: rs.update_direction = DECLARED
    update_norm_history: rs.update_norm_history = DECLARED
    update_quarantine: rs.update_quarantine = DECLARED
    update_trusted_step: rs.update_trusted_step = DECLARED
    corrupt: rs.corrupt = DECLARED
    draw: rs.draw = DECLARED
    selection: rs.selection = DECLARED

    @model_validator(mode="after")
    def _check_run(self) -> RunConfig:
        """What no one field's range says: settings that must agree, and the specs that parse."""
        if self.task.strip():
            require(self.metric == "accuracy", "metric", "left out with --task (the task sets its own)",
                    self.metric)  # fmt: skip
        if self.dataset == "embedded" and not self.task.strip():
            rule = "train for the embedded sample (it has no separate test files)"
            require(self.validation_from == "train", "validation_from", rule, self.validation_from)
            require(self.test_size >= 1, "test_size", "at least 1 for the embedded sample", self.test_size)
        if self.valuation_budget != 0 and self.valuation_budget < 2:
            raise ValueError(
                f"valuation_budget must be 0 or at least 2 evaluations, got {self.valuation_budget}"
            )
        self.norm_bound()  # validates the update bound
        self.guard()  # validates the weight cap, the direction check and the norms' memory
        aggregation = self.aggregation_rule()  # validates the aggregation
        if aggregation.selects:  # Krum's guarantee needs n >= 2f + 3 of the selected (Blanchard et al. 2017)
            most = (self.selected_per_round - 3) // 2
            require(
                self.aggregation_byzantine <= max(0, most),
                "aggregation_byzantine",
                f"at most {max(0, most)} with {self.selected_per_round} selected per round (n >= 2f + 3)",
                self.aggregation_byzantine,
            )
            require(
                self.aggregation_keep <= self.selected_per_round,
                "aggregation_keep",
                f"at most the {self.selected_per_round} selected per round",
                self.aggregation_keep,
            )
        self.valuation_spec(1)  # validates eps, delta and the budgets now, not in round 1
        self.corruptions()  # validates the spec
        self.schedule()  # validates the selection
        if self.task.strip() and not self.validation_data.strip():
            raise ValueError(
                "task needs validation_data (--validation-data PATH: the coordinator's validation set)"
            )
        return self

    @property
    def selected_per_round(self) -> int:
        return max(1, round(self.fraction * self.participants))

    def corruptions(self) -> dict[int, str]:
        """rank -> corruption spec, from `corrupt` ("RANKS=SPEC;RANKS=SPEC")."""
        out: dict[int, str] = {}
        for part in filter(None, (p.strip() for p in self.corrupt.split(";"))):
            ranks, sep, spec = part.partition("=")
            if not sep:
                raise ValueError(f"corrupt entry {part!r} must look like RANKS=SPEC, e.g. 0-3=flip:0.1")
            parsed = parse_corruption(spec)
            copy_of = parsed.copy_of
            if copy_of is not None and copy_of >= self.participants:
                raise ValueError(
                    f"corrupt entry {part!r}: copy:{copy_of} names no rank; "
                    f"ranks are 0..{self.participants - 1}"
                )
            chosen = parse_ranks(ranks, self.participants)
            if parsed.collude is not None and not parsed.group:  # the entry's ranks collude
                spec = f"{spec}+group:{','.join(str(r) for r in chosen)}"
            elif any(r >= self.participants for r in parsed.group):
                raise ValueError(
                    f"corrupt entry {part!r}: its group names a rank outside 0..{self.participants - 1}"
                )
            for rank in chosen:
                out[rank] = spec
        return out

    def schedule(self) -> dict[int, tuple[int, ...]]:
        """round -> selected ranks, from `selection` ("ROUND=RANKS;..."); empty for the seeded draw.

        A fixed selection must name every round: replaying a run's selection while dismissing some of
        each round's participants (data summarization) is what it is for.
        """
        out: dict[int, tuple[int, ...]] = {}
        for part in filter(None, (p.strip() for p in self.selection.split(";"))):
            number, sep, ranks = part.partition("=")
            if not sep or not number.strip().isdigit():
                raise ValueError(f"selection entry {part!r} must look like ROUND=RANKS, e.g. 1=0-4,7")
            round_number = int(number)
            if not 1 <= round_number <= self.rounds:
                raise ValueError(f"selection names round {round_number}; the run has rounds 1..{self.rounds}")
            if round_number in out:
                raise ValueError(f"selection names round {round_number} twice")
            out[round_number] = parse_ranks(ranks, self.participants)
        if out and len(out) != self.rounds:
            missing = sorted(set(range(1, self.rounds + 1)) - set(out))
            raise ValueError(f"selection must name every round; missing {missing}")
        return out

    def selector(self) -> Selector:
        """The run's selections (fedsv.fl.selection): the fixed `selection`, else `draw`'s rule."""
        rng = np.random.default_rng(self.seed)
        return Selector(
            self.seed, self.participants, self.selected_per_round, self.draw == Draw.BALANCED, rng,
            self.schedule(),
        )  # fmt: skip

    def selection_warning(self) -> str | None:
        """A warning before the run where some member may never be selected (it is then "not valued"
        and its share is held out of the payout); None where every member is selected."""
        n, k, t = self.participants, self.selected_per_round, self.rounds
        if self.selection.strip():
            never = n - len({r for ranks in self.schedule().values() for r in ranks})
            return f"the fixed selection never selects {never} of {n} members" if never else None
        if t * k < n:
            return (
                f"{t} rounds of {k} select {t * k} times, fewer than the {n} members: "
                f"{n - t * k} will never be selected and stay not valued"
            )
        if self.draw == Draw.INDEPENDENT:
            missed = 1.0 - (1.0 - (1.0 - k / n) ** t) ** n  # members drawn apart, an approximation
            if missed > 0.05:
                return (
                    f"with independent draws, some member is never selected in about {missed:.0%} "
                    "of runs (--draw balanced selects every member)"
                )
        return None

    def load_task(self) -> LoadedTask:
        """The run's task (imported now): --task, or the paper's --model sized for --dataset."""
        return run_task(self.task, self.model, self.dataset, self.metric)

    def simulation(self) -> SimulationSettings:
        """What "simulated:DATASET" sources of this run need."""
        return SimulationSettings(self.data_dir, self.seed, self.holdout(), self.participants, self.partition)

    def holdout(self) -> Holdout:
        """What the simulation holds out of the data set for the coordinator."""
        return Holdout(self.validation_size, self.validation_from, self.test_size)

    @property
    def validation_source(self) -> str:
        return self.validation_data.strip() or f"simulated:{self.dataset}"

    @property
    def test_source(self) -> str:
        """Where test accuracy is measured; "" (no test set) for a --task run without --test-data."""
        if self.test_data.strip():
            return self.test_data.strip()
        return "" if self.task.strip() else f"simulated:{self.dataset}"

    def aggregation_rule(self) -> AggregationRule:
        """The rule that aggregates each round, and values every coalition of its game."""
        return AggregationRule(
            self.aggregation,
            self.aggregation_trim,
            self.aggregation_byzantine,
            self.aggregation_keep,
            once=self.valuation_merge_redundant,
        )

    def norm_bound(self) -> NormBound:
        """How the round's updates are bounded before aggregation and valuation."""
        return NormBound(
            self.update_norm_policy,
            self.update_norm_bound,
            self.update_norm_multiple,
            self.update_norm_reject_multiple,
        )

    def local_training(self) -> LocalTraining:
        """How members train locally, for the coordinator's trusted step (fedsv.task.validation_step)."""
        return LocalTraining(self.seed, self.participants, self.epochs, self.batch_size, self.lr)

    def guard(self) -> GuardSettings:
        """How the round's updates are screened before aggregation (weights, norms' memory, direction)."""
        return GuardSettings(
            self.update_count_multiple,
            self.update_direction,
            self.update_norm_history,
            self.update_quarantine,
            self.update_trusted_step,
        )

    def valuation_spec(self, round_number: int) -> ValuationSpec | None:
        """How round `round_number` is valued (seeded per round); None when valuation is off."""
        if self.valuation == ValuationMethod.NONE:
            return None
        return ValuationSpec(
            method=self.valuation.value,
            eps=self.eps,
            delta=self.delta,
            seed=self.seed + round_number,
            budget=self.valuation_budget or None,
            budget_seconds=self.valuation_budget_seconds or None,
            target_stderr=self.valuation_target_stderr or None,  # x the utility range, 1.0
            noise_fraction=self.valuation_noise_fraction or None,
            surrogate=self.valuation_surrogate,
            merge_redundant=self.valuation_merge_redundant,
            max_evaluations=self.valuation_max_evaluations,
            exact_seconds=self.valuation_exact_seconds,
        )

    def settings(self) -> dict[str, Any]:
        """Every setting by name, none left out (what another process is started with)."""
        return {name: getattr(self, name) for name in type(self).model_fields}

    @classmethod
    def from_record(cls, recorded: dict[str, Any]) -> RunConfig:
        """The run a record (to_dict) describes: a setting added later and left out of it stands at the
        value the record left it out for (schema.earlier_value), not at today's default."""
        earlier = {name: earlier_value(name) for name in cls.model_fields if added_later(name)}
        return cls(**{**earlier, **recorded})

    def to_dict(self) -> dict[str, Any]:
        """The run's record (its ledger's config and its id): every setting, but one added later at its
        value that stands for the runs recorded before it (schema.earlier_value)."""
        return {
            name: getattr(self, name)
            for name in type(self).model_fields
            if not (added_later(name) and getattr(self, name) == earlier_value(name))
        }
