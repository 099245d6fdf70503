"""A round's valuation inputs kept on disk (w_t and its updates) until its values are in the ledger."""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from fedsv.fl.updates import ClientUpdate
from fedsv.valuation.estimators.api import Plan


@dataclass(frozen=True)
class PendingRound:
    """What valuing round `round` needs: the global state it started from and the updates it aggregated."""

    round: int
    params: dict[str, Tensor]
    updates: list[ClientUpdate]


class PendingStore:
    """One file per round awaiting valuation in `directory`, written durably before the round's commit.

    A coordinator killed while a round waits for its values finds the file on restart and values the
    round again, from the same inputs and seed, so the values come out the same.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, number: int) -> Path:
        return self.directory / f"round-{number:06d}.pt"

    def plan_path(self, number: int) -> Path:
        return self.directory / f"round-{number:06d}.plan.json"

    def save_plan(self, number: int, plan: Plan) -> None:
        """Keep the round's valuation plan (its method and evaluation budget, which a time budget makes
        depend on the machine) so that valuing the round again after a restart gives the same values."""
        self._write(self.plan_path(number), json.dumps(plan.to_dict()).encode())

    def load_plan(self, number: int) -> Plan | None:
        """The plan save_plan kept for round `number`, or None (none kept, or unreadable: plan anew)."""
        try:
            return Plan.from_dict(json.loads(self.plan_path(number).read_text()))
        except (OSError, ValueError, AttributeError):
            return None

    def _write(self, target: Path, data: bytes) -> None:
        """Write atomically and fsync (file and folder)."""
        tmp = target.with_suffix(".tmp")
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(target)
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def save(self, pending: PendingRound) -> None:
        """Write atomically and fsync (file and folder): on disk before the ledger says "pending"."""
        blob = {
            "round": pending.round,
            "params": pending.params,
            "updates": [
                {
                    "participant": u.participant,
                    "delta": dict(u.delta),
                    "num_samples": u.num_samples,
                    "public": u.public,
                }
                for u in pending.updates
            ],
        }
        buffer = io.BytesIO()
        torch.save(blob, buffer)
        self._write(self.path(pending.round), buffer.getvalue())

    def load(self, number: int) -> PendingRound:
        """The inputs of round `number`; ValueError when the file is missing or not of that round."""
        path = self.path(number)
        try:
            blob = torch.load(path, weights_only=True)
        except FileNotFoundError as exc:
            raise ValueError(f"round {number} awaits valuation but {path} is missing") from exc
        except Exception as exc:  # a torn or foreign file: unpickling errors of many kinds
            raise ValueError(f"{path}: cannot read the round's valuation inputs: {exc}") from exc
        if not isinstance(blob, dict) or blob.get("round") != number:
            raise ValueError(f"{path} does not hold the valuation inputs of round {number}")
        updates = [
            ClientUpdate(u["participant"], u["delta"], int(u["num_samples"]), bool(u.get("public", False)))
            for u in blob["updates"]
        ]
        return PendingRound(number, blob["params"], updates)

    def size(self, number: int) -> int:
        """Bytes of round `number`'s inputs on disk (0 when there are none)."""
        try:
            return self.path(number).stat().st_size
        except FileNotFoundError:
            return 0

    def remove(self, number: int) -> None:
        self.path(number).unlink(missing_ok=True)
        self.plan_path(number).unlink(missing_ok=True)

    def tidy(self) -> None:
        """Remove the directory if it holds nothing (every round valued): a finished run leaves none."""
        with contextlib.suppress(OSError):  # not empty (rounds still pending), or already gone
            self.directory.rmdir()

    def prune(self, keep: set[int]) -> None:
        """Delete the files of rounds not in `keep` (rounds valued already, or never committed)."""
        for path in [*self.directory.glob("round-*.pt"), *self.directory.glob("round-*.plan.json")]:
            number = int(path.name.split("-")[1].split(".")[0])
            if number not in keep:
                path.unlink(missing_ok=True)
