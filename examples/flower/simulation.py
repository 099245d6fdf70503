"""The same app on Flower's simulation engine (Ray): `pip install "flwr[simulation]"`, then
`python examples/flower/simulation.py [--nodes 4]` from the repository root. The ledger goes to
runs/flower/<run id>/ under the working directory; `fedsv report runs/flower` shows the latest run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fedsv_flower.client_app import app as client_app
from fedsv_flower.server_app import app as server_app
from flwr.simulation import run_simulation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, help="SuperNodes (one partition each)")
    args = parser.parse_args()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=args.nodes,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )


if __name__ == "__main__":
    main()
