"""Functional API: plan() a game's method and evaluation budget, make_estimator(), shapley_values()."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from fedsv.valuation.estimators.border import border_rows
from fedsv.valuation.estimators.budget import minimum_budget
from fedsv.valuation.estimators.estimator import Estimator
from fedsv.valuation.estimators.methods import REGISTRY, SAMPLING_METHODS
from fedsv.valuation.estimators.permutation import permutation_budget
from fedsv.valuation.estimators.result import ValuationResult
from fedsv.valuation.estimators.spec import ValuationSpec
from fedsv.valuation.estimators.surrogate import SURROGATE_EXACT_PLAYERS, SurrogateCorrected
from fedsv.valuation.estimators.target import FALLBACK_STDERR, ToTarget, first_allowance
from fedsv.valuation.games.game import Game, as_game

logger = logging.getLogger(__name__)

SURROGATE_SECONDS = 1.2
"""Beyond SURROGATE_EXACT_PLAYERS, the surrogate's set-up: at m = 20 on 1,000 validation images about
1.2 s (the linearization, the pilot's arithmetic, 16,384 of its coalitions). It pays where the plain
sampler's attempts after its first would take longer (surrogate_pays)."""

PLAIN_FIRST_ATTEMPTS = 2.0
"""A plain sampler reaches a noise target f after about PLAIN_FIRST_ATTEMPTS / f^2 first attempts'
worth of coalitions (its errors fall as one over the root of its coalitions). The MLP at m = 20 took
815 coalitions at f = 1 and 2,753 at f = 0.5, 2.3 and 7.6 first attempts of 362; a corrected sampler
stopped at 1 and 1.5."""

AUTO_SAMPLER = "regression"
"""What "auto" samples with when exact does not fit: the most accurate method per evaluation in
benchmarks/bench_estimators.py (docs/performance.md has the table)."""


@dataclass(frozen=True)
class Plan:
    """How one game will be valued.

    method: the method that runs ("auto" resolved).
    evaluations: distinct utility evaluations allowed (2^m for exact; the budget, or with a target the
        cap, for sampling).
    seconds_per_evaluation: the measured cost of one coalition, when a time budget or a target was given.
    target_stderr: a sampling method runs to this standard error (target.ToTarget); None: to its budget.
    noise_fraction: with a target, each value is sampled to this fraction of its own validation noise
        instead (target_stderr where the game has no validation folds).
    exact_after: with a target, the sampler finishes exact if it has not reached the target by then.
    surrogate: with a target, the sampler is corrected by the game's surrogate where its pilot finds
        that it helps (surrogate.SurrogateCorrected).
    reason: why "auto" chose this, in words (logged, and recorded with the round's values).
    """

    players: int
    requested: str
    method: str
    evaluations: int
    seconds_per_evaluation: float | None = None
    target_stderr: float | None = None
    noise_fraction: float | None = None
    exact_after: int | None = None
    surrogate: bool = False
    reason: str = dataclasses.field(default="", compare=False)  # words: two plans that act alike are equal

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Plan:
        """The plan to_dict() wrote; ValueError if it is not one."""
        try:
            seconds, target = data.get("seconds_per_evaluation"), data.get("target_stderr")
            fraction, after = data.get("noise_fraction"), data.get("exact_after")
            return cls(
                players=int(data["players"]),  # type: ignore[call-overload]
                requested=str(data["requested"]),
                method=str(data["method"]),
                evaluations=int(data["evaluations"]),  # type: ignore[call-overload]
                seconds_per_evaluation=None if seconds is None else float(seconds),  # type: ignore[arg-type]
                target_stderr=None if target is None else float(target),  # type: ignore[arg-type]
                noise_fraction=None if fraction is None else float(fraction),  # type: ignore[arg-type]
                exact_after=None if after is None else int(after),  # type: ignore[call-overload]
                surrogate=bool(data.get("surrogate", False)),
                reason=str(data.get("reason", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a valuation plan: {data!r:.200}") from exc

    def replay(self, spec: ValuationSpec) -> ValuationSpec:
        """A spec that runs exactly this plan again with spec's seed, without measuring time: the same
        values as the run that made the plan (what a restarted coordinator needs)."""
        if self.target_stderr is not None:  # the same target and cap: the stopping rule reads no clock
            return dataclasses.replace(
                spec,
                method=self.method,
                budget=None,
                budget_seconds=None,
                target_stderr=self.target_stderr,
                noise_fraction=self.noise_fraction,
                max_evaluations=self.evaluations,
                exact_after=self.exact_after,
                surrogate=self.surrogate,
            )
        budget = self.evaluations if self.method in SAMPLING_METHODS else spec.budget
        return dataclasses.replace(spec, method=self.method, budget=budget, budget_seconds=None)


def _check_players(m: int) -> int:
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise ValueError(f"a game needs at least one player, got m={m}")
    return int(m)


def evaluation_budget(m: int, spec: ValuationSpec, seconds_per_evaluation: float | None = None) -> int:
    """Distinct evaluations a sampling method may cause on a game of m players.

    spec.budget if given, else the Hoeffding budget of permutation sampling for (eps, delta);
    capped by spec.budget_seconds / seconds_per_evaluation when both are known, and by 2^m; never
    below minimum_budget(m) (a time budget too small for the border is overrun, not ignored).
    """
    m = _check_players(m)
    if spec.budget is not None:
        budget = spec.budget
    else:
        budget = 2 + permutation_budget(m, spec.eps, spec.delta, spec.utility_range) * max(1, m - 1)
    if spec.budget_seconds is not None and seconds_per_evaluation is not None and seconds_per_evaluation > 0:
        budget = min(budget, int(spec.budget_seconds / seconds_per_evaluation))
    return max(minimum_budget(m), min(budget, 2**m))


def plan(m: int, spec: ValuationSpec | None = None, seconds_per_evaluation: float | None = None) -> Plan:
    """The method and evaluation budget for a game of m players (see evaluation_budget())."""
    spec = spec or ValuationSpec()
    m = _check_players(m)
    budget = evaluation_budget(m, spec, seconds_per_evaluation)
    method, reason, exact_after = spec.method, "", spec.exact_after
    if method == "auto":
        if spec.targeted and spec.noise_fraction is not None:
            method, reason, exact_after = auto_to_noise(m, spec, seconds_per_evaluation)
        else:
            method, reason = auto_by_budget(m, spec, budget, seconds_per_evaluation)
    if spec.targeted and REGISTRY[method].sampling:
        surrogate = spec.surrogate and surrogate_pays(m, seconds_per_evaluation, spec.noise_fraction)
        if spec.surrogate and not surrogate:
            reason += "; no surrogate: the coalitions it would save cost less than its set-up"
        return Plan(
            m,
            spec.method,
            method,
            min(spec.max_evaluations, 2**m),
            seconds_per_evaluation,
            spec.target_stderr if spec.target_stderr is not None else FALLBACK_STDERR,
            spec.noise_fraction,
            exact_after if m <= spec.max_exact_players else None,
            surrogate,
            reason,
        )
    evaluations = REGISTRY[method].planned_evaluations(m, budget, spec.settings())
    return Plan(m, spec.method, method, evaluations, seconds_per_evaluation, reason=reason)


def surrogate_pays(m: int, seconds_per_evaluation: float | None, noise_fraction: float | None) -> bool:
    """Whether a surrogate may correct the sampler. Up to SURROGATE_EXACT_PLAYERS, or with no cost
    measured, the pilot alone decides (surrogate.SurrogateCorrected). Beyond, its set-up
    (SURROGATE_SECONDS) must be worth what it saves: about the plain sampler's attempts after its first,
    PLAIN_FIRST_ATTEMPTS / f^2 - 1 first attempts at the measured cost (f: the noise fraction; 1 for an
    absolute target). Read off the plan, so a replayed plan decides alike."""
    if m <= SURROGATE_EXACT_PLAYERS or seconds_per_evaluation is None:
        return True
    fraction = 1.0 if noise_fraction is None else noise_fraction
    saved = first_allowance(m) * seconds_per_evaluation * (PLAIN_FIRST_ATTEMPTS / fraction**2 - 1.0)
    return saved >= SURROGATE_SECONDS


def _cost(m: int, seconds_per_evaluation: float | None) -> str:
    if seconds_per_evaluation is None:
        return f"2^{m} coalitions, cost not measured"
    total = 2**m * seconds_per_evaluation
    return f"2^{m} coalitions would take {total:.3g} s at {seconds_per_evaluation:.3g} s each"


def auto_by_budget(m: int, spec: ValuationSpec, budget: int, seconds: float | None) -> tuple[str, str]:
    """ "auto" without a noise target: (method, reason). Exact where m <= max_exact_players and 2^m
    coalitions fit: the budget, or with an absolute target exact_affordable(); else AUTO_SAMPLER."""
    affordable = exact_affordable(m, spec, seconds) if spec.targeted else 2**m <= budget
    method = "exact" if m <= spec.max_exact_players and affordable else AUTO_SAMPLER
    if m > spec.max_exact_players:
        return method, f"{method}: {m} players, over max_exact_players {spec.max_exact_players}"
    if spec.targeted:
        limit = f"exact_seconds {spec.exact_seconds:g}, max_evaluations {spec.max_evaluations}"
        return method, f"{method}: {_cost(m, seconds)} (exact within {limit})"
    return method, f"{method}: 2^{m} coalitions {'within' if affordable else 'over'} the budget of {budget}"


def auto_to_noise(
    m: int, spec: ValuationSpec, seconds_per_evaluation: float | None
) -> tuple[str, str, int | None]:
    """ "auto" under a noise target: (method, reason, exact_after).

    Exact outright where sampling cannot save (2^m is within the sampler's first attempt) or where all
    2^m coalitions take at most spec.exact_seconds at the measured cost. Otherwise the sampler runs to
    the values' noise and, where exact is allowed (m <= max_exact_players, 2^m <= max_evaluations),
    finishes exact if it has not got there by half of the coalitions: a round then costs at most what
    exact values cost, since the coalitions it sampled are not evaluated again.
    """
    cost = _cost(m, seconds_per_evaluation)
    allowed = m <= spec.max_exact_players and 2**m <= spec.max_evaluations
    if allowed and 2**m <= first_allowance(m):
        return "exact", f"exact: 2^{m} coalitions are within a sampler's first attempt", None
    if allowed and seconds_per_evaluation is not None and 2**m * seconds_per_evaluation <= spec.exact_seconds:
        return "exact", f"exact: {cost}, within exact_seconds {spec.exact_seconds:g}", None
    fraction = f"{spec.noise_fraction:g} of each value's validation noise"
    if allowed:
        after = 2 ** (m - 1)
        return AUTO_SAMPLER, f"{AUTO_SAMPLER} to {fraction} ({cost}); exact if not there by {after}", after
    why = "more players than max_exact_players" if m > spec.max_exact_players else "over max_evaluations"
    return AUTO_SAMPLER, f"{AUTO_SAMPLER} to {fraction} (2^{m} coalitions: {why})", None


def exact_affordable(m: int, spec: ValuationSpec, seconds_per_evaluation: float | None) -> bool:
    """Under an accuracy target, whether "auto" enumerates all 2^m coalitions: when they take at most
    spec.exact_seconds at the measured cost per coalition, or, with no cost measured, when they are no
    more than the evaluations a sampler may spend (spec.max_evaluations)."""
    if seconds_per_evaluation is None:
        return 2**m <= spec.max_evaluations
    return 2**m * seconds_per_evaluation <= spec.exact_seconds


def compute_threads() -> int:
    """The CPU threads a game's work runs on: torch's intra-op threads where torch is loaded (a round
    game computes through it), else 1 (a game in numpy and Python). The estimators need no torch, so
    it is not imported here."""
    torch = sys.modules.get("torch")
    return max(int(torch.get_num_threads()), 1) if torch is not None else 1


def measure_cost(game: Game, busy_proof: bool = False) -> float:
    """Seconds per additional coalition of `game`, after its one-off set-up (game.prepare()).

    Two timed evaluations outside the game's cache (so the distinct evaluations and the estimator's
    draws are those of a run without a time budget): U(empty) alone, then the 2m + 2 border
    coalitions in one batch; their difference over 2m + 1 coalitions is the marginal cost, free of
    the per-call overhead that batches of hundreds amortise.

    busy_proof: for a game that computes on the CPU, this process's CPU time over its torch threads
    instead of the wall clock, so that other work on the machine does not inflate the cost ("auto"'s
    choice; a time budget is wall time and measures the wall clock).
    """
    game.prepare()
    rows = border_rows(game.m, sorted({0, 1, game.m - 1, game.m}))
    threads = compute_threads()
    clock = (
        (lambda: time.process_time() / threads) if busy_proof and game.computes_on_cpu else time.perf_counter
    )
    start = clock()
    game.evaluate_uncached(rows[:1])
    single = clock() - start
    start = clock()
    game.evaluate_uncached(rows)
    batch = clock() - start
    if rows.shape[0] > 1 and batch > single:
        return (batch - single) / (rows.shape[0] - 1)
    return batch / rows.shape[0]


def plan_game(game: Game, spec: ValuationSpec) -> Plan:
    """plan() for this game. With spec.budget_seconds the cost per coalition is measured on it first,
    and the time the measuring took (the game's set-up included) comes off the time budget; with an
    accuracy target and "auto" it is measured to decide whether exact enumeration is affordable."""
    if spec.budget_seconds is None:
        small = 2**game.m <= first_allowance(game.m)
        measure = spec.targeted and spec.method == "auto" and game.m <= spec.max_exact_players and not small
        result = plan(game.m, spec, measure_cost(game, busy_proof=True) if measure else None)
    else:
        started = time.perf_counter()
        cost = measure_cost(game)
        left = max(spec.budget_seconds - (time.perf_counter() - started), 0.0)
        result = plan(game.m, dataclasses.replace(spec, budget_seconds=max(left, 1e-9)), cost)
    if spec.method == "auto":
        logger.info("auto: m=%d %s", game.m, result)
    return result


def make_estimator(chosen: Plan, spec: ValuationSpec) -> Estimator:
    """The estimator object that carries out `chosen`."""
    sampler = REGISTRY[chosen.method]
    if chosen.target_stderr is not None:  # each attempt's budget is a hard one
        settings = dataclasses.replace(spec.settings(), capped=True)
        target = ToTarget(
            sampler,
            settings,
            chosen.target_stderr,
            chosen.evaluations,
            chosen.noise_fraction,
            chosen.exact_after,
        )
        return SurrogateCorrected(target, settings) if chosen.surrogate else target
    return sampler.configured(chosen.evaluations, spec.settings())


def run_spec(game: Game, spec: ValuationSpec) -> ValuationResult:
    """Plan, then run, the valuation of `game`; the result's extra["plan"] records the plan."""
    chosen = plan_game(game, spec)
    result = make_estimator(chosen, spec).run(game)
    return dataclasses.replace(result, extra={**result.extra, "plan": chosen.to_dict()})


def shapley_values(
    utility: Game | Callable[[frozenset[int]], float],
    m: int | None = None,
    spec: ValuationSpec | None = None,
    *,
    budget: int | None = None,
    budget_seconds: float | None = None,
) -> ValuationResult:
    """Values of the m players of `utility` (a Game, or a callable on frozensets of indices 0..m-1).

    `spec` (default ValuationSpec(): "auto", eps = delta = 0.05) says which method and what budget;
    `budget` (distinct utility evaluations, never exceeded) and `budget_seconds` (time, measured on
    the game) override the spec's. The result's `.method` is the method actually used;
    `.evaluations` counts the distinct coalitions this call evaluated.
    """
    if m is not None:
        m = _check_players(m)
    spec = spec or ValuationSpec()
    if budget is not None or budget_seconds is not None:
        spec = dataclasses.replace(
            spec,
            budget=spec.budget if budget is None else budget,
            budget_seconds=spec.budget_seconds if budget_seconds is None else budget_seconds,
        )
    return run_spec(as_game(utility, m), spec)


__all__ = ["SAMPLING_METHODS", "Plan", "make_estimator", "plan", "plan_game", "run_spec", "shapley_values"]
