"""The tabular example's task: a small MLP that tells benign from malignant, trained on each member's CSV."""

from torch import nn

from fedsv.task import Task


class BreastCancer(Task):
    """30 standardized measurements per patient, label column "target" (0 malignant, 1 benign)."""

    label = "target"

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 2))


task = BreastCancer()
