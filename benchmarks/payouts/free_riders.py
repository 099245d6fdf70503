"""Is a free rider paid? Every kind of free rider, in small and larger federations, IID and non-IID.

One member (rank 3, or rank 5 of 6) holds its shard but trains nothing and sends instead:

- `replay`: the global model back untrained (a zero delta);
- `noise:0.01` and `noise:1`: Gaussian noise of that L2 norm (small, and about an honest update's);
- `mimic`: the federation's own step (w_t - w_s) / (t - s) from the global models it received;
- `mimic:1`: the same plus noise of the step's own size;
- `mimic+count:1000000`, `mimic:1+count:1000000`: with a declared sample count inflated to 10^6;
- `madeup`: no data of its own; it makes up inputs and labels and trains on them as an honest member
  trains (its update has the shape of training); `madeup+step`: that update plus the federation's own
  recent step.

Each is run with the defaults (the guard on, exact values, trained and valued in this process as
`fedsv launch` does) in a 6-member federation (3 per round) and a 20-member one (10 per round), IID and
non-IID, seeds 0-2, 8 rounds. Per case it prints the rider's payout share by the recommended value
(negative values paid nothing) at its worst seed, the lowest honest member's share in that run, their
ratio (the target: at most 1/8; an honest member of a skewed federation can be worth nothing), and in
how many of its selected rounds the guard turned it away, and the worst seed's final accuracy against
the run whose rider sends nothing (the target: within 0.01). `--undetected` runs every
kind with the guard's direction check and screens off (`--no-update-direction`): nothing is turned
away for its direction or as a free rider, and what the rider is paid is what valuation does with an
aggregated update that holds nothing beyond the global model's recent steps (public: in every
coalition, valued 0; docs/valuation.md).

    python benchmarks/bench_payouts.py --part free-riders [--undetected]    # about 20 minutes on 2 cores
"""

from __future__ import annotations

import time
from typing import Any

from fedsv.app.demo import DemoConfig, run_demo
from payouts.targets import Target

KINDS = (
    "replay",
    "noise:0.01",
    "noise:1",
    "mimic",
    "mimic:1",
    "mimic+count:1000000",
    "mimic:1+count:1000000",
    "madeup",
    "madeup+step",
)
SHAPES = {"6/3": (6, 0.5, 5), "20/10": (20, 0.5, 3)}  # participants, fraction, the rider's rank


def case(
    shape: str, partition: str, kind: str, seed: int, guard: bool
) -> tuple[float, float, int, int, float]:
    """(the rider's share, the lowest honest member's share, rounds the rider was selected in, rounds it
    was turned away in, the final accuracy less the run's whose rider sends nothing)."""
    participants, fraction, rider = SHAPES[shape]
    settings: dict[str, Any] = {
        "participants": participants, "fraction": fraction, "rounds": 8, "seed": seed,
        "partition": partition, "valuation": "exact", "corrupt": f"{rider}={kind}",
        "update_direction": guard,
    }  # fmt: skip
    result = run_demo(DemoConfig(**settings))
    without = run_demo(DemoConfig(**{**settings, "valuation": "none", "corrupt": f"{rider}=scale:0"}))
    valuation = result.valuation
    totals = valuation.totals()["fedsv_shrunk"]
    paid = {pid: max(value, 0.0) for pid, value in totals.items()}
    pot = sum(paid.values())
    rider_id = f"p{rider:03d}"
    honest = min(value for pid, value in paid.items() if pid != rider_id) / pot
    selected = sum(rider_id in (rv.selected or rv.participants) for rv in valuation.per_round())
    kept = sum(rider_id in rv.participants for rv in valuation.per_round())
    lost = result.accuracies[-1] - without.accuracies[-1]
    return paid[rider_id] / pot, honest, selected, selected - kept, lost


def run(seeds: int, kinds: list[str], undetected: bool) -> list[Target]:
    """Print the table; the targets: each rider at most 1/8 of the lowest honest share, and accuracy
    within 0.01 of the run whose rider sends nothing."""
    print(f"guard: {'off (--no-update-direction)' if undetected else 'on (the defaults)'}\n")
    print(
        "| federation | partition | rider | its share (worst seed) | lowest honest share (that seed) "
        "| ratio | turned away | accuracy vs without (worst seed) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    started = time.perf_counter()
    worst_ratio, worst_lost, overpaid = 0.0, 0.0, []
    for shape in SHAPES:
        for partition in ("iid", "noniid"):
            for kind in kinds:
                found = [case(shape, partition, kind, seed, not undetected) for seed in range(seeds)]
                share, honest, _, _, _ = max(found, key=lambda f: (f[0], -f[1]))
                lost = min(f[4] for f in found)
                worst_lost = min(worst_lost, lost)
                ratio = share / honest if honest > 0 else (0.0 if share == 0 else float("inf"))
                worst_ratio = max(worst_ratio, ratio)
                if ratio > 1 / 8:
                    overpaid.append(f"{kind} ({shape} {partition})")
                shown = "-" if ratio == float("inf") else f"{ratio:.3f}"
                away, selected = sum(f[3] for f in found), sum(f[2] for f in found)
                line = (
                    f"| {shape} | {partition} | `{kind}` | {share:.2%} | {honest:.2%} | {shown} "
                    f"| {away} of {selected} | {lost:+.3f} |"
                )
                print(line, flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s\n")
    part = "free riders" + (" (screens off)" if undetected else "")
    return [
        Target(part, "a rider's share at most 1/8 of the lowest honest share, every case",
               f"worst {worst_ratio:.3g}" + (f"; over it: {', '.join(overpaid)}" if overpaid else ""),
               not overpaid),
        Target(part, "final accuracy within 0.01 of the run whose rider sends nothing",
               f"worst {worst_lost:+.3f}", worst_lost >= -0.01),
    ]  # fmt: skip
