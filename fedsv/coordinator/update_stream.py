"""SubmitUpdate's reading: the sender named before any message, the header within its deadline, the chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from fedsv.coordinator.calls import Calls
from fedsv.coordinator.refusals import Refusal
from fedsv.coordinator.sessions import ParticipantInfo, Rejected
from fedsv.security.tls import peer_identity
from fedsv.wire.call_settings import PARTICIPANT_KEY, SESSION_TOKEN_KEY, claimed_sender
from fedsv.wire.codec import TensorSetAssembler, TensorSpecs, WireError
from fedsv.wire.v1 import fedsv_pb2

RPC = "SubmitUpdate"


@dataclass(frozen=True)
class UpdateLimits:
    """What one update stream may be: chunk and total bytes, tensors, and seconds to its header."""

    max_chunk_bytes: int
    max_update_bytes: int
    max_tensors: int
    header_timeout: float


@dataclass(frozen=True)
class Sender:
    """Whom a SubmitUpdate call counts against from its start, before it sends anything.

    `identity` holds the call's slot: the certificate's name under mutual TLS, else the participant
    its metadata named (and authenticated with `token`). `token` is None when only a certificate
    named the caller; the header's session token is then checked on its own, as before.
    """

    identity: str
    token: str | None


class UpdateReceiver:
    """Reads SubmitUpdate streams into RunState; every refusal ends the call with its reason's code."""

    def __init__(self, calls: Calls, model_spec: TensorSpecs, limits: UpdateLimits) -> None:
        self.calls = calls
        self.state = calls.state
        self.model_spec = model_spec
        self.limits = limits

    async def submit(
        self, requests: AsyncIterator[fedsv_pb2.UpdateMessage], context: grpc.aio.ServicerContext
    ) -> fedsv_pb2.SubmitReply:
        number = self.state.board.current_round_number()
        peer = peer_identity(context.auth_context())
        sender = await self._sender(peer, context)
        try:
            # The per-participant limit applies now: a stream that never sends its header holds one
            # of its own sender's slots, never the capacity honest participants need.
            self.state.sessions.open_stream(sender.identity, RPC)
        except Rejected as exc:
            await self.calls.refuse(context, exc.reason, str(exc))
        try:
            return await self._receive(number, peer, sender, requests, context)
        finally:
            self.state.sessions.close_stream(sender.identity, RPC)

    async def _sender(self, peer: str | None, context: grpc.aio.ServicerContext) -> Sender:
        """The call's authenticated sender, from its metadata or its certificate; refuses a call
        that names none (UNAUTHENTICATED) or names one it cannot prove."""
        claimed = claimed_sender(context.invocation_metadata())
        if claimed is not None:
            pid, token = claimed
            try:
                self.state.sessions.authenticate(pid, token, peer)
            except Rejected as exc:
                await self.calls.refuse(context, exc.reason, str(exc))
            return Sender(pid, token)
        if peer is not None:
            return Sender(peer, None)
        await self.calls.refuse(
            context,
            Refusal.NO_CREDENTIAL,
            f"an update must name its sender: a client certificate, or {PARTICIPANT_KEY} and "
            f"{SESSION_TOKEN_KEY} metadata",
        )

    async def _receive(
        self,
        number: int,
        peer: str | None,
        sender: Sender,
        requests: AsyncIterator[fedsv_pb2.UpdateMessage],
        context: grpc.aio.ServicerContext,
    ) -> fedsv_pb2.SubmitReply:
        """Read the header (within header_timeout), check it against the sender, then the update."""
        timeout = self.limits.header_timeout
        try:
            first = await asyncio.wait_for(anext(requests, None), timeout)
        except TimeoutError:
            await self.calls.refuse(context, Refusal.HEADER_TIMEOUT, f"no update header within {timeout:g} s")
        if first is None or first.WhichOneof("kind") != "header":
            await self.calls.refuse(context, Refusal.BAD_HEADER, "an update must start with a header")
        header = first.header
        # Counted under the open round, never under the round an unauthenticated header claims (an
        # attacker's round numbers would otherwise create traffic rows that are never collected).
        self.calls.count(number, RPC, "up", first)
        if sender.token is not None and (
            header.participant_id != sender.identity or header.session_token != sender.token
        ):
            await self.calls.refuse(
                context,
                Refusal.SENDER_MISMATCH,
                f"the header speaks for another sender than {sender.identity}",
            )
        try:
            info = self.state.sessions.authenticate(header.participant_id, header.session_token, peer)
            await self._receive_update(info, header, requests, peer)
        except (Rejected, WireError) as exc:
            await self.calls.refuse(context, exc.reason, str(exc))
        reply = fedsv_pb2.SubmitReply(
            accepted=True, round=header.round, bytes_received=header.delta.total_bytes
        )
        self.calls.count(number, RPC, "down", reply)
        return reply

    async def _receive_update(
        self,
        info: ParticipantInfo,
        header: fedsv_pb2.UpdateHeader,
        requests: AsyncIterator[Any],
        peer: str | None,
    ) -> None:
        """Check the update's header, then read, check and hand over its chunks (raises on any fault);
        `peer` is the sender's certificate name under mutual TLS."""
        try:
            self.state.board.check_update(info, header.round, header.num_samples)
        except Rejected as exc:
            # A count that contradicts the one declared at Join cannot be aggregated: as for an update
            # that is not finite, the round stops waiting for it once the others are in, where the
            # sender is proven by its certificate (a stolen token must not burn its owner's round).
            if peer is not None and exc.reason == Refusal.SAMPLE_COUNT_MISMATCH:
                self.state.board.refuse_update(info, header.round, exc.reason)
            raise
        try:
            assembler = TensorSetAssembler(
                header.delta,
                max_total_bytes=self.limits.max_update_bytes,
                max_chunk_bytes=self.limits.max_chunk_bytes,
                expected=self.model_spec,
                max_tensors=self.limits.max_tensors,
            )
            async for message in requests:
                self.calls.count(self.state.board.current_round_number(), RPC, "up", message)
                if message.WhichOneof("kind") != "chunk":
                    raise WireError("bad_chunk", "only chunks may follow the update header")
                assembler.add(message.chunk)
            delta = assembler.finish(require_finite=True)
        except WireError as exc:
            # What it sent cannot be aggregated: the round stops waiting for it (a non-finite update
            # no longer holds its round until the deadline), but only where the sender is proven by
            # its certificate: a stolen session token must not burn its owner's round, and a stream
            # cut short (incomplete) may be sent again.
            if peer is not None and exc.reason != "incomplete":
                self.state.board.refuse_update(info, header.round, exc.reason)
            raise
        self.state.board.accept_update(info, header.round, delta, header.num_samples, header.train_seconds)
