"""The coordinator's round loop without sockets: fake participants on the board, a fake valuer, a real
ledger; the guard's decisions recorded, and a restart from the ledger that ends where an uninterrupted
run ends."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from fedsv.coordinator.resume import resume
from fedsv.coordinator.round_commit import RoundCommitter
from fedsv.coordinator.round_loop import RoundLoop
from fedsv.coordinator.run_end import FINISHED, STOPPED, RunEnd
from fedsv.coordinator.run_inputs import RunInputs
from fedsv.coordinator.run_state import RunState
from fedsv.coordinator.server_config import ServerConfig
from fedsv.fl.ranks import participant_id
from fedsv.fl.selection import balanced_schedule
from fedsv.fl.state import params_of
from fedsv.ledger import LEDGER_FILE, Ledger
from fedsv.pipeline.metrics import RunMetrics
from fedsv.pipeline.pending import PendingStore
from fedsv.pipeline.round_sink import RoundSink
from fedsv.pipeline.valuers import RoundInputs, Valuer
from fedsv.settings.choices import ValuationMethod
from fedsv.settings.run import UNGUARDED, RunConfig
from fedsv.valuation import FederatedValuation, RoundValues
from fedsv.valuation.round_valuation import GameSettings

RUN = RunConfig(
    participants=6,
    fraction=0.5,
    rounds=3,
    seed=6,
    validation_size=200,
    test_size=200,
    valuation=ValuationMethod.EXACT,
    **UNGUARDED,
)
SERVER = ServerConfig(insecure=True, round_timeout=600.0, join_timeout=600.0, quorum_wait=600.0)
LIAR = "p003"  # sends an update 1,000 times the others' norm: the norm bound refuses it


@dataclass
class FakeValuer(Valuer):
    """Values each round inline as a known game would: participant i of the aggregated gets i + round."""

    accounting: FederatedValuation
    stop_after: int = 0  # set the loop's stop event once this round is committed (0: never)
    loop: RoundLoop | None = None
    seen: list[RoundInputs] = field(default_factory=list)
    background = False

    def value(self, inputs: RoundInputs) -> RoundValues:
        self.seen.append(inputs)
        ids = [update.participant for update in inputs.updates]
        values = RoundValues(
            inputs.number, ids, np.arange(len(ids), dtype=np.float64) + inputs.number, np.zeros(len(ids)),
            0.5, 0.6, "exact", 2 ** len(ids), 0.0, np.zeros(len(ids)), selected=list(inputs.selected or ids),
        )  # fmt: skip
        self.accounting.add_round(values)
        return values

    def committed(self, number: int) -> None:
        if number == self.stop_after and self.loop is not None:
            self.loop.stop_event.set()


def _delta(params: dict[str, torch.Tensor], number: int, pid: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(number * 100 + int(pid[1:]))
    scale = 1000.0 if pid == LIAR else 0.01
    return {name: scale * torch.randn(p.shape, generator=generator) for name, p in params.items()}


def _play(state: RunState, params: dict[str, torch.Tensor], stop: threading.Event) -> None:
    """Six participants that join, and each send their update as soon as a round selecting them opens."""
    infos = {}
    for rank in range(RUN.participants):
        info = state.sessions.join(rank, RUN.participants, "", "test", num_samples=10)
        state.sessions.open_call(info, "Subscribe")
        infos[info.participant_id] = info
    sent: set[int] = set()
    board = state.board
    while not stop.is_set():
        with board.cond:
            opened = board.current
            if board.finished:
                return
            if opened is None or opened.closed or opened.round in sent:
                board.cond.wait(timeout=1.0)
                continue
        for pid in opened.selected:
            board.accept_update(infos[pid], opened.round, _delta(params, opened.round, pid), 10, 0.1)
        sent.add(opened.round)


def _loop(state_dir: Path, stop_after: int = 0) -> tuple[RoundLoop, FakeValuer, Ledger]:
    ledger = Ledger(state_dir / LEDGER_FILE)
    ledger.ensure_run("run-test", RUN.to_dict())
    inputs = RunInputs.load(RUN)
    metrics = RunMetrics(CollectorRegistry())
    world = [participant_id(rank) for rank in range(RUN.participants)]
    progress = resume(ledger, PendingStore(state_dir / "pending"), metrics, params_of(inputs.model), world)
    state = RunState.new(RUN.participants)
    committer = RoundCommitter(RoundSink(ledger, metrics, progress.accounting), state.traffic)
    game = GameSettings(inputs.task.metric, "cpu", "fp32", RUN.aggregation_rule())
    valuer = FakeValuer(progress.accounting, stop_after)
    loop = RoundLoop(RUN, SERVER, state, inputs, game, progress, committer, metrics, valuer)
    valuer.loop = loop
    return loop, valuer, ledger


def _run(loop: RoundLoop) -> RunEnd:
    stop = threading.Event()
    players = threading.Thread(target=_play, args=(loop.state, loop.params, stop), daemon=True)
    players.start()
    try:
        return loop.run()
    finally:
        stop.set()
        players.join(timeout=60)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[RoundLoop, FakeValuer, Ledger]:
    loop, valuer, ledger = _loop(tmp_path_factory.mktemp("whole"))
    assert _run(loop) == FINISHED
    return loop, valuer, ledger


def test_rounds_follow_the_seeded_selection_and_the_norm_bound_refuses_the_liar(
    uninterrupted: tuple[RoundLoop, FakeValuer, Ledger],
) -> None:
    loop, valuer, ledger = uninterrupted
    records = ledger.rounds()
    assert [r.round for r in records] == [1, 2, 3]

    # 3 of 6 per round, balanced: the seed decides who is selected, so a loop seeded otherwise selects
    # others (checked here for this seed, so that the check below has teeth)
    def draws(seed: int) -> list[list[str]]:
        return [[participant_id(r) for r in ranks] for ranks in balanced_schedule(seed, 6, 3, len(records))]

    expected = draws(RUN.seed)
    assert expected != draws(RUN.seed + 1)
    assert len({tuple(selected) for selected in expected}) == 3  # a reseeded round would repeat round 1
    assert LIAR not in expected[0] and LIAR in expected[1]
    assert [record.selected for record in records] == expected
    for record in records:
        # the guard's decision, in the ledger
        assert record.refused == ({LIAR: "norm_rejected"} if LIAR in record.selected else {})
        assert LIAR not in record.received
    # the valuer saw the aggregated updates only, with the round's whole selection
    for inputs, selected in zip(valuer.seen, expected, strict=True):
        assert [u.participant for u in inputs.updates] == [pid for pid in selected if pid != LIAR]
        assert list(inputs.selected or [u.participant for u in inputs.updates]) == selected
    assert loop.completed == 3 and loop.state.board.finished


def test_the_valuer_s_values_are_committed_with_their_rounds(
    uninterrupted: tuple[RoundLoop, FakeValuer, Ledger],
) -> None:
    _, _, ledger = uninterrupted
    rows = {(row.round, row.participant): row.fedsv for row in ledger.values()}
    for record in ledger.rounds():
        number, aggregated = record.round, [pid for pid in record.selected if pid != LIAR]
        assert [rows[(number, pid)] for pid in aggregated] == [number + i for i in range(len(aggregated))]
        assert (number, LIAR) not in rows  # refused: its round record says why (above), it has no value row
    assert all(r.method == "exact" and not r.pending for r in ledger.rounds())


def test_a_restart_from_the_ledger_ends_where_the_uninterrupted_run_ends(
    uninterrupted: tuple[RoundLoop, FakeValuer, Ledger], tmp_path: Path
) -> None:
    whole, _, whole_ledger = uninterrupted
    first, _, ledger = _loop(tmp_path, stop_after=1)
    assert _run(first) == STOPPED
    assert [r.round for r in ledger.rounds()] == [1]
    ledger.close()
    second, valuer, ledger = _loop(tmp_path)  # a new coordinator on the same state directory
    assert second.completed == 1
    assert _run(second) == FINISHED
    assert [v.number for v in valuer.seen] == [2, 3]  # round 1 is not trained or valued again
    assert [r.selected for r in ledger.rounds()] == [r.selected for r in whole_ledger.rounds()]
    for name, tensor in whole.params.items():
        torch.testing.assert_close(second.params[name], tensor, rtol=0, atol=0)
    assert sorted((v.round, v.participant, v.fedsv) for v in ledger.values()) == sorted(
        (v.round, v.participant, v.fedsv) for v in whole_ledger.values()
    )
