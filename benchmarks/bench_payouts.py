"""What the payouts do for the properties members pay by: free riders and made-up data, joining twice,
look-alikes, and selection luck. Each part prints its table, and the suite ends with every target
beside the figure measured for it.

    python benchmarks/bench_payouts.py                                   # every part (about an hour)
    python benchmarks/bench_payouts.py --part free-riders --undetected   # the guard's screens off
    python benchmarks/bench_payouts.py --part duplicates --seeds 4 --owner 4
    python benchmarks/bench_payouts.py --part lookalikes --seeds 3 --epochs 1
    python benchmarks/bench_payouts.py --part fairness --seeds 10 --rounds 30

--seeds 0 (the default) gives each part its own: free riders 3, joining twice 4, look-alikes 3 (IID;
non-IID runs the four seeds whose partition gives two honest members the same classes), fairness 5.
"""

from __future__ import annotations

import argparse
import sys

from fixtures import load_average, machine
from payouts import duplicates, fairness, free_riders, lookalikes
from payouts.targets import Target, print_summary

PARTS = ("free-riders", "duplicates", "lookalikes", "fairness")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--seeds", type=int, default=0, help="seeds per part (0: each part's own)")
    parser.add_argument("--kinds", default=",".join(free_riders.KINDS), help="free riders: the kinds run")
    parser.add_argument("--undetected", action="store_true", help="free riders: the guard's screens off")
    parser.add_argument("--owner", type=int, default=4, help="joining twice: the owner with a copy (0-7)")
    parser.add_argument("--epochs", type=int, default=5, help="look-alikes: local epochs")
    parser.add_argument("--rounds", type=int, default=10, help="fairness: rounds")
    args = parser.parse_args(argv)
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {machine()}; load average {load_average()}\n")
    targets: list[Target] = []
    for part in args.part:
        print(f"## {part}\n", flush=True)
        if part == "free-riders":
            targets += free_riders.run(args.seeds or 3, args.kinds.split(","), args.undetected)
        elif part == "duplicates":
            targets += duplicates.run(args.seeds or 4, args.owner)
        elif part == "lookalikes":
            targets += lookalikes.run(args.seeds or 3, args.epochs)
        else:
            targets += fairness.run(args.seeds or 5, args.rounds)
    print(f"## targets (load average at the end {load_average()})\n")
    print_summary(targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
