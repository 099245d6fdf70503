"""What the tests expect of an error a user sees: one line, with a prefix and the words that name it."""

from __future__ import annotations


def one_line(err: str, prefix: str, *needles: str) -> None:
    """`err` is one line starting with `prefix`, holding every needle, and no traceback."""
    line = err.strip()
    assert line.startswith(prefix) and "\n" not in line, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in line, (needle, line)
