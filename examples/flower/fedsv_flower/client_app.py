"""The ClientApp: trains the MLP on its SuperNode's shard; fedsv's mod names the node in its replies."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from fedsv.integrations.flower import fedsv_names
from fedsv_flower import task

app = ClientApp(mods=[fedsv_names])  # fedsv: each training reply names its SuperNode (partition-id)


def _received(msg: Message, context: Context) -> tuple[nn.Module, torch.Tensor, torch.Tensor, int]:
    """The global model from the message, and this SuperNode's shard (x, y) and partition id."""
    partition = int(context.node_config["partition-id"])
    partitions = int(context.node_config["num-partitions"])
    net = task.model(str(context.run_config.get("model", "mlp")))
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = task.shard(partition, partitions)
    return net, x, y, partition


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One local epoch from the global arrays; the reply's arrays are the local model (FedAvg's input)."""
    net, x, y, partition = _received(msg, context)
    server_round = int(msg.content["config"]["server-round"])
    loss = task.train(net, x, y, seed=1000 * server_round + partition)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The global model's loss and accuracy on the SuperNode's own shard."""
    net, x, y, _ = _received(msg, context)
    loss, accuracy = task.evaluate(net, x, y)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(y)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
