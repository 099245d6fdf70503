"""The settings' enums (fedsv.settings.choices) hold exactly what the layers that act on them accept."""

from __future__ import annotations

from enum import StrEnum

import pytest

from fedsv.data.partition import PARTITION_SCHEMES
from fedsv.data.registry import DATASET_NAMES, VALIDATION_FROM
from fedsv.fl.aggregation import RULES
from fedsv.fl.update_bounds import POLICIES
from fedsv.settings import choices
from fedsv.task.interface import METRICS
from fedsv.task.models import MODELS
from fedsv.valuation.estimators.methods import METHODS
from fedsv.valuation.round.device import PRECISIONS

LAYERS: list[tuple[type[StrEnum], set[str]]] = [
    (choices.Dataset, set(DATASET_NAMES)),
    (choices.Partition, set(PARTITION_SCHEMES)),
    (choices.ModelName, {*MODELS, "cnn"}),  # "cnn": the CNN that fits the data (build_model)
    (choices.Metric, set(METRICS)),
    (choices.ValidationFrom, set(VALIDATION_FROM)),
    (choices.ValuationMethod, {*(m for m in METHODS if m != "random"), "none"}),
    (choices.Aggregation, set(RULES)),
    (choices.NormPolicy, set(POLICIES)),
    (choices.Precision, set(PRECISIONS)),
]


@pytest.mark.parametrize(("enum", "accepted"), LAYERS, ids=lambda v: getattr(v, "__name__", ""))
def test_each_enum_holds_what_its_layer_accepts(enum: type[StrEnum], accepted: set[str]) -> None:
    assert {member.value for member in enum} == accepted
