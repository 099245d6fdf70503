"""Why the coordinator refuses a call or an update: one name per reason (status_codes: its status code)."""

from __future__ import annotations

from enum import StrEnum


class Refusal(StrEnum):
    """A refusal's reason: the label of fedsv_updates_rejected_total and the key of its gRPC status code.
    The wire codec's WireError reasons (fedsv.wire.codec) are members too, by value."""

    BAD_CREDENTIAL = "bad_credential"
    BAD_PARTICIPANT_TOKEN = "bad_participant_token"
    BAD_TOKEN = "bad_token"
    NO_CERTIFICATE = "no_certificate"
    NO_CREDENTIAL = "no_credential"
    WRONG_IDENTITY = "wrong_identity"
    SENDER_MISMATCH = "sender_mismatch"
    UNKNOWN_PARTICIPANT = "unknown_participant"
    WRONG_WORLD_SIZE = "wrong_world_size"
    BAD_RANK = "bad_rank"
    TOO_MANY_STREAMS = "too_many_streams"
    TOO_MANY_PARTICIPANTS = "too_many_participants"
    WRONG_ROUND = "wrong_round"
    ROUND_CLOSED = "round_closed"
    NOT_SELECTED = "not_selected"
    DUPLICATE = "duplicate"
    BAD_SAMPLE_COUNT = "bad_sample_count"
    UNDECLARED_SAMPLES = "undeclared_samples"
    SAMPLE_COUNT_MISMATCH = "sample_count_mismatch"
    HEADER_TIMEOUT = "header_timeout"
    REQUEST_TIMEOUT = "request_timeout"
    BAD_HEADER = "bad_header"
    UNEXPECTED_TENSORS = "unexpected_tensors"
    TOO_LARGE = "too_large"
    TOO_MANY_TENSORS = "too_many_tensors"
    BAD_CHUNK = "bad_chunk"
    INCOMPLETE = "incomplete"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    NON_FINITE = "non_finite"
    MALFORMED = "malformed"
