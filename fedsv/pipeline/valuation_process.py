"""The valuation process: values committed rounds from their inputs on disk, at the lowest CPU priority.

It is a child of the coordinator (multiprocessing, spawned): its own interpreter, its own torch thread
count, every thread at SCHED_IDLE (or nice 19 where that policy is missing), in a session of its own
whose autogroup has nice 19, so valuation runs only on CPU time nothing else wants and never slows the
rounds' training on a shared host. It dies with the
coordinator (PR_SET_PDEATHSIG on Linux; elsewhere at the end of its pipe). It writes nothing but the
round's plan beside the round's inputs; the coordinator commits what it sends back. Between rounds it
also completes the values of the rounds so far (completion.py) when the coordinator asks.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from fedsv.fl.evaluation import EvalSet
from fedsv.pipeline.pending import PendingStore
from fedsv.valuation import FederatedValuation, Plan, RoundValues, ValuationSpec
from fedsv.valuation.accounting.completion import Completed, RoundMatrix
from fedsv.valuation.accounting.round_matrices import RoundMatrices
from fedsv.valuation.errors.valuation_noise import Uncertainty, uncertainty
from fedsv.valuation.round_valuation import GameSettings, value_updates

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


class ValuationSetup(Protocol):
    """How the valuation process gets the model it values with and the validation set."""

    def load(self) -> tuple[nn.Module, EvalSet]: ...


@dataclass(frozen=True)
class GivenSetup:
    """A model and validation set handed over as they are (they must pickle: built-in models do)."""

    model: nn.Module
    validation: EvalSet

    def load(self) -> tuple[nn.Module, EvalSet]:
        return self.model, self.validation


@dataclass(frozen=True)
class Job:
    """Value round `round` with `spec`; keep the plan beside its inputs unless it replays a kept one."""

    round: int
    spec: ValuationSpec | None
    keep_plan: bool


@dataclass(frozen=True)
class Done:
    round: int
    values: RoundValues


@dataclass(frozen=True)
class Failed:
    round: int
    error: str


@dataclass(frozen=True)
class Complete:
    """Complete the values of the rounds so far, and take every total's error against a rerun."""

    matrices: RoundMatrices


@dataclass(frozen=True)
class CompletedReply:
    matrix: RoundMatrix
    completed: Completed
    errors: Uncertainty
    seconds: float


@dataclass(frozen=True)
class Settings:
    """What the process starts with: where the inputs are, how the games compute, its threads and logs."""

    setup: ValuationSetup
    store: str
    game: GameSettings
    threads: int
    log_level: int = logging.WARNING


AUTOGROUP = Path("/proc/self/autogroup")


def own_autogroup() -> bool:
    """Leave the parent's session for one of its own whose autogroup has nice 19; False where that is
    not possible (no autogroup scheduling, or no permission).

    Linux's autogroup scheduling shares the CPU between sessions before it looks at a task's policy: a
    SCHED_IDLE process in a session of its own still gets that session's fair share, a whole core
    against two busy processes elsewhere (flwr starts a ServerApp, and so its valuation process, in a
    session of its own). An autogroup at nice 19 weighs 15 against another's 1024. The new session
    holds this process alone, so the parent's own priority is left as it was."""
    if not AUTOGROUP.exists():
        return False
    try:
        os.setsid()
        AUTOGROUP.write_text("19")
    except OSError:
        return False
    return True


def lower_priority() -> str:
    """Put this process (and every thread it starts later) at the lowest CPU priority; says which."""
    grouped = " in an autogroup of its own at nice 19" if own_autogroup() else ""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE" + grouped
        except OSError:
            pass
    try:
        os.nice(19 - os.nice(0))
        return "nice 19" + grouped
    except OSError:
        return "unchanged" + grouped


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def serve(conn: Connection, settings: Settings) -> None:
    """The process's main loop: a Job in, a Done or Failed out (a Complete in, a CompletedReply or
    Failed out), until None or the pipe closes."""
    die_with_parent()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    priority = lower_priority()
    torch.set_num_threads(settings.threads)
    model, validation = settings.setup.load()
    store = PendingStore(settings.store)
    logger.info("valuation process %d: %s, %d torch threads", os.getpid(), priority, settings.threads)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        if isinstance(job, Complete):
            conn.send(_complete(job.matrices))
        else:
            conn.send(_value(job, model, validation, store, settings.game))


def _complete(matrices: RoundMatrices) -> CompletedReply | Failed:
    started = time.perf_counter()
    matrix = matrices.completion_matrix()
    try:
        completed = matrix.complete()
        errors = uncertainty(matrices, completed.chosen, completed.totals)
    except Exception as exc:  # reported; the coordinator carries on without live completed values
        logger.exception("completing %d rounds failed", matrices.rounds)
        return Failed(matrices.rounds, f"{type(exc).__name__}: {exc}")
    return CompletedReply(matrix, completed, errors, time.perf_counter() - started)


def _value(
    job: Job, model: nn.Module, validation: EvalSet, store: PendingStore, game: GameSettings
) -> Done | Failed:
    try:
        pending = store.load(job.round)

        def keep(plan: Plan) -> None:
            store.save_plan(job.round, plan)

        values = value_updates(
            model,
            pending.params,
            pending.updates,
            validation,
            job.round,
            job.spec,
            FederatedValuation(),
            game,
            on_plan=keep if job.keep_plan else None,
        )
    except Exception as exc:  # reported to the coordinator, which stops valuing and keeps the round pending
        logger.exception("valuation of round %d failed", job.round)
        return Failed(job.round, f"{type(exc).__name__}: {exc}")
    return Done(job.round, values)
