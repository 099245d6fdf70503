"""In-process FedAvg on the embedded data, valuing every round with the federated SV (the demo)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from pydantic import Field, model_validator
from torch import Tensor, nn

from fedsv.data.corruptions import declared_count, parse_corruption
from fedsv.fl.aggregation import aggregate
from fedsv.fl.evaluation import EvalSet, evaluate
from fedsv.fl.input_span import input_span
from fedsv.fl.ranks import participant_id
from fedsv.fl.referee import ValidationReferee
from fedsv.fl.selection import train_seed
from fedsv.fl.state import params_of
from fedsv.fl.update_guard import GuardMemory, guard_updates
from fedsv.fl.updates import ClientUpdate
from fedsv.pipeline.valuers import InlineValuer, RoundInputs
from fedsv.settings import process_settings as ps  # the settings' declarations
from fedsv.settings.choices import Draw
from fedsv.settings.run import RunConfig
from fedsv.settings.schema import DECLARED
from fedsv.task.colluders import colluding_update, members
from fedsv.task.interface import TrainContext
from fedsv.task.sources import evaluation_samples, rank_samples, rank_source
from fedsv.task.validation_step import validation_step
from fedsv.valuation import FederatedValuation, RoundValues
from fedsv.valuation.round.initial_spread import measure
from fedsv.valuation.round_valuation import GameSettings


class DemoConfig(RunConfig):
    """A run's settings (every RunConfig field, as for `fedsv launch`) plus two demo shortcuts."""

    data: ps.data = DECLARED
    noisy: int = Field(default=0, description="the first K ranks train on corrupted data", ge=0)
    corruption: str = Field(default="flip:0.5", description="corruption of the noisy ranks")

    @model_validator(mode="after")
    def _check_demo(self) -> DemoConfig:
        """No more noisy ranks than ranks; a corruption that parses."""
        if self.noisy > self.participants:
            raise ValueError(f"noisy must be between 0 and participants, got {self.noisy}")
        parse_corruption(self.corruption)
        return self

    def corruptions(self) -> dict[int, str]:
        """Ranks of `corrupt`, plus the first `noisy` ranks with `corruption` where `corrupt` names none."""
        noisy = dict.fromkeys(range(self.noisy), self.corruption) if self.noisy else {}
        return {**noisy, **super().corruptions()}


@dataclass
class DemoResult:
    """What a demo run produced: per-round values, accuracies, and the accounting object."""

    valuation: FederatedValuation
    accuracies: list[float]
    noisy_ids: list[str]


@dataclass(frozen=True)
class TrainedRound:
    """One demo round before its valuation: w_t, the bounded updates, what the round's game needs."""

    round: int
    params: dict[str, Tensor]
    updates: list[ClientUpdate]
    model: nn.Module
    validation: EvalSet
    game: GameSettings
    selected: list[str]  # the round's selection: some may have been turned away by the guard
    quarantined: list[str]  # those the guard held back (fedsv.fl.reputation): valued, not aggregated
    after: dict[str, Tensor]  # w_{t+1}, the model the round made (the next round's params)
    identical: list[str] = field(default_factory=list)  # turned away for sending another's very update
    refused_against: list[str] = field(default_factory=list)  # turned away by the trusted step


def demo_rounds(
    config: DemoConfig, coalition: Sequence[int] | None = None
) -> Iterator[tuple[TrainedRound, float]]:
    """Train T rounds of FedAvg in this process; yields each round (before aggregation is applied to the
    next) with the test accuracy of w_{t+1}.

    The same seeded draws, local training, norm bound and aggregation as the coordinator, so a `fedsv
    launch` of the same settings trains the same models. With `coalition`, only those ranks train, every
    one in every round, each with the training seeds it has in the run (the canonical value retrains a
    coalition so).
    """
    task = config.load_task()
    model = task.build_model(config.seed)
    global_params = params_of(model)
    settings = config.simulation()
    corrupt = config.corruptions()
    ranks = [
        rank_samples(
            task, rank_source(config.data, rank, config.dataset), rank, settings, corrupt.get(rank, "none")
        )
        for rank in range(config.participants)
    ]
    validation_samples = evaluation_samples(task, config.validation_source, "validation", settings)
    validation = EvalSet(validation_samples.x, validation_samples.y)
    test = evaluation_samples(task, config.test_source, "test", settings) if config.test_source else None
    selector = config.selector()
    declared = [declared_count(c, len(s)) for s, c in ranks]
    memory = GuardMemory()
    span = input_span(model, validation)
    game = GameSettings(metric=task.metric, aggregation=config.aggregation_rule())
    for t in range(1, config.rounds + 1):
        selected = selector.ranks(t) if coalition is None else sorted(coalition)
        updates = []
        for r in selected:
            samples, corruption = ranks[r]
            context = TrainContext(
                round=t, rank=r, seed=train_seed(config.seed, t, r), epochs=config.epochs,
                batch_size=config.batch_size, lr=config.lr,
            )  # fmt: skip
            delta = task.local_update(model, global_params, samples, context, corruption)
            if corruption is not None and corruption.collude is not None:
                partners = {p: ranks[p][0] for p in members(corruption, r) if p != r}
                delta = colluding_update(
                    task, model, global_params, corruption, (r, delta), partners, context, config.seed
                )
            updates.append(ClientUpdate(participant_id(r), delta, declared[r]))
        referee = ValidationReferee(model, global_params, validation)
        trusted = validation_step(task, model, global_params, validation, config.local_training(), t)
        guarded = guard_updates(
            updates, config.norm_bound(), config.guard(), memory, declared, referee, global_params, span,
            trusted,
        )  # fmt: skip
        updates = guarded.updates  # as the coordinator screens them
        if not updates:
            raise ValueError(f"every update of round {t} was over update_norm_bound")
        chosen = [participant_id(r) for r in selected]
        after = aggregate(global_params, updates, t, game.aggregation)
        trained = TrainedRound(
            t, global_params, updates, model, validation, game, chosen, sorted(guarded.held), after,
            sorted(guarded.identical), sorted(guarded.against),
        )  # fmt: skip
        global_params = after
        accuracy = math.nan if test is None else evaluate(model, global_params, test.x, test.y)[0]
        yield trained, accuracy


def run_demo(
    config: DemoConfig,
    on_round: Callable[[RoundValues, float], None] | None = None,
    on_trained: Callable[[TrainedRound], None] | None = None,
) -> DemoResult:
    """Train T rounds of FedAvg in this process and value every round's deltas with the federated SV,
    inline, as the coordinator's inline schedule does: a `fedsv launch` of the same settings gives the
    same selections, models and values. `on_trained` sees each round's w_t and updates."""
    world = [participant_id(r) for r in range(config.participants)]
    accounting = FederatedValuation(world, balanced=config.draw == Draw.BALANCED)
    accuracies: list[float] = []
    valuer: InlineValuer | None = None
    for trained, accuracy in demo_rounds(config):
        if on_trained is not None:
            on_trained(trained)
        if valuer is None:  # the coordinator's inline valuer; initial scores as it measures them at start
            task, validation = config.load_task(), trained.validation
            scores = measure(task.build_model, validation.x, validation.y, task.metric, config.seed)
            accounting.initial_scores = list(scores.values())
            valuer = InlineValuer(trained.model, validation, trained.game, config.valuation_spec, accounting)
        values = valuer.value(RoundInputs(trained.round, trained.params, trained.updates, trained.selected))
        accuracies.append(accuracy)
        if on_round is not None:
            on_round(values, accuracy)
    return DemoResult(accounting, accuracies, [participant_id(r) for r in sorted(config.corruptions())])


def format_round(values: RoundValues, accuracy: float) -> str:
    return (
        f"round {values.round:3d}  selected {len(values.participants):3d}  test acc {accuracy:6.3f}  "
        f"U {values.utility_before:.3f} -> {values.utility_after:.3f}  {values.method:>13s}  "
        f"{values.evaluations:6d} evals  {values.seconds:6.2f} s  "
        f"residual {values.group_rationality_residual:+.1e}"
    )


def format_table(result: DemoResult) -> str:
    """Participants ranked by FedSV (highest first) with the normalized and LOO values."""
    totals = result.valuation.totals()
    ids = sorted(totals["fedsv"], key=lambda p: -totals["fedsv"][p])
    rounds_in = {p: 0 for p in ids}
    for rv in result.valuation.per_round():
        for p in rv.participants:
            rounds_in[p] += 1
    lines = [
        f"{'rank':>4s}  {'participant':<11s} {'rounds':>6s} {'FedSV':>9s} {'FedSV norm':>10s} "
        f"{'LOO':>9s} {'LOO norm':>9s}"
    ]
    for position, p in enumerate(ids, start=1):
        mark = "  (corrupted)" if p in result.noisy_ids else ""
        lines.append(
            f"{position:4d}  {p:<11s} {rounds_in[p]:6d} {totals['fedsv'][p]:9.4f} "
            f"{totals['fedsv_normalized'][p]:10.4f} {totals['loo'][p]:9.4f} "
            f"{totals['loo_normalized'][p]:9.4f}{mark}"
        )
    return "\n".join(lines)


def main_demo(config: DemoConfig) -> int:
    started = time.perf_counter()
    print(
        f"fedsv demo: {config.participants} participants, {config.selected_per_round} per round, "
        f"{config.rounds} rounds, {config.model} on {config.dataset} ({config.partition}), "
        f"valuation={config.valuation}"
    )
    result = run_demo(config, on_round=lambda v, a: print(format_round(v, a), flush=True))
    print()
    print(format_table(result))
    print(f"\nfinal test accuracy {result.accuracies[-1]:.3f}; {time.perf_counter() - started:.1f} s in all")
    return 0
