"""Faults survived, real processes and sockets: killed, stalled, cut-off participants; killed coordinators."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fedsv.fl.selection import balanced_schedule
from fedsv.fl.state import params_of
from fedsv.ledger import Ledger
from fedsv.task.models import build_model
from fedsv.wire.codec import encode_tensor_set
from tests.support.netns import ip, make_hosts
from tests.support.processes import wait_for
from tests.support.runtime import (
    FAULT_RUN,
    all_valued,
    check_ledger,
    coordinator_argv,
    fault_client_argv,
    ledger_digest,
    rounds_in,
    sample,
    scrape,
    spawn,
    start_coordinator,
    start_participants,
    stop,
    tail,
)

pytestmark = pytest.mark.slow

PIDS = ["p000", "p001", "p002", "p003"]


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _delta_chunks(chunk_bytes: int) -> int:
    """Chunks of one FAULT_RUN delta (the MLP on 28x28 images) at `chunk_bytes`."""
    header, _ = encode_tensor_set(params_of(build_model("mlp", (1, 28, 28), 10)), chunk_bytes=chunk_bytes)
    return int(header.num_chunks)


def _submit_messages(metrics_port: int) -> float:
    return sample(scrape(metrics_port), "fedsv_rpc_messages_total", rpc="SubmitUpdate", direction="up")


def test_participant_killed_mid_upload_is_a_straggler_of_a_quorum_round(tmp_path: Path) -> None:
    """A real client sends its header and 3 chunks, then stalls; SIGKILLed, its partial delta is dropped."""
    chunk, sent_chunks, deadline = 64 << 10, 3, 15
    state = tmp_path / "state"
    settings = {**FAULT_RUN, "fraction": 1.0, "rounds": 1, "round_timeout": deadline, "quorum": 0.5}
    coordinator, port, metrics_port = start_coordinator(state, {**settings, "max_chunk_bytes": chunk})
    ready, victim_log = tmp_path / "stalled", tmp_path / "victim.log"
    honest = victim = None
    per_update = 1 + _delta_chunks(chunk)
    assert per_update > sent_chunks + 2, "the delta must span more chunks than the victim sends"
    expected = 3 * per_update + 1 + sent_chunks  # the honest updates, the victim's header and 3 chunks
    try:
        honest = start_participants(f"127.0.0.1:{port}", "0-2", 4, tmp_path / "honest.log")
        victim = spawn(fault_client_argv(f"127.0.0.1:{port}", 3, 4, sent_chunks, ready), victim_log)
        wait_for(lambda: ready.exists() or victim.poll() is not None, 120, "the victim to stall mid-upload")
        assert victim.poll() is None, tail(victim_log)
        wait_for(lambda: _submit_messages(metrics_port) >= expected, 60, "the updates to arrive")
        assert rounds_in(state) == [], "the round must still wait for the victim"
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        assert coordinator.wait(timeout=600) == 0, tail(state / "coordinator.log")
        assert honest.wait(timeout=600) == 0, tail(tmp_path / "honest.log")
    finally:
        stop(coordinator, honest, victim)
    assert check_ledger(state) == [1]
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        (record,) = ledger.rounds()
        traffic = {(t.rpc, t.direction): t.messages for t in ledger.traffic()}
        values = {v.participant for v in ledger.values()}
    assert record.selected == PIDS
    assert record.received == PIDS[:3] and record.stragglers == ["p003"] and values == set(PIDS[:3])
    assert record.round_seconds >= deadline, "closed at the deadline, by quorum"
    # The victim's header and chunks arrived (and were counted) but no delta of it was accepted.
    assert traffic[("SubmitUpdate", "up")] == expected
    assert "delta sent" not in _text(victim_log)


def test_slow_participant_misses_the_deadline_and_its_late_delta_is_rejected(tmp_path: Path) -> None:
    """SIGSTOP one participant (stream open) until its round closed by quorum; SIGCONT: its delta is late."""
    deadline = 8
    state = tmp_path / "state"
    log = state / "coordinator.log"
    settings = {**FAULT_RUN, "fraction": 1.0, "rounds": 2, "round_timeout": deadline, "quorum": 0.5}
    coordinator, port, metrics_port = start_coordinator(state, {**settings, "linger": 120})
    slow_log, honest_log = tmp_path / "slow.log", tmp_path / "honest.log"
    slow = honest = None
    try:
        slow = start_participants(f"127.0.0.1:{port}", "3", 4, slow_log)
        wait_for(
            lambda: sample(scrape(metrics_port), "fedsv_participants_connected") == 1, 120, "rank 3 to listen"
        )
        slow.send_signal(signal.SIGSTOP)  # its task stream stays open: the round opens with it selected
        stopped = time.time()
        honest = start_participants(f"127.0.0.1:{port}", "0-2", 4, honest_log)
        wait_for(lambda: rounds_in(state) == [1], 120, "round 1 to close without rank 3")
        slow.send_signal(signal.SIGCONT)
        # well under the 20 s + 10 s after which keepalive would drop the stopped participant's connection
        assert time.time() - stopped < 25, "rank 3 was stopped too long for this test to mean anything"
        wait_for(lambda: rounds_in(state) == [1, 2], 120, "round 2")
        wait_for(lambda: "round 1 update rejected" in _text(slow_log), 60, "rank 3 to hear its delta is late")
        wait_for(lambda: all_valued(state), 240, "the rounds' values (valuation lags the rounds)")
        samples = scrape(metrics_port)
        coordinator.send_signal(signal.SIGTERM)  # it lingers serving metrics; the run itself finished
        assert coordinator.wait(timeout=600) == 0, tail(log)
        assert honest.wait(timeout=600) == 0 and slow.wait(timeout=600) == 0, tail(slow_log)
    finally:
        if slow is not None and slow.poll() is None:
            slow.send_signal(signal.SIGCONT)
        stop(coordinator, honest, slow)
    late = sum(
        sample(samples, "fedsv_updates_rejected_total", reason=why) for why in ("round_closed", "wrong_round")
    )
    assert late >= 1, "the late delta was not counted as rejected"
    assert "round 1 update rejected: StatusCode.FAILED_PRECONDITION" in _text(slow_log)
    assert check_ledger(state) == [1, 2]
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        first, second = ledger.rounds()
    assert first.selected == PIDS and first.received == PIDS[:3] and first.stragglers == ["p003"]
    assert deadline <= first.round_seconds < deadline + 30, "closed at the deadline, by quorum"
    assert second.received == PIDS, "rank 3 took part again once it ran"


def test_coordinator_killed_mid_round_resumes_and_matches_an_uninterrupted_run(
    reference_run: dict[str, list[tuple[Any, ...]]], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    log = state / "coordinator.log"
    coordinator, port, _ = start_coordinator(state, {**FAULT_RUN, "metrics_port": -1})
    logs = [tmp_path / "participants-0.log", tmp_path / "participants-1.log"]
    workers = [
        start_participants(f"127.0.0.1:{port}", ranks, 4, path)
        for ranks, path in zip(("0-1", "2-3"), logs, strict=True)
    ]
    try:
        wait_for(lambda: "round 2: selected" in _text(log), 120, "round 2 to open")
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=30)
        assert rounds_in(state) == [1], "the coordinator must die while round 2 is open"
        coordinator, _, _ = start_coordinator(state, {**FAULT_RUN, "metrics_port": -1}, port)
        assert coordinator.wait(timeout=240) == 0, tail(log)
        for worker, path in zip(workers, logs, strict=True):
            assert worker.wait(timeout=600) == 0, tail(path)
    finally:
        stop(coordinator, *workers)
    assert check_ledger(state) == [1, 2, 3, 4]
    assert "resumed after round 1" in _text(log)
    assert all("reconnecting in" in _text(path) for path in logs), "the participants reconnected"
    resumed = ledger_digest(state)
    # Training is seeded per (seed, round, rank) and the selection RNG is checkpointed: exactly equal.
    assert resumed["rounds"] == reference_run["rounds"]
    assert resumed["values"] == reference_run["values"]


def test_inline_valuation_records_the_same_run_as_pipelined(
    reference_run: dict[str, list[tuple[Any, ...]]], tmp_path: Path
) -> None:
    """The reference run values in the background (the default); valuing inline changes no value."""
    state = tmp_path / "state"
    settings = {**FAULT_RUN, "metrics_port": -1, "valuation_schedule": "inline"}
    coordinator, port, _ = start_coordinator(state, settings)
    workers = [start_participants(f"127.0.0.1:{port}", r, 4, tmp_path / f"{r}.log") for r in ("0-1", "2-3")]
    try:
        assert coordinator.wait(timeout=240) == 0, tail(state / "coordinator.log")
    finally:
        stop(coordinator, *workers)
    assert check_ledger(state) == [1, 2, 3, 4]
    inline = ledger_digest(state)
    assert inline["rounds"] == reference_run["rounds"] and inline["values"] == reference_run["values"]
    assert not (state / "pending").exists() or not list((state / "pending").iterdir())


def test_network_cut_participants_reconnect_and_no_round_hangs(tmp_path: Path) -> None:
    """Host B's link goes down for CUT s while round 2 runs: rounds close by quorum, then B rejoins."""
    deadline, cut_seconds = 6, 14
    state = tmp_path / "state"
    log = state / "coordinator.log"
    settings = {
        **FAULT_RUN,
        "fraction": 1.0,
        "rounds": 6,
        "round_timeout": deadline,
        "quorum": 0.5,
        "quorum_wait": 30,
    }
    procs: list[subprocess.Popen[bytes]] = []
    with make_hosts(("hostb", "hostc")) as hosts:
        cut, kept = hosts.links
        try:
            server = {**settings, "host": "0.0.0.0", "metrics_port": -1}
            coordinator, port, _ = start_coordinator(state, server, netns=hosts.coordinator)
            procs.append(coordinator)
            for link, ranks in ((cut, "0-1"), (kept, "2-3")):
                target = f"{link.coordinator_ip}:{port}"
                procs.append(start_participants(target, ranks, 4, tmp_path / f"{ranks}.log", netns=link.host))
            wait_for(lambda: "round 2: selected" in _text(log), 120, "round 2 to open")
            ip("-n", cut.host, "link", "set", cut.host_dev, "down")
            time.sleep(cut_seconds)
            ip("-n", cut.host, "link", "set", cut.host_dev, "up")
            restored = time.time()
            assert coordinator.wait(timeout=240) == 0, tail(log)
            for proc, name in zip(procs[1:], ("0-1", "2-3"), strict=True):
                assert proc.wait(timeout=600) == 0, tail(tmp_path / f"{name}.log")
        finally:
            stop(*procs)
    assert check_ledger(state) == [1, 2, 3, 4, 5, 6]
    with Ledger(state / "ledger.sqlite", read_only=True) as ledger:
        rounds = ledger.rounds()
    assert rounds[0].received == PIDS
    # Host B may deliver a round-2 update in the moment between the round opening and the cut; from
    # then on the rounds during the cut close by quorum with host C's participants alone.
    assert set(rounds[1].received) >= {"p002", "p003"}, rounds[1]
    during = [r for r in rounds if r.round >= 2 and r.started_at < restored]
    assert any(r.received == ["p002", "p003"] and r.stragglers == ["p000", "p001"] for r in during), [
        (r.round, r.received, r.stragglers) for r in rounds
    ]
    # No round waited past its deadline (plus the time to value and record it): none hung.
    assert all(r.train_wait_seconds < deadline + 5 for r in rounds), [r.train_wait_seconds for r in rounds]
    text = _text(log)
    assert text.count("rank 0 joined") >= 2 and text.count("rank 1 joined") >= 2, "host B rejoined"
    after = [r for r in rounds if r.started_at > restored]
    assert any(r.received == PIDS for r in after), [(r.round, r.received) for r in rounds]


KILL_KINDS = ("random", "round_start", "commit", "startup")


def _wal_state(state: Path) -> tuple[int, int]:
    try:
        st = os.stat(state / "ledger.sqlite-wal")
    except FileNotFoundError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def _wait_log(state: Path, log_offset: int, needle: str, count: int, until: float) -> None:
    """Wait until the coordinator's log past `log_offset` holds `needle` `count` times (or `until`)."""
    while time.time() < until and _text(state / "coordinator.log")[log_offset:].count(needle) < count:
        time.sleep(0.005)


def _kill_moment(kind: str, state: Path, log_offset: int, rng: random.Random) -> str:
    """Wait for the moment of a kill of `kind` (at most 30 s); returns the log's last line by then."""
    until = time.time() + 30
    if kind == "random":  # at a random moment, but within the round in progress (rounds may be fast)
        _wait_log(state, log_offset, " done: ", 1, time.time() + rng.uniform(0.0, 5.0))
    elif kind == "round_start":  # as the next round opens, right after a round was committed
        _wait_log(state, log_offset, " done: ", 1, until)
        time.sleep(rng.uniform(0.0, 0.1))
    elif kind == "commit":  # while the ledger's WAL is written (inside commit_round), 0-2 commits on
        _wait_log(state, log_offset, " done: ", rng.randint(0, 2), until)
        before = _wal_state(state)
        while time.time() < until and _wal_state(state) == before:
            time.sleep(0.0005)
    lines = _text(state / "coordinator.log")[log_offset:].strip().splitlines()
    return lines[-1][24:100] if lines else ""


def test_ledger_survives_kills_at_many_points(
    reference_run: dict[str, list[tuple[Any, ...]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL the coordinator 8 times (starting up, at random, as a round opens, while committing)."""
    rng = random.Random(6)
    # Each kill lets at most 3 rounds through (a "commit" kill waits for up to 2, then hits the third's
    # commit), so 8 kills fit in 12 rounds however fast the rounds run.
    # A restarted coordinator may take a minute to serve on a loaded machine (imports, resume): the
    # participants wait for it far longer than that, so none gives up between a kill and its restart.
    rounds, give_up_after = 12, 600
    settings = {**FAULT_RUN, "rounds": rounds, "metrics_port": -1}
    state = tmp_path / "state"
    log = state / "coordinator.log"
    coordinator, port, _ = start_coordinator(state, settings)
    logs = [tmp_path / "participants-0.log", tmp_path / "participants-1.log"]
    workers = [
        start_participants(f"127.0.0.1:{port}", ranks, 4, path, "--give-up-after", str(give_up_after))
        for ranks, path in zip(("0-1", "2-3"), logs, strict=True)
    ]
    started = time.time()
    kills: list[tuple[str, str, str, list[int]]] = []
    committed: list[int] = []
    try:
        for i, kind in enumerate(KILL_KINDS * 2):
            offset = len(_text(log))
            if i > 0 and kind == "startup":  # at random while starting: imports, ledger, resume, serving
                coordinator = spawn(coordinator_argv(state, settings, port), log)
                time.sleep(rng.uniform(0.5, 4.0))
            elif i > 0:
                coordinator, _, _ = start_coordinator(state, settings, port)
            moment = time.time()
            last = "" if kind == "startup" else _kill_moment(kind, state, offset, rng)
            if coordinator.poll() is not None:
                break  # the run finished
            coordinator.send_signal(signal.SIGKILL)
            coordinator.wait(timeout=30)
            now = check_ledger(state) if (state / "ledger.sqlite").exists() else []
            assert now[: len(committed)] == committed, "a committed round was lost"
            committed = now
            kills.append((kind, f"{time.time() - moment:5.2f}", last, now))
            gone = [path for worker, path in zip(workers, logs, strict=True) if worker.poll() is not None]
            assert not gone, f"participants gave up: {tail(gone[0])}"
        coordinator, _, _ = start_coordinator(state, settings, port)
        outage_span = time.time() - started
        # Wait while the run makes progress (a round committed resets the clock), not a fixed time.
        done, progress_at = len(rounds_in(state)), time.time()
        while coordinator.poll() is None:
            if len(rounds_in(state)) > done:
                done, progress_at = len(rounds_in(state)), time.time()
            assert time.time() - progress_at < 300, f"no round committed for 300 s: {tail(log)}"
            time.sleep(0.5)
        assert coordinator.returncode == 0, tail(log)
        for worker, path in zip(workers, logs, strict=True):
            assert worker.wait(timeout=600) == 0, tail(path)
    finally:
        stop(coordinator, *workers)
    with capsys.disabled():
        print(
            f"\n{len(kills)} kills over {outage_span:.0f} s: kind, wait, last log line, rounds in the ledger"
        )
        for kind, wait, last, now in kills:
            print(f"  {kind:<12} {wait}s  {last:<76} {now}")
    assert len(kills) == 8, kills
    assert check_ledger(state) == list(range(1, rounds + 1))
    # Rounds 1-4 are those of the 4-round reference run: every kill and resume changed nothing.
    digest = ledger_digest(state)
    assert digest["rounds"][:4] == reference_run["rounds"]
    assert [v for v in digest["values"] if v[0] <= 4] == reference_run["values"]
    assert not math.isnan(sum(v[2] for v in digest["values"]))
    # Balanced selection across 8 kills and restarts: the seed's schedule, 12 x 3 / 4 = 9 rounds each.
    selected = [list(r[1]) for r in digest["rounds"]]
    schedule = balanced_schedule(int(str(FAULT_RUN["seed"])), 4, 3, rounds)
    assert selected == [[PIDS[r] for r in ranks] for ranks in schedule]
    assert [sum(pid in s for s in selected) for pid in PIDS] == [9, 9, 9, 9]
