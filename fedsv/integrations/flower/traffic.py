"""Bytes of Flower messages as they travel (the message and every object it carries), per round."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, Message, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from fedsv.ledger import TrafficRow


def object_bytes(obj: Message | ArrayRecord | RecordDict) -> int:
    """Serialized size of a Flower object as it travels: its whole object tree (a message with its
    records and arrays; an ArrayRecord with its arrays, i.e. one copy of the model)."""
    return sum(len(part.deflate()) for part in get_all_nested_objects(obj).values())


@dataclass
class RoundTraffic:
    """What the strategy saw go down (its instructions) and come up (the replies) in one round."""

    rows: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (rpc, direction) -> [bytes, n]

    def add(self, rpc: str, direction: str, messages: Iterable[Message]) -> None:
        cell = self.rows.setdefault((rpc, direction), [0, 0])
        for message in messages:
            cell[0] += 0 if message.has_error() else object_bytes(message)
            cell[1] += 1

    def ledger_rows(self, number: int) -> list[TrafficRow]:
        return [TrafficRow(number, rpc, d, c[0], c[1]) for (rpc, d), c in sorted(self.rows.items())]
