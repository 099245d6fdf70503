"""A rank's local side of a run: its task, its own samples, its model, and one round of local training."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from torch import Tensor, nn

from fedsv.data.corruptions import Corruption, declared_count
from fedsv.data.shards import is_simulated
from fedsv.data.sources import Samples, read_data
from fedsv.fl.device import resolve_device
from fedsv.settings.run_spec import NO_CORRUPTION, WireRun
from fedsv.task.colluders import colluding_update, partner_samples
from fedsv.task.fit import check_fits
from fedsv.task.interface import LoadedTask, TaskError, TrainContext
from fedsv.task.sources import SimulationSettings, rank_samples, rank_source, run_task
from fedsv.wire.v1 import fedsv_pb2

# A task's training may seed torch's process-global RNG (dropout): ranks of one process train one at a
# time so every rank's delta is the same whichever ranks share its process. Processes give parallelism.
_TRAIN_LOCK = threading.Lock()


class LocalSetupError(Exception):
    """This rank cannot take part as configured (its task differs from the run's, its data is bad)."""


@dataclass(frozen=True)
class LocalSettings:
    """What a participant process was told on its command line, for every rank it plays."""

    task: str  # --task; "" = the run's built-in paper task
    data: str  # --data, with {rank} filled in per rank; "" = the run's simulation
    data_dir: str  # --data-dir: the simulated data set's files
    device: str  # --device: where this rank trains (auto: CUDA when present)


def preload(settings: LocalSettings, task: LoadedTask | None, rank: int) -> Samples | None:
    """The rank's samples when they come from its own files (known before Join), else None."""
    if not settings.data.strip():
        return None
    source = rank_source(settings.data, rank, dataset="")
    if is_simulated(source):
        return None
    if task is None:  # the built-in tasks read the standard sources (the model is known after Join)
        return read_data(source)
    samples = task.local_data(source)
    check_fits(task.build_model(0), samples, "training")  # before Join: a file the model cannot take
    return samples


def _keeps_state(model: nn.Module) -> bool:
    """True when the model holds state a round does not overwrite (integer buffers count locally)."""
    return any(not buffer.is_floating_point() for buffer in model.buffers())


@dataclass
class LocalRank:
    """Everything one rank trains with, once the run's spec is known.

    The model is built when the rank trains and dropped afterwards (each round overwrites its
    parameters and float buffers with w_t), so an idle rank holds only its samples; a model with
    integer buffers (they count locally across rounds) is kept."""

    rank: int
    task: LoadedTask
    samples: Samples
    corruption: Corruption | None
    seed: int
    device: str
    model: nn.Module | None = None
    partners: dict[int, Samples] = field(default_factory=dict)  # a colluder's partners' samples

    @classmethod
    def prepare(
        cls,
        rank: int,
        spec: WireRun,
        settings: LocalSettings,
        task: LoadedTask | None,
        samples: Samples | None,
    ) -> LocalRank:
        """Check the run's task is ours, then load our samples (if not loaded yet) and build the model."""
        if spec.task.strip() != settings.task.strip():
            ours, theirs = settings.task.strip() or "(built in)", spec.task.strip() or "(built in)"
            raise LocalSetupError(f"the run's task is {theirs}, this participant was given --task {ours}")
        try:
            loaded = task if task is not None else run_task(spec.task, spec.model, spec.dataset)
            corruption: Corruption | None = None
            partners: dict[int, Samples] = {}
            if samples is None:
                simulation = SimulationSettings(
                    settings.data_dir, spec.seed, spec.holdout, spec.participants, spec.partition
                )
                source = rank_source(settings.data, rank, spec.dataset)
                samples, corruption = rank_samples(loaded, source, rank, simulation, spec.corruption)
                partners = partner_samples(loaded, corruption, rank, settings.data, spec.dataset, simulation)
            elif spec.corruption != NO_CORRUPTION:
                raise TaskError(f"the run corrupts rank {rank}, which applies to simulated data only")
            local = cls(rank, loaded, samples, corruption, spec.seed, settings.device)
            local.partners = partners
            model = local._build()  # a model the task cannot build: an error now, not in round 1
            check_fits(model, samples, "training")  # features or labels the model cannot take: now too
        except (TaskError, ValueError) as exc:
            raise LocalSetupError(str(exc)) from exc
        local.model = model if _keeps_state(model) else None
        return local

    @property
    def declared_samples(self) -> int:
        """The sample count this rank declares (FedAvg's weight)."""
        return declared_count(self.corruption, len(self.samples))

    def _build(self) -> nn.Module:
        return self.task.build_model(self.seed).to(resolve_device(self.device))

    def train(
        self, params: dict[str, Tensor], task: fedsv_pb2.RoundTask, train: WireRun
    ) -> dict[str, Tensor]:
        """One round of local training from the global state `params`; returns the delta."""
        context = TrainContext(
            round=task.round,
            rank=self.rank,
            seed=task.train_seed,
            epochs=train.epochs,
            batch_size=train.batch_size,
            lr=train.lr,
            momentum=train.momentum,
            weight_decay=train.weight_decay,
        )
        with _TRAIN_LOCK:
            model = self.model if self.model is not None else self._build()
            delta = self.task.local_update(model, params, self.samples, context, self.corruption)
            if self.corruption is not None and self.corruption.collude is not None:
                delta = colluding_update(
                    self.task,
                    model,
                    params,
                    self.corruption,
                    (self.rank, delta),
                    self.partners,
                    context,
                    self.seed,
                )
        return {name: tensor.cpu() for name, tensor in delta.items()}  # the wire codec reads host memory
