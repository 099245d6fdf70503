"""The one table from a refusal's reason (RunState, wire codec, interceptor) to its gRPC status code."""

from __future__ import annotations

import grpc

STATUS_OF_REASON: dict[str, grpc.StatusCode] = {
    # who the caller is (RunState: join, authenticate, check_peer)
    "bad_credential": grpc.StatusCode.UNAUTHENTICATED,
    "bad_participant_token": grpc.StatusCode.UNAUTHENTICATED,
    "bad_token": grpc.StatusCode.UNAUTHENTICATED,
    "no_certificate": grpc.StatusCode.UNAUTHENTICATED,
    "no_credential": grpc.StatusCode.UNAUTHENTICATED,  # an update naming no sender (update_stream)
    "wrong_identity": grpc.StatusCode.PERMISSION_DENIED,
    "sender_mismatch": grpc.StatusCode.PERMISSION_DENIED,  # a header speaking for another sender
    "unknown_participant": grpc.StatusCode.UNAUTHENTICATED,  # as a bad token: no id list for strangers
    "wrong_world_size": grpc.StatusCode.FAILED_PRECONDITION,
    "bad_rank": grpc.StatusCode.INVALID_ARGUMENT,
    "too_many_streams": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "too_many_participants": grpc.StatusCode.RESOURCE_EXHAUSTED,
    # when it may submit (RunState.check_update)
    "wrong_round": grpc.StatusCode.FAILED_PRECONDITION,
    "round_closed": grpc.StatusCode.FAILED_PRECONDITION,
    "not_selected": grpc.StatusCode.PERMISSION_DENIED,
    "duplicate": grpc.StatusCode.ALREADY_EXISTS,
    # how many samples it has (declared at Join, FedAvg's weight)
    "bad_sample_count": grpc.StatusCode.INVALID_ARGUMENT,
    "undeclared_samples": grpc.StatusCode.FAILED_PRECONDITION,
    "sample_count_mismatch": grpc.StatusCode.INVALID_ARGUMENT,
    # what it sends (the header, and the wire codec's WireError reasons)
    "header_timeout": grpc.StatusCode.DEADLINE_EXCEEDED,  # no header within --header-timeout
    "request_timeout": grpc.StatusCode.DEADLINE_EXCEEDED,  # no unary request within it (first_message)
    "bad_header": grpc.StatusCode.INVALID_ARGUMENT,
    "unexpected_tensors": grpc.StatusCode.INVALID_ARGUMENT,
    "too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "too_many_tensors": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "bad_chunk": grpc.StatusCode.INVALID_ARGUMENT,
    "incomplete": grpc.StatusCode.INVALID_ARGUMENT,
    "checksum_mismatch": grpc.StatusCode.DATA_LOSS,
    "non_finite": grpc.StatusCode.INVALID_ARGUMENT,
    # bytes that are no protobuf message of the method's type (interceptors.MalformedRequests)
    "malformed": grpc.StatusCode.INVALID_ARGUMENT,
}


def status_of(reason: str) -> grpc.StatusCode:
    """The status code of a refusal; a reason missing from the table is a bug, so it fails loudly."""
    return STATUS_OF_REASON[reason]
