"""FedSVStrategy on a real (in-process) Flower federation: values, efficiency, ledger, zero extra traffic."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the fedsv[flower] extra is not installed")

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (
    FedAdam,
    FedAvg,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    Krum,
    MultiKrum,
    Strategy,
)

from fedsv.app.report import build_report
from fedsv.app.report_text import format_table
from fedsv.app.run_dirs import resolve_run
from fedsv.integrations.flower import FedSVStrategy, UnsupportedStrategyError
from fedsv.integrations.flower.replies import read_round
from fedsv.pipeline.valuers import BackgroundValuer
from fedsv.valuation import ExactShapley, RoundGame, ValuationSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "flower"))
from fedsv_flower import task
from fedsv_flower.client_app import app as client_app

from tests.support.flower_engine import RecordingGrid, run_federation

NODES, ROUNDS = 10, 2


def _run(strategy: Strategy) -> tuple[object, RecordingGrid]:
    random.seed(0)  # FedAvg samples the evaluation nodes with `random`

    def server(grid: Grid) -> object:
        return strategy.start(
            grid=grid, initial_arrays=ArrayRecord(task.model().state_dict()), num_rounds=ROUNDS
        )

    return run_federation(client_app, NODES, server)


def _validation() -> tuple[np.ndarray, np.ndarray]:
    data = task.splits().validation
    return data.x, data.y


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("flower")
    plain = FedAvg(fraction_train=1.0, fraction_evaluate=0.5, min_available_nodes=NODES)
    _, plain_grid = _run(plain)
    wrapped = FedSVStrategy(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.5, min_available_nodes=NODES),
        task.model(),
        validation=_validation(),
        valuation=ValuationSpec(method="exact"),
        ledger=out,
    )
    result, grid = _run(wrapped)
    wrapped.close()
    return {"plain": plain_grid, "wrapped": wrapped, "grid": grid, "result": result, "dir": out}


def test_same_messages_and_bytes_with_and_without_the_wrapper(runs: dict[str, object]) -> None:
    plain, grid = runs["plain"], runs["grid"]
    assert isinstance(plain, RecordingGrid) and isinstance(grid, RecordingGrid)
    assert len(grid.sent) == len(plain.sent) and len(grid.received) == len(plain.received)
    # Every message's content (records, arrays) is byte for byte the same size; whole messages differ
    # only by the varint length of the run's random node and run ids in their metadata.
    for name in ("sent", "received"):
        ours, theirs = getattr(grid, name), getattr(plain, name)
        assert sorted((t, c) for t, _, c in ours) == sorted((t, c) for t, _, c in theirs)
        assert abs(sum(b for _, b, _ in ours) - sum(b for _, b, _ in theirs)) <= 4 * len(ours)


def test_values_sum_to_each_rounds_utility_gain(runs: dict[str, object]) -> None:
    wrapped = runs["wrapped"]
    assert isinstance(wrapped, FedSVStrategy)
    # valued off Flower's round path, by the coordinator's valuation process
    assert isinstance(wrapped.valuer, BackgroundValuer) and wrapped.valuer.worker.process_pid is not None
    assert sorted(wrapped.rounds) == list(range(1, ROUNDS + 1))
    for values in wrapped.rounds.values():
        assert len(values.participants) == NODES
        assert set(values.participants) == {f"p{i:03d}" for i in range(NODES)}  # their partition-id
        gain = values.utility_after - values.utility_before
        assert float(values.fedsv.sum()) == pytest.approx(gain, abs=1e-9)


def test_utility_after_is_the_accuracy_of_flowers_aggregate(runs: dict[str, object]) -> None:
    wrapped, result = runs["wrapped"], runs["result"]
    assert isinstance(wrapped, FedSVStrategy)
    net = task.model()
    net.load_state_dict(result.arrays.to_torch_state_dict())  # type: ignore[attr-defined]
    x, y = (torch.from_numpy(a) for a in _validation())
    _, accuracy = task.evaluate(net, x, y)
    assert wrapped.rounds[ROUNDS].utility_after == pytest.approx(accuracy, abs=1.5 / len(y))


def test_the_ledger_reads_back_with_fedsv_report(runs: dict[str, object]) -> None:
    report = build_report(runs["dir"])  # type: ignore[arg-type]
    wrapped = runs["wrapped"]
    assert isinstance(wrapped, FedSVStrategy)
    assert [entry["round"] for entry in report["rounds"]] == list(range(1, ROUNDS + 1))
    for entry in report["rounds"]:
        values = wrapped.rounds[entry["round"]]
        assert entry["values"] == pytest.approx(
            dict(zip(values.participants, values.fedsv.tolist(), strict=True))
        )
        assert entry["messages_down"] == NODES and entry["messages_up"] == NODES
        assert entry["bytes_up"] > 0 and entry["model_bytes"] > 0
    assert report["totals"]["fedsv"] == pytest.approx(wrapped.totals()["fedsv"])
    # every client trained every round: nothing to complete, so the completed values are FedSV's
    assert report["totals"]["fedsv_completed"] == pytest.approx(report["totals"]["fedsv"], abs=1e-12)
    classes = report["classes"]  # values per validation label, adding up to each client's value
    assert classes["rounds_split"] == ROUNDS and classes["labels"] == 10
    # the wrapper scored other initial models of the app's model (reset_parameters under other seeds):
    # the initial model's part of every error is known, as under `fedsv launch`
    initial = report["stderr_parts"]["initial"]["fedsv_completed"]
    assert initial and all(e is not None and e > 0 for e in initial.values())
    for pid, value in report["totals"]["fedsv"].items():
        assert sum(classes["totals"][pid]) == pytest.approx(value, abs=1e-9)


def test_values_match_a_round_game_on_the_saved_round(tmp_path: Path) -> None:
    seen: dict[int, tuple[ArrayRecord, list[Message]]] = {}

    class Saving(FedSVStrategy):
        def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
            replies = list(replies)
            seen[server_round] = (self._arrays[server_round], replies)
            return super().aggregate_train(server_round, replies)

    wrapped = Saving(
        FedAvg(min_available_nodes=4),
        task.model(),
        validation=_validation(),
        valuation=ValuationSpec(method="exact"),
        ledger=tmp_path,
    )
    random.seed(0)
    run_federation(
        client_app,
        4,
        lambda grid: wrapped.start(
            grid=grid, initial_arrays=ArrayRecord(task.model().state_dict()), num_rounds=1
        ),
    )
    wrapped.close()
    arrays, replies = seen[1]
    saved = read_round(1, arrays, replies, wrapped.names, "num-examples")
    x, y = _validation()
    game = RoundGame(task.model(), saved.global_params, saved.deltas, saved.num_samples, x, y, mode="naive")
    expected = ExactShapley().run(game).values
    np.testing.assert_allclose(wrapped.rounds[1].fedsv, expected, atol=1e-9)


def test_a_strategy_it_cannot_value_is_refused_in_one_line() -> None:
    with pytest.raises(UnsupportedStrategyError) as info:
        FedSVStrategy(FedAdam(), task.model(), validation=_validation())
    assert "\n" not in str(info.value) and "FedAdam" in str(info.value)
    assert FedSVStrategy(FedProx(), task.model(), validation=_validation()).aggregation.name == "fedavg"


def test_the_wrapper_speaks_in_flowers_log(
    runs: dict[str, object], caplog: pytest.LogCaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`flwr run --stream` shows the flwr logger: a line at start names the resolved ledger, and a line
    per valued round gives the method, evaluations and the top and bottom participant."""
    from fedsv.integrations.flower.strategy import round_line

    wrapped = runs["wrapped"]
    assert isinstance(wrapped, FedSVStrategy)
    line = round_line(wrapped.rounds[1])
    assert line.startswith("fedsv: round 1 valued (exact, ") and "top p" in line and "bottom p" in line
    assert wrapped.recorder.path is not None and wrapped.recorder.path.is_absolute()
    monkeypatch.chdir(tmp_path)  # where Flower's process would run
    with caplog.at_level("INFO", logger="flwr"):
        relative = FedSVStrategy(FedAvg(), task.model(), validation=_validation(), ledger="relative-run")
    try:
        run_dir = tmp_path / "relative-run" / relative.recorder.run_id
        assert relative.recorder.path == (run_dir / "ledger.sqlite").resolve()
        assert any(str(relative.recorder.path) in r.getMessage() for r in caplog.records)
    finally:
        relative.close()


@pytest.mark.parametrize(
    ("strategy", "rule"),
    [
        (FedMedian(min_available_nodes=5), ("median", 0.1, 1, 0)),
        (FedTrimmedAvg(beta=0.2, min_available_nodes=5), ("trimmed_mean", 0.2, 1, 0)),
        (Krum(num_malicious_nodes=1, min_available_nodes=5), ("krum", 0.1, 1, 0)),
        (
            MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3, min_available_nodes=5),
            ("multi_krum", 0.1, 1, 3),
        ),
    ],
    ids=["FedMedian", "FedTrimmedAvg", "Krum", "MultiKrum"],
)
def test_robust_strategies_are_valued_against_flowers_own_aggregate(
    strategy: Strategy, rule: tuple[str, float, int, int], tmp_path: Path
) -> None:
    """Each maps to fedsv's rule with its parameters, and the grand coalition's utility is the accuracy
    of the model Flower's own aggregate_train built: the values split exactly Flower's round."""
    wrapped = FedSVStrategy(
        strategy,
        task.model(),
        validation=_validation(),
        valuation=ValuationSpec(method="exact"),
        ledger=tmp_path,
        background=False,
        name_of=lambda message: f"hospital-{message.metadata.src_node_id}",
    )
    a = wrapped.aggregation
    assert (a.name, a.trim, a.byzantine, a.keep) == rule
    random.seed(0)
    result, _ = run_federation(
        client_app,
        5,
        lambda grid: wrapped.start(
            grid=grid, initial_arrays=ArrayRecord(task.model().state_dict()), num_rounds=1
        ),
    )
    wrapped.close()
    net = task.model()
    net.load_state_dict(result.arrays.to_torch_state_dict())  # type: ignore[attr-defined]
    x, y = (torch.from_numpy(arr) for arr in _validation())
    _, accuracy = task.evaluate(net, x, y)
    values = wrapped.rounds[1]
    assert values.utility_after == pytest.approx(accuracy, abs=1.5 / len(y))
    assert float(values.fedsv.sum()) == pytest.approx(values.utility_after - values.utility_before, abs=1e-9)
    # long names (name_of=) line up in `fedsv report`
    assert all(pid.startswith("hospital-") and len(pid) > 20 for pid in values.participants)
    table = format_table(build_report(tmp_path)).splitlines()
    header = next(i for i, line in enumerate(table) if line.lstrip().startswith("rank"))
    rows = table[header : table.index("", header)]
    assert len(rows) == 6 and len({len(line) for line in rows}) == 1


def test_the_app_runs_twice_into_one_ledger_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Each app run is a new run in its own directory under ledger=; `fedsv report FOLDER` lists them
    and reports the latest, named by the ClientApp's fedsv_names mod. start() ends the wrapper's work
    (no close() call), leaving no empty ledger.pending/, and Flower's stream says how the games ran."""
    ids = []
    for _ in range(2):
        wrapped = FedSVStrategy(
            FedAvg(min_available_nodes=3), task.model(), validation=_validation(), ledger=tmp_path / "flower"
        )
        random.seed(0)
        with caplog.at_level("INFO", logger="flwr"):
            run_federation(
                client_app,
                3,
                lambda grid, w=wrapped: w.start(  # type: ignore[misc]
                    grid=grid, initial_arrays=ArrayRecord(task.model().state_dict()), num_rounds=1
                ),
            )
        assert wrapped.valuer.background and wrapped.recorder.path is not None
        assert not wrapped.recorder.path.with_suffix(".pending").exists()
        ids.append(wrapped.recorder.run_id)
    said = [r.getMessage() for r in caplog.records]
    assert any("round games computed in mode 'fast'" in line for line in said), said
    assert any("round 1 valued" in line and "CPU-s" in line for line in said), said
    ledger, runs = resolve_run(tmp_path / "flower")
    assert [run.run_id for run in runs] == ids and ledger.parent.name == ids[1]
    report = build_report(tmp_path / "flower")
    assert report["run_id"] == ids[1]
    assert set(report["totals"]["fedsv"]) == {"p000", "p001", "p002"}
    from fedsv.app.cli import main

    assert main(["report", str(tmp_path / "flower")]) == 0
    out, err = capsys.readouterr()
    assert f"run {ids[1]}: 1 round, no test set" in out and "2 runs in" in err
    assert all(" 1 round " in line for line in err.splitlines()[1:])
    assert [line.split()[0] for line in err.splitlines()[1:]] == [ids[0], "*"]


def test_a_model_defined_in_main_is_valued_inline_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The valuation process does not import the parent's __main__, so a model class defined there
    (a script's own Net) cannot reach it: the wrapper values inline and says so in Flower's log."""

    class Net(torch.nn.Sequential):
        pass

    Net.__module__ = "__main__"
    model = Net(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    with caplog.at_level("INFO", logger="flwr"):
        wrapped = FedSVStrategy(FedAvg(), model, validation=_validation(), ledger=tmp_path)
    try:
        assert not wrapped.valuer.background
        assert any(
            "valuing inline" in r.getMessage() and "__main__" in r.getMessage() for r in caplog.records
        )
    finally:
        wrapped.close()


@pytest.mark.parametrize(
    ("node_config", "expected"),
    [
        ({"partition-id": 7, "num-partitions": 10}, "p007"),
        ({"partition-id": 7, "fedsv-name": "hospital-a"}, "hospital-a"),
        ({}, None),  # nothing to name it by: the server falls back to node-<id>
    ],
)
def test_the_names_mod_puts_the_node_name_in_training_replies(
    node_config: dict[str, int | str], expected: str | None
) -> None:
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from fedsv.integrations.flower import fedsv_names
    from fedsv.integrations.flower.replies import client_id

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID  # as a run sets
    context = Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config={})  # type: ignore[arg-type]
    for message_type, named in (("train", expected), ("evaluate", None)):
        msg = Message(content=RecordDict(), dst_node_id=5, message_type=message_type)

        def reply(message: Message, _: Context) -> Message:
            return Message(
                content=RecordDict({"metrics": MetricRecord({"num-examples": 3})}), reply_to=message
            )

        out = fedsv_names(msg, context, reply)
        assert ("fedsv" in out.content.config_records) == (named is not None)
        if named is not None:
            assert client_id(out) == named


def _hostile_app(count_of: Callable[[int], float], name: str | None) -> ClientApp:
    """The example's ClientApp, except that each node reports count_of(partition) examples and, when
    `name` is given, claims that name in every training reply."""
    from fedsv_flower import client_app as example
    from flwr.app import ConfigRecord, Context

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        reply = example.train(msg, context)
        metrics = reply.content["metrics"]
        metrics["num-examples"] = count_of(int(context.node_config["partition-id"]))
        if name is not None:
            reply.content["fedsv"] = ConfigRecord({"participant-id": name})
        return reply

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return example.evaluate(msg, context)

    return app


def _one_round(app: ClientApp, ledger: Path) -> FedSVStrategy:
    wrapped = FedSVStrategy(
        FedAvg(min_available_nodes=3), task.model(), validation=_validation(), ledger=ledger, background=False
    )
    random.seed(0)
    run_federation(
        app,
        3,
        lambda grid: wrapped.start(
            grid=grid, initial_arrays=ArrayRecord(task.model().state_dict()), num_rounds=1
        ),
    )
    wrapped.close()
    return wrapped


def test_a_reply_it_cannot_value_leaves_the_round_recorded_not_valued(tmp_path: Path) -> None:
    """A node reporting a count FedSV cannot use does not stop Flower's run: the round is recorded,
    not valued, and the log says why."""
    wrapped = _one_round(_hostile_app(lambda p: 2.5 if p == 1 else 750, None), tmp_path)
    assert wrapped.rounds == {}
    report = build_report(tmp_path)
    assert [(r["round"], r["status"]) for r in report["rounds"]] == [(1, "not_valued")]


def test_a_name_claimed_by_several_replies_goes_to_none_of_them(tmp_path: Path) -> None:
    wrapped = _one_round(_hostile_app(lambda p: 750, "p000"), tmp_path)
    names = wrapped.rounds[1].participants
    assert len(names) == 3 and all(name.startswith("p000@node-") for name in names)
