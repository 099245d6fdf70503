"""What the coordinator's side of a run is made of: the task, w_0's model, the validation and test sets."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fedsv.fl.evaluation import EvalSet
from fedsv.settings.run import RunConfig
from fedsv.task.fit import check_fits
from fedsv.task.interface import LoadedTask
from fedsv.task.sources import evaluation_samples


@dataclass(frozen=True)
class RunInputs:
    """What the coordinator's side of a run is made of: the task, w_0's model, validation and test sets."""

    task: LoadedTask
    model: nn.Module
    validation: EvalSet
    test: EvalSet | None

    @classmethod
    def load(cls, run: RunConfig) -> RunInputs:
        """Import the task, build the model and read the data; a bad task or file raises ValueError."""
        task = run.load_task()
        model = task.build_model(run.seed)
        validation = evaluation_samples(task, run.validation_source, "validation", run.simulation())
        check_fits(model, validation, "validation")  # a file the model cannot take: refused now
        test = None
        if run.test_source:
            samples = evaluation_samples(task, run.test_source, "test", run.simulation())
            check_fits(model, samples, "test")
            test = EvalSet(samples.x, samples.y)
        return cls(task, model, EvalSet(validation.x, validation.y), test)


@dataclass(frozen=True)
class RunSetup:
    """What the valuation process loads for itself (valuation_process.ValuationSetup): the run's task,
    its model and validation set, read again from the run's settings (a task's model class need not
    pickle)."""

    run: RunConfig

    def load(self) -> tuple[nn.Module, EvalSet]:
        inputs = RunInputs.load(self.run)
        return inputs.model, inputs.validation
