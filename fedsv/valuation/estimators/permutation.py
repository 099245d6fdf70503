"""Permutation-sampling Shapley estimator: the paper's Algorithm 2, corrected, with balanced first
positions and either a Hoeffding count of permutations or a hard budget of distinct evaluations."""

from __future__ import annotations

import logging
import math

import numpy as np
import numpy.typing as npt

from fedsv.valuation.estimators.budget import EvaluationBudget
from fedsv.valuation.estimators.monte_carlo import (
    BUDGETED_BATCH,
    STALL_BATCHES,
    Draws,
    MonteCarloEstimator,
    RunningMoments,
    check_accuracy,
)
from fedsv.valuation.games.game import BoolMatrix, Game

logger = logging.getLogger(__name__)

_MAX_BATCH_CELLS = 2**26
"""Membership cells (rows * m) built and evaluated per batch; larger plans are split into a few batches."""


def permutation_budget(m: int, eps: float, delta: float, utility_range: float = 1.0) -> int:
    """Permutations T = ceil(2 r^2 / eps^2 * log(2m / delta)) for an (eps, delta)-approximation.

    Each marginal lies in [-r, r]; Hoeffding gives P(|mean - s_i| >= eps) <= 2 exp(-T eps^2 / (2 r^2))
    = delta / m per player, and a union bound over the m players gives delta.
    """
    check_accuracy(eps, delta, utility_range)
    if m < 1:
        raise ValueError(f"a game needs at least one player, got m={m}")
    return math.ceil(2 * utility_range**2 / eps**2 * math.log(2 * m / delta))


def prefix_rows(perms: npt.NDArray[np.int64]) -> BoolMatrix:
    """Rows (T*m, m): for permutation t, row t*m + i is the coalition of its first i+1 players."""
    t, m = perms.shape
    position = np.argsort(perms, axis=1)  # position[t, j] = where player j stands in permutation t
    rows = position[:, None, :] <= np.arange(m)[None, :, None]  # (T, m prefixes, m players)
    return rows.reshape(t * m, m)


def balanced_permutations(count: int, m: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """`count` random permutations of players 0..m-1 (rows), with every player first equally often.

    Rows come in blocks of m: the first players of a block are a random ordering of all m players
    (a partial last block takes its first players without replacement), the rest of each row is
    uniformly random. Each player stands first count // m or count // m + 1 times, and every row on
    its own is a uniformly random permutation, so the permutation estimator stays unbiased while the
    variance from uneven first positions (the largest marginals, U({i}) - U(empty)) is gone. Any
    leading rows of the result keep both properties; consecutive calls with counts that are multiples
    of m continue the blocks.
    """
    if count < 0 or m < 1:
        raise ValueError(f"need count >= 0 and m >= 1, got count={count}, m={m}")
    blocks = -(-count // m)
    firsts = rng.permuted(np.tile(np.arange(m), (blocks, 1)), axis=1).reshape(-1)[:count]
    keys = rng.random((count, m))
    keys[np.arange(count), firsts] = -1.0  # the chosen first player sorts first, the rest by random keys
    return np.argsort(keys, axis=1).astype(np.int64)


def credited_marginals(
    utilities: npt.NDArray[np.float64], perms: npt.NDArray[np.int64], empty: float
) -> npt.NDArray[np.float64]:
    """Per-permutation marginals credited to players: utilities (T, m) of each permutation's prefixes
    of sizes 1..m; result[t, j] is player j's marginal in permutation t (every permutation starts
    from U(empty))."""
    count = perms.shape[0]
    previous = np.concatenate([np.full((count, 1), empty), utilities[:, :-1]], axis=1)
    marginals = utilities - previous  # marginals[t, i] belongs to player perms[t, i]
    credited = np.empty_like(marginals)
    np.put_along_axis(credited, perms, marginals, axis=1)
    return credited


def round_up(value: int, step: int) -> int:
    """The smallest multiple of `step` that is >= value."""
    return -(-value // step) * step


class PermutationSampling(MonteCarloEstimator):
    """Monte-Carlo Shapley values from random permutations (Algorithm 2, corrected).

    Every permutation starts from U(empty), and the marginal of the i-th prefix is credited to the
    player standing at position i. Permutations are balanced (balanced_permutations(): every player
    first equally often). All prefixes are evaluated in batches through the game's cache, so the
    distinct evaluations never exceed 2^m.

    How many permutations:
    - without `budget`: `count` permutations if given, else the Hoeffding count permutation_budget() for
      the (eps, delta) target.
    - with `budget` (distinct evaluations, including U(empty) and U(all)): permutations are drawn in
      batches and admitted whole, in order, while their prefixes' new distinct coalitions fit the
      budget (EvaluationBudget.fit_groups), so `result.evaluations <= budget` always; sampling stops
      at the first permutation that does not fit, after `count` (if given, else
      MAX_BUDGETED_SAMPLES) permutations, or after STALL_BATCHES batches in a row without a new
      coalition. If not even one permutation fits, every player gets (U(all) - U(empty)) / m with a
      NaN standard error and `samples == 0`.
    """

    method = "permutation"
    sample_name = "permutations"

    def count_for(self, m: int) -> int:
        return permutation_budget(m, self.eps, self.delta, self.utility_range)

    def sample(self, draws: Draws) -> None:
        limit = self.sample_count(draws.game.m)
        if draws.budget is None:
            self._run_counted(draws.game, limit, draws.rng, draws.stats, draws.empty)
        else:
            self._run_budgeted(draws.budget, limit, draws.rng, draws.stats, draws.empty)

    def sample_resolution(self, game: Game) -> float | None:
        """Marginals are differences of two utilities: on the game's lattice, if it has one."""
        return game.resolution

    def values(
        self, stats: RunningMoments, empty: float, grand: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        m = stats.mean.shape[0]
        logger.debug("permutation sampling: %d permutations of %d players", stats.count, m)
        if stats.count:
            return stats.mean, stats.stderr()
        logger.warning(
            "permutation sampling: budget %s pays for no permutation of %d players", self.budget, m
        )
        return np.full(m, (grand - empty) / m), np.full(m, np.nan)

    @staticmethod
    def _run_counted(
        game: Game, total: int, rng: np.random.Generator, stats: RunningMoments, empty: float
    ) -> None:
        m = game.m
        per_batch = max(m, _MAX_BATCH_CELLS // (m * m) // m * m)  # whole blocks keep batches balanced
        for start in range(0, total, per_batch):
            perms = balanced_permutations(min(per_batch, total - start), m, rng)
            utilities = game.utilities(prefix_rows(perms)).reshape(perms.shape[0], m)
            stats.add(credited_marginals(utilities, perms, empty))

    @staticmethod
    def _run_budgeted(
        budget: EvaluationBudget, limit: int, rng: np.random.Generator, stats: RunningMoments, empty: float
    ) -> None:
        m = budget.game.m
        cap = max(m, _MAX_BATCH_CELLS // (m * m) // m * m)
        stalled = 0
        while stats.count < limit and stalled < STALL_BATCHES:
            wanted = round_up(max(BUDGETED_BATCH, -(-budget.remaining // (m - 1))), m)
            perms = balanced_permutations(min(wanted, cap, limit - stats.count), m, rng)
            rows = prefix_rows(perms)
            fits = budget.fit_groups(rows, m)
            used = budget.used
            if fits:
                utilities = budget.utilities(rows[: fits * m]).reshape(fits, m)
                stats.add(credited_marginals(utilities, perms[:fits], empty))
            if fits < perms.shape[0]:
                break  # the next permutation's new coalitions overrun the budget
            stalled = stalled + 1 if budget.used == used else 0
