"""report.html kept current while a run goes on: rewritten in the background as rounds get their values."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from fedsv.app.report import build_report
from fedsv.app.report_page import render_page

logger = logging.getLogger(__name__)


def write_page(run_dir: str | Path, report: dict[str, object] | None = None) -> Path:
    """Write `run_dir`/report.html (from `report`, or the run's ledger), atomically: a browser that
    reloads it mid-write sees the previous page whole."""
    directory = Path(run_dir)
    page = directory / "report.html"
    partial = directory / ".report.html.partial"
    partial.write_text(render_page(report if report is not None else build_report(directory)))
    partial.replace(page)
    return page


class LivePage:
    """A daemon thread that rewrites a run's report.html each time `refresh` is called (refreshes that
    come while it writes are folded into one), so the page can be opened during the run. A failure is
    logged, never raised: the page is a view, the run goes on."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._attempts = 0  # writes attempted, failed ones included
        self._attempted = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="fedsv-live-page", daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        self._wanted.set()

    def wait_for_writes(self, count: int, timeout: float) -> bool:
        """Wait until `count` writes were attempted (failed ones count): False if `timeout` passed first."""
        with self._attempted:
            return self._attempted.wait_for(lambda: self._attempts >= count, timeout)

    def close(self) -> None:
        """Stop after the write under way, if any (report_files.write_outputs writes the run's final page)."""
        self._stop.set()
        self._wanted.set()
        self._thread.join(timeout=60)

    def _loop(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._stop.is_set():
                return
            try:
                write_page(self.run_dir)
            except Exception:
                logger.warning("could not rewrite %s/report.html", self.run_dir, exc_info=True)
            with self._attempted:
                self._attempts += 1
                self._attempted.notify_all()
