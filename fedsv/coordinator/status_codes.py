"""The one table from a refusal's reason (RunState, wire codec, interceptor) to its gRPC status code."""

from __future__ import annotations

import grpc

from fedsv.coordinator.refusals import Refusal

STATUS_OF_REASON: dict[Refusal, grpc.StatusCode] = {
    # who the caller is (RunState: join, authenticate, check_peer)
    Refusal.BAD_CREDENTIAL: grpc.StatusCode.UNAUTHENTICATED,
    Refusal.BAD_PARTICIPANT_TOKEN: grpc.StatusCode.UNAUTHENTICATED,
    Refusal.BAD_TOKEN: grpc.StatusCode.UNAUTHENTICATED,
    Refusal.NO_CERTIFICATE: grpc.StatusCode.UNAUTHENTICATED,
    Refusal.NO_CREDENTIAL: grpc.StatusCode.UNAUTHENTICATED,  # an update naming no sender (update_stream)
    Refusal.WRONG_IDENTITY: grpc.StatusCode.PERMISSION_DENIED,
    Refusal.SENDER_MISMATCH: grpc.StatusCode.PERMISSION_DENIED,  # a header speaking for another sender
    Refusal.UNKNOWN_PARTICIPANT: grpc.StatusCode.UNAUTHENTICATED,  # as a bad token: no id list for strangers
    Refusal.WRONG_WORLD_SIZE: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.BAD_RANK: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.TOO_MANY_STREAMS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Refusal.TOO_MANY_PARTICIPANTS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # when it may submit (RunState.check_update)
    Refusal.WRONG_ROUND: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.ROUND_CLOSED: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.NOT_SELECTED: grpc.StatusCode.PERMISSION_DENIED,
    Refusal.DUPLICATE: grpc.StatusCode.ALREADY_EXISTS,
    # how many samples it has (declared at Join, FedAvg's weight)
    Refusal.BAD_SAMPLE_COUNT: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.UNDECLARED_SAMPLES: grpc.StatusCode.FAILED_PRECONDITION,
    Refusal.SAMPLE_COUNT_MISMATCH: grpc.StatusCode.INVALID_ARGUMENT,
    # what it sends (the header, and the wire codec's WireError reasons)
    Refusal.HEADER_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,  # no header within --header-timeout
    Refusal.REQUEST_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,  # no unary request within it (first_message)
    Refusal.BAD_HEADER: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.UNEXPECTED_TENSORS: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Refusal.TOO_MANY_TENSORS: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Refusal.BAD_CHUNK: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.INCOMPLETE: grpc.StatusCode.INVALID_ARGUMENT,
    Refusal.CHECKSUM_MISMATCH: grpc.StatusCode.DATA_LOSS,
    Refusal.NON_FINITE: grpc.StatusCode.INVALID_ARGUMENT,
    # bytes that are no protobuf message of the method's type (interceptors.MalformedRequests)
    Refusal.MALFORMED: grpc.StatusCode.INVALID_ARGUMENT,
}


def status_of(reason: str) -> grpc.StatusCode:
    """The status code of a refusal (a Refusal, or a WireError's reason); a reason that is no Refusal is a
    bug, so it fails loudly."""
    return STATUS_OF_REASON[Refusal(reason)]
