"""The run's seeded draws: who is selected in a round, and the seed of each selected rank's training.

Two rules (the `draw` setting, fedsv.settings.choices.Draw):

- **balanced** (the default): the rounds take the members in blocks of seeded permutations, K at a
  time, so over T rounds each of N members is selected floor(T*K/N) or ceil(T*K/N) times. A block
  that starts within a round puts the members the round already holds at its end, so no round holds a
  member twice and the counts stay balanced. The schedule is a function of the seed alone: a restart
  recomputes it, and a longer run's schedule starts with a shorter one's.
- **independent**: each round draws K of N afresh (the paper's rule, kept for its studies): a member
  of 20 drawn 10 at a time is never drawn in 5 rounds with probability 2^-5.

Neither depends on what a round's updates did: a refused or quarantined member keeps its place in the
schedule (it is valued in its rounds and paid by its values), so no one gains rounds by being refused
and no honest member loses the rounds a refused one would otherwise be given
(docs/decisions/0002-balanced-selection.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

BALANCED_STREAM = 0x5E1EC7
"""Mixed into the seed for the balanced schedule's permutations (a stream apart from the run's RNG)."""


def train_seed(seed: int, round_number: int, rank: int) -> int:
    """The seed of a rank's local training in a round (the coordinator sends it with the task)."""
    return seed * 1_000_003 + round_number * 1009 + rank


def select_ranks(
    rng: np.random.Generator, participants: int, per_round: int, fixed: Sequence[int] | None = None
) -> list[int]:
    """The round's selected ranks: a seeded draw of `per_round` of `participants`, sorted.

    The draw is made even when a `fixed` selection replaces it, so a run that replays some rounds'
    selections keeps the same random stream as the run it replays.
    """
    drawn = sorted(int(r) for r in rng.choice(participants, size=per_round, replace=False))
    return sorted(fixed) if fixed is not None else drawn


def balanced_schedule(seed: int, participants: int, per_round: int, rounds: int) -> list[list[int]]:
    """Each round's selected ranks (sorted) under the balanced rule, rounds 1..`rounds` in order."""
    if not 1 <= per_round <= participants:
        raise ValueError(f"per_round must be 1..{participants}, got {per_round}")
    rng = np.random.default_rng([seed, BALANCED_STREAM])
    queue: list[int] = []
    out: list[list[int]] = []
    for _ in range(rounds):
        chosen: list[int] = []
        while len(chosen) < per_round:
            if not queue:
                block = [int(r) for r in rng.permutation(participants)]
                held = set(chosen)
                queue = [r for r in block if r not in held] + [r for r in block if r in held]
            chosen.append(queue.pop(0))
        out.append(sorted(chosen))
    return out


def selection_counts(schedule: Sequence[Sequence[int]], participants: int) -> list[int]:
    """How many rounds of `schedule` selected each rank."""
    counts = [0] * participants
    for ranks in schedule:
        for rank in ranks:
            counts[rank] += 1
    return counts


@dataclass
class Selector:
    """A run's selections: a round of `fixed` (a replayed selection) as named, else the balanced
    schedule or the independent draw from `rng` (whose state a checkpoint keeps; the balanced rule
    does not use it)."""

    seed: int
    participants: int
    per_round: int
    balanced: bool
    rng: np.random.Generator
    fixed: Mapping[int, Sequence[int]] = field(default_factory=dict)
    _schedule: list[list[int]] = field(default_factory=list, repr=False)

    def ranks(self, round_number: int) -> list[int]:
        """Round `round_number`'s selected ranks, sorted (the independent draw: rounds asked for in
        order, as its RNG's state follows them)."""
        fixed = self.fixed.get(round_number)
        if not self.balanced:
            return select_ranks(self.rng, self.participants, self.per_round, fixed)
        if fixed is not None:
            return sorted(fixed)
        if len(self._schedule) < round_number:  # grown by doubling: a long run recomputes it O(log T) times
            rounds = max(round_number, 2 * len(self._schedule))
            self._schedule = balanced_schedule(self.seed, self.participants, self.per_round, rounds)
        return list(self._schedule[round_number - 1])
