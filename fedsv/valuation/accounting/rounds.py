"""One round's values (RoundValues) and how a round game is valued into them (value_round)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fedsv.valuation.accounting.by_class import ClassValues, FoldValues, SplitValues, split_values
from fedsv.valuation.estimators.api import Plan, make_estimator, plan_game
from fedsv.valuation.estimators.loo import LeaveOneOut
from fedsv.valuation.estimators.result import ValuationResult
from fedsv.valuation.estimators.spec import ValuationSpec
from fedsv.valuation.games.game import Game
from fedsv.valuation.games.merged_game import MergedGame, alone, check_groups, merges

logger = logging.getLogger(__name__)

TOTAL_KEYS = ("fedsv", "fedsv_normalized", "fedsv_completed", "fedsv_shrunk", "loo", "loo_normalized")
"""The totals every participant gets (FederatedValuation.totals()); fedsv_completed: completion.py;
fedsv_shrunk: shrinkage.py."""


def valuation_time(seconds: float, cpu_seconds: float) -> str:
    """A valuation's wall time with its CPU time apart ("148.33 s: 35.10 CPU-s, 113.23 s waiting for a
    CPU"): on a busy machine the wall time is mostly waiting; where CPU time was not measured, the wall
    time alone."""
    if not math.isfinite(cpu_seconds):
        return f"{seconds:.2f} s"
    waited = seconds - cpu_seconds
    said = f"{seconds:.2f} s: {cpu_seconds:.2f} CPU-s"
    return said + (f", {waited:.2f} s waiting for a CPU" if waited > 0.1 * seconds else "")


@dataclass
class RoundValues:
    """One round's values of its selected participants (index i = participants[i]).

    utility_before = U(I_1..t-1) (the round game's U(empty)); utility_after = U(I_1..t) (its U(all)).
    method: the Shapley method actually used; evaluations: distinct coalitions evaluated for both
    the estimator and leave-one-out; seconds: wall time of both.
    stderr: the standard error of each FedSV value (0 where exact; infinite where unknown; None for a
    round whose errors were not recorded). Leave-one-out values are exact.
    """

    round: int
    participants: list[str]
    fedsv: npt.NDArray[np.float64]
    loo: npt.NDArray[np.float64]
    utility_before: float
    utility_after: float
    method: str
    evaluations: int
    seconds: float
    stderr: npt.NDArray[np.float64] | None = None
    classes: ClassValues | None = None  # per participant and validation label (by_class); None: not split
    folds: FoldValues | None = None  # per participant and validation fold (by_class); None: not split
    selected: list[str] | None = None  # the round's selection, when some were not aggregated (turned
    # away, late): they are valued 0 in this round (they contributed nothing); None: the participants
    computed_by: str = ""  # how the round's game computed its coalitions (Game.computed_by)
    cpu_seconds: float = math.nan  # CPU time of the valuing process (all its threads) over `seconds`;
    # seconds - cpu_seconds / threads is time spent waiting for a CPU. NaN: not measured
    choice: str = ""  # why this method ("auto"'s reason) and how a target ended; "": not recorded
    merged: list[list[str]] = field(default_factory=list)  # participants valued as one player (redundant:
    # their updates far more alike than independent data give), each group of two or more; the run
    # values them as one owner (owners.py)
    public: list[str] = field(default_factory=list)  # participants whose updates held nothing beyond the
    # global model's recent steps (aggregated with the guard's screens off): every coalition held them,
    # their values are 0, and the run counts them as not aggregated (round_matrices: paid nothing)
    alike: list[list[str]] = field(default_factory=list)  # participants whose updates were far more alike
    # than independent data give (a copy of one member's data, or members that drew the same classes)
    # but valued apart, each as its own player: merging was off (ValuationSpec.merge_redundant)

    def __post_init__(self) -> None:
        self.fedsv = np.asarray(self.fedsv, dtype=np.float64)
        self.loo = np.asarray(self.loo, dtype=np.float64)
        if self.stderr is not None:
            self.stderr = np.asarray(self.stderr, dtype=np.float64)
        n = len(self.participants)
        if not all(isinstance(p, str) for p in self.participants):
            raise ValueError(f"round {self.round}: participant ids must be strings")
        if len(set(self.participants)) != n:
            raise ValueError(f"round {self.round}: duplicate participant ids {self.participants}")
        if self.fedsv.shape != (n,) or self.loo.shape != (n,):
            raise ValueError(
                f"round {self.round}: {n} participants but fedsv {self.fedsv.shape} and loo {self.loo.shape}"
            )
        if self.stderr is not None and self.stderr.shape != (n,):
            raise ValueError(f"round {self.round}: {n} participants but stderr {self.stderr.shape}")
        if self.selected is not None and not set(self.participants) <= set(self.selected):
            raise ValueError(f"round {self.round}: participants {self.participants} not all selected")
        if self.folds is not None and self.folds.fedsv.shape[0] != n:
            raise ValueError(
                f"round {self.round}: {n} participants, values per fold of {self.folds.fedsv.shape[0]}"
            )
        grouped = [pid for group in self.merged for pid in group]
        if len(set(grouped)) != len(grouped) or not set(grouped) <= set(self.participants):
            raise ValueError(f"round {self.round}: merged groups {self.merged} are not disjoint participants")
        if not set(self.public) <= set(self.participants) or set(self.public) & set(grouped):
            raise ValueError(
                f"round {self.round}: public {self.public} are not participants apart from groups"
            )
        if any(len(group) < 2 for group in self.merged):
            raise ValueError(f"round {self.round}: a merged group of fewer than two in {self.merged}")
        alike = [pid for group in self.alike for pid in group]
        if (
            len(set(alike)) != len(alike)
            or not set(alike) <= set(self.participants) - set(grouped) - set(self.public)
            or any(len(group) < 2 for group in self.alike)
        ):
            raise ValueError(
                f"round {self.round}: look-alike groups {self.alike} are not disjoint pairs or more of "
                "participants apart from merged groups and public updates"
            )
        if self.classes is not None and self.classes.values.shape[0] != n:
            raise ValueError(
                f"round {self.round}: {n} participants, values per label of {self.classes.values.shape[0]}"
            )

    @property
    def max_stderr(self) -> float:
        """The round's largest standard error (0 for exact values; NaN when not recorded)."""
        return math.nan if self.stderr is None else float(np.max(self.stderr, initial=0.0))

    @property
    def group_rationality_residual(self) -> float:
        """sum_i s_t(i) - (U(I_1..t) - U(I_1..t-1)); zero for exact and group-testing values."""
        return float(np.sum(self.fedsv) - (self.utility_after - self.utility_before))


def normalized(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """values / ||values||_2; a zero vector stays zero."""
    norm = float(np.linalg.norm(values))
    return values / norm if norm > 0 else np.zeros_like(values)


def choice_of(chosen: Plan, result: ValuationResult) -> str:
    """The plan's reason and, for a run to a target, how it ended."""
    target = result.extra.get("target")
    if target is None:
        return chosen.reason
    if target["finished_exact"]:
        ended = f"not there after {target['attempts']} attempts: finished exact"
    else:
        how = "reached" if target["reached"] else "stopped at its cap"
        ended = f"{how} after {target['evaluations']} evaluations"
    surrogate = result.extra.get("control_variate")
    if surrogate is not None and not target["finished_exact"]:
        used = "corrected by the game's surrogate" if surrogate["used"] else "no surrogate"
        ended = f"{ended}; {used} ({surrogate['reason']})"
    return f"{chosen.reason}; {ended}" if chosen.reason else ended


def merged_note(ids: Sequence[str], groups: Sequence[Sequence[int]]) -> str:
    """What a round's choice says of the members it valued as one player ("" where none)."""
    said = [" and ".join(ids[i] for i in g) + " valued as one player" for g in groups if len(g) > 1]
    return "; ".join(said) + " (updates far more alike than independent data give)" if said else ""


def alike_note(ids: Sequence[str], alike: Sequence[Sequence[int]]) -> str:
    """What a round's choice says of the members whose updates looked alike but were valued apart."""
    said = [" and ".join(ids[i] for i in g) for g in alike if len(g) > 1]
    if not said:
        return ""
    return "; ".join(said) + " alike, valued apart (updates far more alike than independent data give)"


def public_note(ids: Sequence[str], public: Sequence[int]) -> str:
    """What a round's choice says of the members whose updates it held in every coalition."""
    if not public:
        return ""
    names = " and ".join(ids[i] for i in public)
    return f"{names} in every coalition, valued 0 (nothing beyond the global model's recent steps)"


def _expanded(play: MergedGame, split: SplitValues) -> SplitValues:
    """A merged game's values per label and fold, per member (a group's split equally)."""
    classes = folds = None
    if split.classes is not None:
        classes = ClassValues(play.expand(split.classes.values), play.expand(split.classes.stderr))
    if split.folds is not None:
        folds = FoldValues(play.expand(split.folds.fedsv), play.expand(split.folds.loo), split.folds.shares)
    return SplitValues(classes, folds)


def value_round(
    game: Game,
    participant_ids: Sequence[str],
    round: int,
    spec: ValuationSpec | None = None,
    on_plan: Callable[[Plan], None] | None = None,
    groups: Sequence[Sequence[int]] | None = None,
    public: Sequence[int] = (),
    alike: Sequence[Sequence[int]] = (),
) -> RoundValues:
    """Run the planned Shapley estimator and leave-one-out on one round's game (shared cache), timed.

    on_plan sees the plan (method and evaluation budget, measured on the game when the spec has a time
    budget) before the estimator runs: a caller that keeps it can value the round again identically.
    `groups`: a partition of the players into those valued as one player (redundant members: a group's
    values, its leave-one-out and its values per label split equally among them); None: each alone.
    `public`: players whose updates hold nothing beyond what the coordinator broadcast (fedsv.fl.
    public_steps): in every coalition, the empty one too, and valued exactly 0; `groups` then partition
    the others. `alike`: groups of players whose updates looked redundant but are valued apart
    (merging off): recorded and said, nothing else changes.
    """
    ids = list(participant_ids)
    if len(ids) != game.m:
        raise ValueError(f"round {round}: {len(ids)} participant ids for a game of {game.m} players")
    spec = spec or ValuationSpec()
    public = sorted({int(i) for i in public})
    groups = check_groups(groups, game.m, public) if groups is not None else alone(game.m, public)
    play = MergedGame(game, groups, public) if merges(groups) or public else None
    before = game.evaluations
    start, cpu_start = time.perf_counter(), time.process_time()
    valued = game if play is None else play
    chosen = plan_game(valued, spec)
    if on_plan is not None:
        on_plan(chosen)
    result = make_estimator(chosen, spec).run(valued)
    loo = LeaveOneOut().run(valued)
    split = split_values(valued, chosen, spec, result)
    fedsv, loo_values = result.values, loo.values
    stderr = np.zeros(valued.m) if result.stderr is None else result.stderr
    choice = choice_of(chosen, result)
    if play is not None:
        fedsv, loo_values, stderr = play.expand(fedsv), play.expand(loo_values), play.expand(stderr)
        split = _expanded(play, split)
        choice = "; ".join(filter(None, (choice, merged_note(ids, groups), public_note(ids, public))))
    choice = "; ".join(filter(None, (choice, alike_note(ids, alike))))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    rv = RoundValues(
        round=int(round),
        participants=ids,
        fedsv=fedsv,
        loo=loo_values,
        utility_before=loo.utility_empty,
        utility_after=loo.utility_grand,
        method=result.method,
        evaluations=game.evaluations - before,
        seconds=seconds,
        stderr=stderr,
        cpu_seconds=cpu_seconds,
        computed_by=game.computed_by,
        classes=split.classes,
        folds=split.folds,
        choice=choice,
        merged=[[ids[i] for i in g] for g in groups if len(g) > 1],
        public=[ids[i] for i in public],
        alike=[[ids[i] for i in g] for g in alike if len(g) > 1],
    )
    logger.info(
        "round %d: %s over %d participants (%s), %d evaluations, %.3fs, largest stderr %.2g, residual %.2e",
        rv.round,
        rv.method,
        game.m,
        rv.choice,
        rv.evaluations,
        seconds,
        rv.max_stderr,
        rv.group_rationality_residual,
    )
    return rv
