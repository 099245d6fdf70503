"""EvaluationBudget: the distinct utility evaluations an estimator may still cause, never exceeded."""

from __future__ import annotations

import numpy as np

from fedsv.valuation.games.game import BoolMatrix, FloatArray, Game


def check_budget(budget: int | None, what: str = "budget") -> int | None:
    """Validate a budget of distinct utility evaluations (None: no budget given)."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 2:
        raise ValueError(f"{what} must be an integer >= 2 (distinct utility evaluations), got {budget!r}")
    return int(budget)


def minimum_budget(m: int) -> int:
    """The border every sampling method evaluates first: U(empty), U(all), the m singletons and the
    m coalitions of all but one (2m + 2 evaluations, fewer when m is tiny)."""
    return min(2**m, 2 * m + 2)


def require_border(limit: int, m: int, method: str) -> None:
    """ValueError if `limit` cannot pay for the border of a game of m players."""
    need = minimum_budget(m)
    if limit < need:
        raise ValueError(f"{method}: budget {limit} is below the {need} border evaluations of m={m} players")


class EvaluationBudget:
    """At most `limit` distinct new coalitions evaluated on `game` from now on.

    Coalitions already in the game's cache cost nothing. Estimators ask `fit(rows)` or
    `fit_groups(rows, size)` how much of a candidate batch fits, and evaluate through `utilities`,
    which refuses a batch that would overrun the budget (an estimator bug, not a user error).
    """

    def __init__(self, game: Game, limit: int) -> None:
        checked = check_budget(limit)
        assert checked is not None
        self.game = game
        self.limit = checked
        self._start = game.evaluations

    @property
    def used(self) -> int:
        return self.game.evaluations - self._start

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.used)

    def cost(self, members: BoolMatrix) -> int:
        """New distinct evaluations that evaluating `members` would cause."""
        return int(self.game.new_rows(members).sum())

    def fit(self, members: BoolMatrix) -> int:
        """The largest k such that members[:k] costs at most `remaining`."""
        return self.fit_groups(members, 1)

    def fit_groups(self, members: BoolMatrix, group: int) -> int:
        """Rows are consecutive groups of `group` rows (e.g. one permutation's prefixes): the largest
        number of whole leading groups whose new distinct coalitions fit in `remaining`."""
        members = np.asarray(members, dtype=bool)
        if members.shape[0] % group:
            raise ValueError(f"{members.shape[0]} rows are not whole groups of {group}")
        if members.shape[0] == 0:
            return 0
        per_group = self.game.new_rows(members).reshape(-1, group).sum(axis=1)
        return int(np.searchsorted(np.cumsum(per_group), self.remaining, side="right"))

    def utilities(self, members: BoolMatrix) -> FloatArray:
        """Evaluate `members`; raises RuntimeError if that would overrun the budget."""
        cost = self.cost(members)
        if cost > self.remaining:
            raise RuntimeError(f"batch needs {cost} new evaluations, budget has {self.remaining} left")
        return self.game.utilities(members)
