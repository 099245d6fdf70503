"""Subscribe's events: each stream waits on its own wake-up event until it has a task or the run ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterator

from fedsv.coordinator.calls import Calls
from fedsv.coordinator.loop_thread import threadsafe_setter
from fedsv.coordinator.round_board import OpenRound
from fedsv.wire.codec import ChunkPayloads, encode_tensor_set, iter_chunks
from fedsv.wire.v1 import fedsv_pb2

RPC = "Subscribe"


class RoundEncodings:
    """w_t of the open round, encoded for the wire once and shared by every task stream."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._lock = threading.Lock()
        self._round: OpenRound | None = None
        self._encoded: tuple[fedsv_pb2.TensorSetHeader, ChunkPayloads] | None = None

    def of(self, opened: OpenRound) -> tuple[fedsv_pb2.TensorSetHeader, ChunkPayloads]:
        """The round's header and chunk payloads (encoded by the first stream that asks)."""
        with self._lock:
            if self._encoded is None or self._round is not opened:
                self._encoded = encode_tensor_set(opened.params, chunk_bytes=self.chunk_bytes)
                self._round = opened
            return self._encoded


async def task_events(
    calls: Calls, encodings: RoundEncodings, participant: str, token: str
) -> AsyncGenerator[fedsv_pb2.ServerEvent, None]:
    """The events of `participant`'s task stream under its session `token`: each round's task (w_t in
    chunks) it is selected in, then the run's end. The stream ends early, without the run's end, once
    a newer Join replaced the session: its participant then joins again (a displaced participant
    comes back with a new session instead of holding a stream whose updates are all refused).

    Between rounds the stream costs nothing: it waits on an asyncio event that RunState's callback
    sets (from the round loop's thread, through the event loop) only when this participant is
    selected or the run ends. No timeout: a client that goes away cancels the call, and with it
    this generator.
    """
    board = calls.state.board
    news = asyncio.Event()
    wake = threadsafe_setter(asyncio.get_running_loop(), news)
    board.listen(participant, wake)
    try:
        sent_round = 0
        while True:
            news.clear()  # before polling: a wake-up after the poll sets it again
            if not calls.state.sessions.is_current(participant, token):
                return
            now = board.poll(participant, sent_round)
            if now.task is not None:
                sent_round = now.task.round
                # off the event loop: a large model takes a while to encode, once a round
                encoded = await asyncio.get_running_loop().run_in_executor(None, encodings.of, now.task)
                for event in _task(now.task, encoded, participant):
                    calls.count(sent_round, RPC, "down", event)
                    yield event
            elif now.finished:
                end = fedsv_pb2.RunEnd(reason=board.end_reason, rounds_completed=now.rounds_completed)
                event = fedsv_pb2.ServerEvent(end=end)
                calls.count(now.rounds_completed, RPC, "down", event)
                yield event
                board.told(participant)
                return
            else:
                await news.wait()
    finally:
        board.unlisten(participant, wake)


def _task(
    task: OpenRound, encoded: tuple[fedsv_pb2.TensorSetHeader, ChunkPayloads], participant: str
) -> Iterator[fedsv_pb2.ServerEvent]:
    """The RoundTask event, then w_t's chunks, made one at a time from the round's shared payloads."""
    header, payloads = encoded
    yield fedsv_pb2.ServerEvent(
        task=fedsv_pb2.RoundTask(
            round=task.round,
            deadline_unix_ms=int(task.deadline * 1000),
            model=header,
            train_seed=task.train_seeds[participant],
        )
    )
    for chunk in iter_chunks(header, payloads):
        yield fedsv_pb2.ServerEvent(chunk=chunk)
