"""report.html's markup: every section, self-contained, names escaped (tests/runtime opens it in Chromium)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from fedsv.app.live_page import LivePage, write_page
from fedsv.app.report_page import SECTIONS, render_page
from tests.support.report_pages import made_up_report


def test_every_section_and_member_is_on_a_page_that_fetches_nothing() -> None:
    ids = [f"p{i:03d}" for i in range(5)]
    text = render_page(made_up_report(ids))
    for section in SECTIONS:
        assert f"<section id='{section}'>" in text
    for pid in ids:
        assert f"id='member-{pid}'" in text
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)
    figures = json.loads(re.search(r"const FIGURES = (.*?); const PAYOUT", text, re.S).group(1))  # type: ignore[union-attr]
    assert set(figures) == {"fig-accuracy", "fig-values", "fig-cumulative", "fig-labels"}
    # the first round refused p000 as null, the second held it back in quarantine: the guard's section
    # says so, with what its update would have done
    assert "p000</a>" in text and "(null_update)" in text
    assert "(quarantined: validation loss +0.2500 if aggregated)" in text


def test_untrusted_strings_never_reach_the_page_as_markup() -> None:
    hostile = ["</script><script>alert(1)</script>", "<img src=x onerror=alert(2)>", "a&b\"'<>"]
    text = render_page(made_up_report(hostile))
    for name in hostile:
        assert name not in text
    assert "<script>alert(1)</script>" not in text and "<b>x</b>" not in text and "<i>x</i>" not in text
    assert text.count("<script>") == 3  # Plotly, the data, the page's own


def test_the_page_is_written_whole_and_a_live_page_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    page = write_page(tmp_path, made_up_report(["p000", "p001", "p002"]))
    assert page.name == "report.html" and "fedsv report" in page.read_text()
    assert not list(tmp_path.glob(".report.html.partial"))
    # a page that cannot be written (no run there) is logged, and the thread goes on to the next refresh
    live = LivePage(tmp_path / "no-run-here")
    try:
        with caplog.at_level(logging.WARNING, logger="fedsv.app.live_page"):
            live.refresh()
            assert live.wait_for_writes(1, timeout=120)
            live.refresh()
            assert live.wait_for_writes(2, timeout=120)  # the failure did not end the thread
    finally:
        live.close()
    failures = [r for r in caplog.records if r.message.startswith("could not rewrite")]
    assert len(failures) == 2 and all(r.exc_info for r in failures)
    assert not (tmp_path / "no-run-here" / "report.html").exists()
