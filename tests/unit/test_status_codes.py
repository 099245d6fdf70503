"""Every reason the coordinator refuses a call for has one gRPC status code, in one table."""

from __future__ import annotations

import ast
from pathlib import Path

import grpc

from fedsv.coordinator import round_board, run_state, sessions
from fedsv.coordinator.status_codes import STATUS_OF_REASON, status_of
from fedsv.wire.codec import WIRE_ERROR_REASONS


def _rejected_reasons() -> set[str]:
    """The first argument of every Rejected(...) the sessions and the round board raise."""
    trees = [ast.parse(Path(str(module.__file__)).read_text()) for module in (sessions, round_board)]
    return {
        str(node.args[0].value)
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Rejected"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def _refused_reasons() -> set[str]:
    """The reason (a string constant) of every `refuse(context, REASON, ...)` in the coordinator."""
    out: set[str] = set()
    for path in Path(run_state.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "refuse"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                out.add(str(node.args[1].value))
    return out


def test_every_reason_raised_has_a_status_code() -> None:
    reasons = _rejected_reasons()
    assert len(reasons) >= 12, reasons  # the scan found the refusals
    refused = _refused_reasons()
    assert {"no_credential", "header_timeout", "sender_mismatch"} <= refused, refused
    missing = (reasons | refused | set(WIRE_ERROR_REASONS) | {"malformed"}) - set(STATUS_OF_REASON)
    assert not missing


def test_codes_say_what_went_wrong() -> None:
    assert status_of("bad_token") == grpc.StatusCode.UNAUTHENTICATED
    assert status_of("wrong_identity") == grpc.StatusCode.PERMISSION_DENIED
    assert status_of("too_many_streams") == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_of("too_many_participants") == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_of("no_credential") == grpc.StatusCode.UNAUTHENTICATED
    assert status_of("header_timeout") == grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_of("checksum_mismatch") == grpc.StatusCode.DATA_LOSS
    assert status_of("duplicate") == grpc.StatusCode.ALREADY_EXISTS
    # Nothing a participant does is answered as a server fault.
    assert not {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN} & set(STATUS_OF_REASON.values())
