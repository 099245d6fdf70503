"""The run's settings a participant needs, to and from the wire's RunSpec (one pair of functions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedsv.data.shards import Holdout
from fedsv.wire.v1 import fedsv_pb2

if TYPE_CHECKING:  # a participant reads RunSpecs without loading the run's settings (valuation, ...)
    from fedsv.settings.run import RunConfig

NO_CORRUPTION = "none"


@dataclass(frozen=True)
class WireRun:
    """What a participant learns of the run at Join: the run's settings its ranks train by (named as
    RunConfig names them), its rank's corruption and the largest chunk the coordinator accepts.

    Choices stay strings: they come off the network, and the task that reads them refuses what it
    does not know, with a message naming it."""

    run_id: str
    participants: int
    seed: int
    task: str
    dataset: str
    partition: str
    model: str
    rounds: int
    epochs: int
    batch_size: int
    lr: float
    validation_size: int
    validation_from: str
    test_size: int
    corruption: str = NO_CORRUPTION
    max_chunk_bytes: int = 0  # 0: not said (a coordinator older than the field)
    momentum: float = 0.0
    weight_decay: float = 0.0

    @property
    def holdout(self) -> Holdout:
        """What the run's simulation holds out for the coordinator (the rank's shard is the rest)."""
        return Holdout(self.validation_size, self.validation_from, self.test_size)


CARRIED = (
    "participants", "seed", "task", "dataset", "partition", "model", "rounds", "epochs", "batch_size", "lr",
    "validation_size", "validation_from", "test_size",
)  # fmt: skip
"""The RunConfig settings a RunSpec carries (tests/unit/test_settings_schema.py round-trips each)."""


def to_run_spec(run: RunConfig, run_id: str, corruption: str, max_chunk_bytes: int) -> fedsv_pb2.RunSpec:
    """The RunSpec of a rank of the run that trains with `corruption` (run.corruptions(), parsed once
    for every rank; NO_CORRUPTION for most)."""
    return fedsv_pb2.RunSpec(
        run_id=run_id,
        world_size=run.participants,
        seed=run.seed,
        task=run.task,
        dataset=run.dataset,
        partition=run.partition,
        model=run.model,
        rounds=run.rounds,
        train=fedsv_pb2.TrainSettings(epochs=run.epochs, batch_size=run.batch_size, lr=run.lr),
        validation_size=run.validation_size,
        validation_from=run.validation_from,
        test_size=run.test_size,
        corruption=corruption,
        max_chunk_bytes=max_chunk_bytes,
    )


def from_run_spec(spec: fedsv_pb2.RunSpec) -> WireRun:
    """The settings a RunSpec carries; a field an older coordinator leaves empty takes its default."""
    return WireRun(
        run_id=spec.run_id,
        participants=spec.world_size,
        seed=spec.seed,
        task=spec.task,
        dataset=spec.dataset,
        partition=spec.partition,
        model=spec.model,
        rounds=spec.rounds,
        epochs=spec.train.epochs,
        batch_size=spec.train.batch_size,
        lr=spec.train.lr,
        validation_size=spec.validation_size,
        validation_from=spec.validation_from or "train",
        test_size=spec.test_size,
        corruption=spec.corruption or NO_CORRUPTION,
        max_chunk_bytes=spec.max_chunk_bytes,
        momentum=spec.train.momentum,
        weight_decay=spec.train.weight_decay,
    )
