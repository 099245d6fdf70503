"""Where each side's samples come from: the task's loaders on its own files, or the simulation's shards."""

from __future__ import annotations

from dataclasses import dataclass

from fedsv.data.corruptions import Corruption, parse_corruption
from fedsv.data.shards import Holdout, Simulation, is_simulated
from fedsv.data.sources import Samples
from fedsv.task.interface import LoadedTask, TaskError, load_task
from fedsv.task.paper import paper_task

RANK_FIELD = "{rank}"


@dataclass(frozen=True)
class SimulationSettings:
    """What a simulated source needs besides its data set's name (from the run's settings)."""

    data_dir: str
    seed: int
    holdout: Holdout
    world_size: int
    partition: str


def run_task(task: str, model: str, dataset: str, metric: str = "accuracy") -> LoadedTask:
    """The run's task: the one `task` names (its own metric), or (task "") the paper's `model` sized for
    `dataset`, valued by `metric`."""
    if task.strip():
        return load_task(task)
    return LoadedTask(f"fedsv.tasks:{model}@{dataset}", paper_task(model, dataset, metric))


def rank_source(template: str, rank: int, dataset: str) -> str:
    """A rank's data source: the template with {rank} filled in; "" means the run's simulation."""
    if not template.strip():
        return f"simulated:{dataset}"
    return template.replace(RANK_FIELD, str(rank))


def rank_samples(
    task: LoadedTask, source: str, rank: int, settings: SimulationSettings, corruption: str = "none"
) -> tuple[Samples, Corruption | None]:
    """A participant's own samples and the corruption it trains with: one of its data (flipped labels, a
    backdoor) on simulated shards only; one of what it sends (a scaled delta, a false count, a free
    rider's noise, replay or mimicry) on any data."""
    if is_simulated(source):
        simulation = Simulation.parse(source, settings.data_dir, settings.seed, settings.holdout)
        samples, parsed = simulation.shard(rank, settings.world_size, settings.partition, corruption)
        return samples, parsed
    parsed = parse_corruption(corruption)
    if parsed.touches_data:
        raise TaskError(f"corruption {corruption!r} applies to simulated data only, not to {source}")
    return task.local_data(source), None if parsed.is_clean else parsed


def evaluation_samples(task: LoadedTask, source: str, which: str, settings: SimulationSettings) -> Samples:
    """The coordinator's validation (which="validation") or test ("test") samples from `source`."""
    if which not in ("validation", "test"):
        raise ValueError(f"which must be validation or test, got {which!r}")
    if is_simulated(source):
        simulation = Simulation.parse(source, settings.data_dir, settings.seed, settings.holdout)
        return simulation.validation() if which == "validation" else simulation.test()
    return task.validation_data(source) if which == "validation" else task.test_data(source)
