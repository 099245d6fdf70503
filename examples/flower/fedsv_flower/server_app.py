"""The ServerApp: FedAvg, wrapped by FedSVStrategy (the two fedsv lines are marked)."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fedsv.integrations.flower import FedSVStrategy  # fedsv, line 1
from fedsv.valuation import ValuationSpec
from fedsv_flower import task

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rounds = int(context.run_config.get("num-server-rounds", 3))
    fraction = float(context.run_config.get("fraction-train", 1.0))
    validation = task.splits().validation
    fedavg = FedAvg(fraction_train=fraction, fraction_evaluate=0.5, min_available_nodes=2)
    strategy = FedSVStrategy(  # fedsv, line 2: wrap the strategy; everything else stays Flower's
        fedavg,
        task.model(),
        validation=(validation.x, validation.y),
        valuation=ValuationSpec(method="auto", budget=4096, seed=0),
        ledger=str(context.run_config.get("ledger", "runs/flower")),
    )
    strategy.start(grid=grid, initial_arrays=ArrayRecord(task.model().state_dict()), num_rounds=rounds)
    strategy.close()
