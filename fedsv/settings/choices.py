"""The settings' closed choices as enums (a test checks each against the layer that acts on it)."""

from __future__ import annotations

from enum import StrEnum


class Dataset(StrEnum):
    """The data sets a simulated run reads (fedsv.data.registry)."""

    EMBEDDED = "embedded"
    MNIST = "mnist"
    FASHION_MNIST = "fashion_mnist"
    CIFAR10 = "cifar10"


class Partition(StrEnum):
    """How a simulated run's training data is split over its participants."""

    IID = "iid"
    NONIID = "noniid"


class ModelName(StrEnum):
    """The paper's built-in models (fedsv.task.models)."""

    MLP = "mlp"
    CNN = "cnn"  # the CNN that fits the data: cnn_mnist for 1x28x28 images, cnn_cifar for 3x32x32
    CNN_MNIST = "cnn_mnist"
    CNN_CIFAR = "cnn_cifar"
    RESNET18 = "resnet18"  # ResNet-18 for 32x32 images (fedsv.task.resnet)


class Draw(StrEnum):
    """How each round's members are drawn (fedsv.fl.selection)."""

    BALANCED = "balanced"
    INDEPENDENT = "independent"


class Metric(StrEnum):
    """The utility of the built-in models."""

    ACCURACY = "accuracy"
    NEG_LOSS = "neg_loss"


class ValidationFrom(StrEnum):
    """The files a simulation's validation set is cut from."""

    TRAIN = "train"
    TEST = "test"


class ValuationMethod(StrEnum):
    """What a run values with: any method of fedsv.valuation.estimators.methods but the random baseline, or
    none."""

    AUTO = "auto"
    EXACT = "exact"
    REGRESSION = "regression"
    SVARM = "svarm"
    KERNELSHAP = "kernelshap"
    LEVERAGE = "leverage"
    PERMUTATION = "permutation"
    GTG = "gtg"
    GROUP_TESTING = "group_testing"
    LOO = "loo"
    NONE = "none"


class Aggregation(StrEnum):
    """The rules that aggregate a round (fedsv.fl.aggregation)."""

    FEDAVG = "fedavg"
    UNIFORM = "uniform"
    MEDIAN = "median"
    TRIMMED_MEAN = "trimmed_mean"
    KRUM = "krum"
    MULTI_KRUM = "multi_krum"


class NormPolicy(StrEnum):
    """What happens to an update whose norm is over the bound (fedsv.fl.update_bounds)."""

    CLIP_OR_REJECT = "clip-or-reject"
    REJECT = "reject"
    CLIP = "clip"
    NONE = "none"


class ValuationSchedule(StrEnum):
    """When the coordinator values a round."""

    PIPELINED = "pipelined"
    INLINE = "inline"


class Precision(StrEnum):
    """The arithmetic of the round games (fedsv.valuation.round.device)."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
