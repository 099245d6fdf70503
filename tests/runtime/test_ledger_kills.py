"""The ledger under SIGKILL at random moments: a round is never split nor repeated."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from fedsv.ledger import Ledger

REPO = Path(__file__).resolve().parents[2]


WRITER = """
import json, os, sys
sys.path[:0] = [{repo!r}]
from fedsv.ledger import Checkpoint, Ledger
from tests.support.records import CONFIG, make_record, make_rows
with Ledger(sys.argv[1]) as ledger:
    ledger.ensure_run("run-1", CONFIG)
    checkpoint = ledger.last_checkpoint()
    n = checkpoint.round if checkpoint else 0
    print("ready", n, flush=True)
    blob = os.urandom(256 * 1024)  # a model-sized checkpoint keeps every commit busy writing
    while True:
        n += 1
        record = make_record(n)
        values, traffic = make_rows(record)
        ledger.commit_round(record, values, traffic, Checkpoint(n, blob, json.dumps({{"n": n}})))
"""


def test_sigkill_at_random_moments_never_splits_or_repeats_a_round(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    code = WRITER.format(repo=str(REPO))
    rng = random.Random(20240607)
    last = 0
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        assert ready[0] == "ready" and int(ready[1]) == last  # resumes exactly after the last whole round
        time.sleep(rng.uniform(0.0, 0.25))
        assert proc.poll() is None, "the writer died on its own"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        with Ledger(path) as ledger:
            assert ledger.integrity_ok()
            rounds = [r.round for r in ledger.rounds()]
            k = len(rounds)
            assert rounds == list(range(1, k + 1)) and k >= last
            checkpoint = ledger.last_checkpoint()
            assert (checkpoint.round if checkpoint else 0) == k
            if checkpoint is not None:
                assert json.loads(checkpoint.rng_state) == {"n": k}
                assert len(checkpoint.global_params) == 256 * 1024
            assert [(v.round, v.participant) for v in ledger.values()] == [
                (n, p) for n in rounds for p in ("p000", "p001")
            ]
            assert len(ledger.traffic()) == 2 * k
        last = k
    assert last > 0
