"""gRPC settings both sides must agree on: HTTP/2 keepalive, and the metadata naming an update's sender."""

from __future__ import annotations

from collections.abc import Iterable

# A SubmitUpdate call names its sender in its metadata, so that the coordinator counts the call
# against that participant's limit before it reads a message (the header repeats both).
PARTICIPANT_KEY = "x-fedsv-participant"
SESSION_TOKEN_KEY = "x-fedsv-session-token"

# Keepalive. Participants ping every minute (20 s for the answer) to notice a dead coordinator on an
# idle task stream; the coordinator accepts pings as often as every 10 s, so that a participant is
# never sent away for pinging too often ("too_many_pings"), and pings every minute itself to notice
# participants that vanished. Pings are answered by gRPC's own threads: a timeout of 20 s holds
# through a burst of thousands of joins.
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
MIN_PING_INTERVAL_MS = 10_000

SERVER_KEEPALIVE: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
    ("grpc.http2.max_pings_without_data", 0),  # keep pinging idle task streams
]
CLIENT_KEEPALIVE: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),  # >= the server's MIN_PING_INTERVAL_MS
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def sender_metadata(participant_id: str, session_token: str) -> tuple[tuple[str, str], ...]:
    """The metadata of a participant's SubmitUpdate call: who sends, and the session token Join gave."""
    return ((PARTICIPANT_KEY, participant_id), (SESSION_TOKEN_KEY, session_token))


def claimed_sender(metadata: Iterable[tuple[str, str | bytes]] | None) -> tuple[str, str] | None:
    """(participant id, session token) a call's metadata claims; None when it names no sender.

    A key given twice counts as not given: the call then needs another credential.
    """
    found: dict[str, list[str | bytes]] = {PARTICIPANT_KEY: [], SESSION_TOKEN_KEY: []}
    for key, value in metadata or ():
        if key in found:
            found[key].append(value)
    pids, tokens = found[PARTICIPANT_KEY], found[SESSION_TOKEN_KEY]
    if len(pids) != 1 or len(tokens) > 1:
        return None
    pid, token = pids[0], tokens[0] if tokens else ""
    if not isinstance(pid, str) or not isinstance(token, str):
        return None
    return pid, token
