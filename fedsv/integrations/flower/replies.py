"""One Flower training round as fedsv's round game needs it: who replied, their deltas and counts."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from torch import Tensor

from fedsv.fl.ranks import participant_id

logger = logging.getLogger(__name__)

ID_KEYS = ("participant-id", "partition-id")
"""Reply metrics (or config) keys that name a client, first found wins; else its Flower node id."""

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")
"""A name a reply may give itself (what the ledger and `fedsv report` show); anything else is ignored."""

NameOf = Callable[[Message], "str | None"]
"""The server's own naming of a reply (FedSVStrategy's name_of=): a name, or None for the default."""


@dataclass(frozen=True)
class FlowerRound:
    """A round's replies that FedAvg aggregates, in reply order, and the global arrays they started from."""

    round: int
    participants: list[str]
    node_ids: list[int]
    deltas: list[dict[str, Tensor]]
    num_samples: list[int]
    global_params: dict[str, Tensor]
    failed: list[int]  # node ids whose reply was an error (not aggregated)


def state_of(arrays: ArrayRecord, names: Sequence[str]) -> dict[str, Tensor]:
    """The named tensors of an ArrayRecord (a copy, float64 kept as is)."""
    missing = [n for n in names if n not in arrays]
    if missing:
        raise ValueError(f"the ArrayRecord lacks the model's tensors {missing[:5]}")
    return {n: torch.from_numpy(arrays[n].numpy().copy()) for n in names}


def client_id(message: Message, name_of: NameOf | None = None) -> str:
    """name_of(message) when given and not None; else `participant-id` (a NAME) or `partition-id` (an
    integer >= 0, as p<id>) from the reply's metrics or config records; else `node-<node id>`."""
    if name_of is not None:
        name = name_of(message)
        if name is not None:
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise ValueError(f"name_of returned {name!r}; a name is 1-64 of A-Z a-z 0-9 . _ : @ -")
            return name
    records: list[MetricRecord | ConfigRecord] = [
        *message.content.metric_records.values(),
        *message.content.config_records.values(),
    ]
    for key in ID_KEYS:
        for record in records:
            value = record.get(key)
            if isinstance(value, str) and NAME.fullmatch(value):
                return value
            if isinstance(value, int | float) and float(value).is_integer() and value >= 0:
                return participant_id(int(value))
    return f"node-{message.metadata.src_node_id}"


def _single(records: Mapping[str, object], what: str, node: int) -> object:
    if len(records) != 1:
        raise ValueError(f"the reply of node {node} holds {len(records)} {what}s; FedAvg expects one")
    return next(iter(records.values()))


def read_round(
    server_round: int,
    global_arrays: ArrayRecord,
    replies: Iterable[Message],
    names: Sequence[str],
    weighted_by_key: str,
    name_of: NameOf | None = None,
) -> FlowerRound:
    """Deltas (reply arrays - global arrays) and example counts of the replies FedAvg aggregates.

    ValueError for a reply that cannot be valued (not one ArrayRecord and one MetricRecord, a missing
    or misshapen tensor, a count that is not an integer >= 1). A name claimed by several replies is
    given to none of them: each becomes <name>@node-<node id>."""
    global_params = state_of(global_arrays, names)
    ids: list[str] = []
    nodes: list[int] = []
    deltas: list[dict[str, Tensor]] = []
    counts: list[int] = []
    failed: list[int] = []
    for message in replies:
        node = int(message.metadata.src_node_id)
        if message.has_error():
            failed.append(node)
            continue
        content = message.content
        arrays = _single(content.array_records, "ArrayRecord", node)
        metrics = _single(content.metric_records, "MetricRecord", node)
        assert isinstance(arrays, ArrayRecord) and isinstance(metrics, MetricRecord)
        count = metrics.get(weighted_by_key)
        if not isinstance(count, int | float) or not count > 0 or not float(count).is_integer():
            raise ValueError(f"node {node} reported {weighted_by_key}={count!r}; FedSV needs a count >= 1")
        local = state_of(arrays, names)
        wrong = [n for n in names if local[n].shape != global_params[n].shape]
        if wrong:
            raise ValueError(f"node {node} replied {wrong[0]} of shape {tuple(local[wrong[0]].shape)}")
        deltas.append({n: local[n] - global_params[n] for n in names})
        counts.append(int(count))
        nodes.append(node)
        ids.append(client_id(message, name_of))
    claimed = {p for p, n in Counter(ids).items() if n > 1}
    if claimed:  # names are the clients' own claims: none may take another's value
        logger.warning("round %d: several replies claim the name(s) %s", server_round, sorted(claimed))
        ids = [f"{pid}@node-{node}" if pid in claimed else pid for pid, node in zip(ids, nodes, strict=True)]
    return FlowerRound(server_round, ids, nodes, deltas, counts, global_params, failed)
