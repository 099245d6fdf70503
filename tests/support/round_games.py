"""Looking inside a RoundGame in tests: its fast executor, and the scoring every executor calls."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch import Tensor

from fedsv.valuation import RoundGame
from fedsv.valuation.round.executors import fast, whole_model
from fedsv.valuation.round.executors.fast import FastExecutor

Score = Callable[[Tensor, Tensor, object, Tensor, int], Tensor]


def fast_executor(game: RoundGame) -> FastExecutor:
    """The game's executor, which must be mode "fast"."""
    assert isinstance(game.executor, FastExecutor), f"mode {game.mode}, not fast"
    return game.executor


def patch_scores(monkeypatch: pytest.MonkeyPatch, spy: Callable[[Score], Score]) -> None:
    """Route every executor's score_logits through spy(original)."""
    for module in (fast, whole_model):
        monkeypatch.setattr(module, "score_logits", spy(module.score_logits))
