"""The ClientApp: trains the MLP on its SuperNode's shard and reports its example count and partition."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsv_flower import task

app = ClientApp()


def _partition(context: Context) -> tuple[int, int]:
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One local epoch from the global arrays; the reply's arrays are the local model (FedAvg's input)."""
    partition, partitions = _partition(context)
    net = task.model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = task.shard(partition, partitions)
    server_round = int(msg.content["config"]["server-round"])
    loss = task.train(net, x, y, seed=1000 * server_round + partition)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y), "partition-id": partition})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The global model's loss and accuracy on the SuperNode's own shard."""
    partition, partitions = _partition(context)
    net = task.model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = task.shard(partition, partitions)
    loss, accuracy = task.evaluate(net, x, y)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(y)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
