"""Every reason the coordinator refuses a call for has one gRPC status code, in one table."""

from __future__ import annotations

import ast
from pathlib import Path

import grpc
import pytest

from fedsv.coordinator import run_state
from fedsv.coordinator.refusals import Refusal
from fedsv.coordinator.status_codes import STATUS_OF_REASON, status_of
from fedsv.wire.codec import WIRE_ERROR_REASONS


def _reason_arguments() -> list[ast.expr]:
    """The reason argument of every Rejected(...), `refuse(context, REASON, ...)` and module-level
    `refuse(context, metrics, log, REASON, ...)` in the coordinator."""
    out: list[ast.expr] = []
    for path in Path(run_state.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            position = {"Rejected": 0, "refuse": 1 if isinstance(node.func, ast.Attribute) else 3}.get(name)
            if position is not None and len(node.args) > position:
                out.append(node.args[position])
    return out


def test_every_refusal_has_a_status_code_and_every_reason_raised_is_a_refusal() -> None:
    assert set(STATUS_OF_REASON) == set(Refusal)  # one code per reason, no code for a stray string
    assert set(WIRE_ERROR_REASONS) <= set(Refusal)  # the codec's reasons, by value
    arguments = _reason_arguments()
    assert len(arguments) >= 20, len(arguments)  # the scan found the refusals
    literals = [ast.unparse(a) for a in arguments if isinstance(a, ast.Constant)]
    assert not literals, f"refusal reasons written as strings, not Refusal members: {literals}"
    named = {a.attr for a in arguments if isinstance(a, ast.Attribute) and ast.unparse(a.value) == "Refusal"}
    assert {"NO_CREDENTIAL", "HEADER_TIMEOUT", "SENDER_MISMATCH", "MALFORMED", "REQUEST_TIMEOUT"} <= named
    assert named <= {member.name for member in Refusal}
    for reason in Refusal:
        assert isinstance(status_of(reason), grpc.StatusCode) and status_of(str(reason)) is status_of(reason)
    with pytest.raises(ValueError):
        status_of("no_such_reason")


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
