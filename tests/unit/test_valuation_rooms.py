"""fedsv.valuation in rooms by concern: each room imports only the rooms below it, the estimators no torch."""

from __future__ import annotations

import pytest

import fedsv.valuation
from tests.unit.test_import_cycles import circles, import_graph
from tests.unit.test_layers import imported_names, modules_of

ROOMS: dict[str, set[str]] = {
    "games": set(),  # cooperative games: numpy only
    "estimators": {"games"},  # the Shapley estimators, samplers and planning: numpy only
    "round": {"games", "estimators"},  # one FL round as a game, in torch
    "accounting": {
        "games",
        "estimators",
    },  # values per round and across rounds, the recommended value, verdict
    "errors": {"games", "estimators", "accounting"},  # what a value's standard error is made of
    "": {"games", "estimators", "round", "accounting", "errors"},  # federated.py, round_valuation.py
}
"""Each room of fedsv.valuation and the rooms it may import; "" is the package's own modules."""

NO_TORCH = ("games", "estimators", "accounting", "errors")
"""Rooms that compute in numpy: they import no torch (round games are torch, and live in round/)."""

PUBLIC = [
    "AggregationRule", "CallableGame", "Estimator", "ExactShapley", "FederatedValuation", "GTGShapley",
    "Game", "GroupTesting", "KernelSHAP", "LeaveOneOut", "LeverageSHAP", "PermutationSampling", "Plan",
    "RandomValues", "RegressionMSR", "RoundGame", "RoundValues", "StratifiedSVARM", "ValuationResult",
    "ValuationSpec", "plan", "shapley_values",
]  # fmt: skip
"""fedsv.valuation's public names before the rooms: they stay importable from the package."""


def room_of(module: str) -> str | None:
    """The room of a fedsv.valuation module ("" for the package's own modules); None outside it."""
    parts = module.split(".")
    if parts[:2] != ["fedsv", "valuation"]:
        return None
    return parts[2] if len(parts) > 3 else ""


def test_every_module_of_the_valuation_package_is_in_a_room() -> None:
    modules = modules_of("fedsv.valuation")
    assert {room_of(name) for name in modules} == set(ROOMS)
    assert (
        "fedsv.valuation.estimators.permutation" in modules and "fedsv.valuation.round.round_game" in modules
    )


def breaches(room: str, name: str) -> list[str]:
    """What is wrong with a module of `room` importing `name` (nothing where it may)."""
    target, out = room_of(name), []
    if target is not None and target != room and target not in ROOMS[room]:
        out.append(f"{room or 'the package'} must not import {name}")
    if room in ("games", "estimators") and name.startswith("fedsv.") and target not in ROOMS[room] | {room}:
        out.append(f"the {room} import {name}")
    if room in NO_TORCH and name.split(".")[0] in ("torch", "triton"):
        out.append(f"{room} imports {name}")
    return out


@pytest.mark.parametrize("room", list(ROOMS))
def test_each_room_imports_only_the_rooms_below_it(room: str) -> None:
    """Statically, lazy and type-only imports included; the estimators' room imports nothing of fedsv
    but itself (no FL module) and no torch."""
    bad = []
    for module, path in modules_of("fedsv.valuation").items():
        if room_of(module) != room or module == "fedsv.valuation":
            continue
        bad += [
            f"{path}:{line}: {why}"
            for line, name in imported_names(module, path)
            for why in breaches(room, name)
        ]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_each_kind_of_breach() -> None:
    assert breaches("games", "fedsv.valuation.round.round_game")  # upwards
    assert breaches("accounting", "fedsv.valuation.errors.rerun_noise")  # upwards
    assert breaches("estimators", "fedsv.fl.aggregation")  # an FL module in the estimators
    assert breaches("games", "fedsv.valuation.estimators.exact")  # a game importing an estimator
    assert not breaches("estimators", "fedsv.valuation.games.game")
    assert breaches("errors", "torch") and breaches("games", "torch.nn") and breaches("estimators", "torch")
    assert not breaches("errors", "fedsv.valuation.accounting.completion")
    assert not breaches("round", "torch") and not breaches("", "fedsv.valuation.round.round_game")


def test_no_circle_type_only_imports_included() -> None:
    """In fedsv.valuation and everywhere else (the game and its per-cell scores once made one)."""
    graph = import_graph(type_only=True)
    assert graph["fedsv.valuation.games.class_scores"] >= {"fedsv.valuation.games.game"}
    assert "fedsv.valuation.games.class_scores" not in graph["fedsv.valuation.games.game"]
    assert not circles(graph), circles(graph)


def test_the_public_api_is_unchanged() -> None:
    assert sorted(fedsv.valuation.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(fedsv.valuation, name) is not None
    with pytest.raises(AttributeError, match="no attribute"):
        _ = fedsv.valuation.nothing_here
