"""A ClientApp mod that names its SuperNode in each training reply, so the server's values carry names."""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import MessageType

NAME_KEY = "fedsv-name"
"""A SuperNode's --node-config key for its name (e.g. --node-config "fedsv-name='hospital-a'")."""

RECORD_KEY = "fedsv"
"""The reply's ConfigRecord the mod adds (FedAvg-like strategies aggregate only arrays and metrics)."""


def fedsv_names(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """`ClientApp(mods=[fedsv_names])`: each training reply gets a ConfigRecord "fedsv" holding the
    node's configured `fedsv-name` (as "participant-id") or else its `partition-id`. FedSVStrategy
    names the client by it; the strategy's aggregation ignores ConfigRecords, and no message is added."""
    reply = call_next(msg, context)
    if msg.metadata.message_type != MessageType.TRAIN or reply.has_error():
        return reply
    name = context.node_config.get(NAME_KEY)
    partition = context.node_config.get("partition-id")
    if isinstance(name, str) and name:
        reply.content[RECORD_KEY] = ConfigRecord({"participant-id": name})
    elif isinstance(partition, int) and not isinstance(partition, bool):
        reply.content[RECORD_KEY] = ConfigRecord({"partition-id": partition})
    return reply
