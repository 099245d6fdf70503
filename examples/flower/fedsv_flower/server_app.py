"""The ServerApp: FedAvg wrapped by FedSVStrategy (the two fedsv lines are marked; fedsv=false skips them)."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from fedsv.integrations.flower import FedSVStrategy  # fedsv, line 1
from fedsv.valuation import ValuationSpec
from fedsv_flower import task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    rounds = int(config.get("num-server-rounds", 3))
    name = str(config.get("model", "mlp"))
    fedavg = FedAvg(
        fraction_train=float(config.get("fraction-train", 1.0)),
        fraction_evaluate=0.5,
        min_available_nodes=int(config.get("min-available-nodes", 2)),
    )
    strategy: Strategy = fedavg
    if bool(config.get("fedsv", True)):  # run-config fedsv=false: Flower's FedAvg alone, to compare
        validation = task.splits().validation
        strategy = FedSVStrategy(  # fedsv, line 2: wrap the strategy; everything else stays Flower's
            fedavg,
            task.model(name),
            validation=(validation.x, validation.y),
            valuation=ValuationSpec(method="auto", budget=4096, seed=0),
            ledger=str(config.get("ledger", "runs/flower")),
        )
    # start() returns once every round's values are in the ledger; the wrapper needs no close() after it
    strategy.start(grid=grid, initial_arrays=ArrayRecord(task.model(name).state_dict()), num_rounds=rounds)
