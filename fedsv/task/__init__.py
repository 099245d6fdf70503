"""The public task interface: subclass Task (or write any object with the same attributes) and run it.

    from fedsv.task import Task, read_data

    class Wine(Task):
        label = "class"
        def build_model(self): return torch.nn.Sequential(torch.nn.Linear(13, 32), ...)

Name it on the command line as `--task my_module:Wine` (or `--task path/to/file.py:Wine`). See
docs/tasks.md.
"""

from fedsv.data.sources import DataError, Samples, read_data
from fedsv.task.interface import LoadedTask, Task, TaskError, TrainContext, as_samples, load_task

__all__ = [
    "DataError",
    "LoadedTask",
    "Samples",
    "Task",
    "TaskError",
    "TrainContext",
    "as_samples",
    "load_task",
    "read_data",
]
