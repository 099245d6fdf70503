"""A colluding group's update (simulated attacks): every member's honest update from w_t, made one vector.

A colluder of a `--corrupt "1-2=alie"` run holds its partners' data (their simulated shards, or their
files by the `{rank}` template) and trains each partner's update from the w_t it received, with the
partner's own training seed, so the group's vector is the same whichever process computes it and
whether the round selected the partner or not (fedsv.data.collusion crafts it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from torch import Tensor, nn

from fedsv.data.collusion import colluded_update
from fedsv.data.corruptions import Corruption
from fedsv.data.sources import Samples
from fedsv.fl.selection import train_seed
from fedsv.task.interface import LoadedTask, TrainContext
from fedsv.task.sources import SimulationSettings, rank_samples, rank_source


def members(corruption: Corruption | None, rank: int) -> tuple[int, ...]:
    """The colluding group of `rank` (itself included); () where it does not collude."""
    if corruption is None or corruption.collude is None:
        return ()
    return tuple(sorted({*corruption.group, rank}))


def partner_samples(
    task: LoadedTask,
    corruption: Corruption | None,
    rank: int,
    data: str,
    dataset: str,
    settings: SimulationSettings,
) -> dict[int, Samples]:
    """The samples of `rank`'s colluding partners (none where it does not collude)."""
    return {
        r: rank_samples(task, rank_source(data, r, dataset), r, settings)[0]
        for r in members(corruption, rank)
        if r != rank
    }


def colluding_update(
    task: LoadedTask,
    model: nn.Module,
    params: Mapping[str, Tensor],
    corruption: Corruption,
    own: tuple[int, dict[str, Tensor]],
    partners: Mapping[int, Samples],
    context: TrainContext,
    run_seed: int,
) -> dict[str, Tensor]:
    """The vector a colluder sends: its own honest update (`own`: its rank and delta) and each
    partner's, trained from `params` with the partner's seed of this round, crafted by the attack."""
    rank, delta = own
    if corruption.collude is None:
        raise ValueError(f"rank {rank} does not collude")
    honest = []
    for r in members(corruption, rank):
        if r == rank:
            honest.append(delta)
            continue
        theirs = replace(context, rank=r, seed=train_seed(run_seed, context.round, r))
        honest.append(task.local_update(model, params, partners[r], theirs, None))
    return colluded_update(corruption.collude, corruption.collude_factor, honest)
