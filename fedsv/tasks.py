"""Built-in tasks, the paper's setups: `--task fedsv.tasks:mnist_mlp`, `mnist_cnn` or `cifar_cnn`."""

from fedsv.task.paper import PaperTask, cifar_cnn, mnist_cnn, mnist_mlp

__all__ = ["PaperTask", "cifar_cnn", "mnist_cnn", "mnist_mlp"]
