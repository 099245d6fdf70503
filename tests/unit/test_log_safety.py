"""Network strings in logs are escaped and cut short; repeated refusals are summarised, not repeated."""

from __future__ import annotations

import logging

import pytest

from fedsv.security.log_safety import MAX_SHOWN, RateLimitedLog, shown


def test_shown_escapes_control_bytes_and_cuts_long_strings() -> None:
    assert shown("p001") == "p001"
    assert shown("a\nb\x1b[31m\x00") == "a\\nb\\x1b[31m\\x00"
    line = shown("x" * 2_100_000)
    assert len(line) < MAX_SHOWN + 30 and line.endswith("...(+2099800 chars)")
    assert "\n" not in shown("\n" * 10_000)


def test_rate_limited_log_holds_back_a_flood_and_says_how_much(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("fedsv.test"), burst=3, window=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="fedsv.test"):
        for i in range(1000):
            log.log(logging.INFO, "too_many_streams", "rejected %d", i)
        log.log(logging.INFO, "bad_header", "other reason")  # its own allowance
        now[0] = 61.0
        log.log(logging.INFO, "too_many_streams", "rejected again")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "rejected 0",
        "rejected 1",
        "rejected 2",
        "other reason",
        "997 more 'too_many_streams' lines held back in the last 61 s",
        "rejected again",
    ]
