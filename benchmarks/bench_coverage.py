"""Do the stated standard errors hold? Sampled values of real rounds against a long-run reference.

Usage: python benchmarks/bench_coverage.py [--participants 30] [--fraction 0.667] [--rounds 5] [--seeds 10]
                                          [--target 0.002] [--reference-target 0.0005] [--no-surrogate]

Trains the rounds of a 30-participant run with 20 selected per round on the embedded MNIST sample, in
process, exactly as `fedsv launch` would (fedsv.app.demo.demo_rounds: the same draws, training, norm
bound and aggregation). m = 20 is beyond what exact valuation affords on a CPU, so the default values
are sampled to the accuracy target; each round is valued `--seeds` times that way (seeds 0..K-1) and
once to a far smaller target as the reference. Prints, per round and for the participants' totals, the
median stated standard error, the root-mean-square error against the reference, and the coverage of
the 95% intervals: the share of values within 1.96 standard errors of the reference (the reference's
own error is added in quadrature).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np
from fixtures import load_average, machine, print_table

from fedsv.app.demo import DemoConfig, TrainedRound, demo_rounds
from fedsv.settings.choices import ValuationMethod
from fedsv.valuation import RoundGame, ValuationSpec, shapley_values
from fedsv.valuation.estimators.result import ValuationResult

Z95 = 1.959964


def game_of(trained: TrainedRound) -> RoundGame:
    """The round's game, as value_updates builds it."""
    updates = sorted(trained.updates, key=lambda u: u.participant)
    return RoundGame(
        trained.model,
        trained.params,
        [u.delta for u in updates],
        [u.num_samples for u in updates],
        trained.validation.x,
        trained.validation.y,
        metric=trained.game.metric,
        aggregation=trained.game.aggregation,
    )


def sampled(game: RoundGame, target: float, cap: int, seed: int, surrogate: bool) -> ValuationResult:
    """What auto does for m = 20 on a CPU: the regression sampler, to the target, corrected by the
    round's linearized model where its pilot finds that it helps (`surrogate`)."""
    spec = ValuationSpec(
        method="regression", target_stderr=target, max_evaluations=cap, seed=seed, surrogate=surrogate
    )
    return shapley_values(game, spec=spec)


def coverage(errors: np.ndarray, stated: np.ndarray) -> float:
    return float(np.mean(np.abs(errors) <= Z95 * stated))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", type=int, default=30)
    parser.add_argument("--fraction", type=float, default=0.667)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.002)
    parser.add_argument("--cap", type=int, default=100_000)
    parser.add_argument("--reference-target", type=float, default=0.0005)
    parser.add_argument("--reference-cap", type=int, default=400_000)
    parser.add_argument(
        "--surrogate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the sampled runs corrected by the linearized round where it helps (the reference never is)",
    )
    args = parser.parse_args(argv)
    config = DemoConfig(
        participants=args.participants,
        fraction=args.fraction,
        rounds=args.rounds,
        valuation=ValuationMethod.NONE,
    )
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {machine()}; load average at start {load_average()}")
    print(
        f"run: {config.participants} participants, m = {config.selected_per_round} per round, "
        f"{config.rounds} rounds; {args.seeds} sampled valuations per round to stderr {args.target}, "
        f"reference to {args.reference_target}; surrogate {'on' if args.surrogate else 'off'}\n"
    )  # fmt: skip
    rows = []
    totals: dict[str, list[float]] = {}  # participant -> per seed, summed over rounds
    variances: dict[str, list[float]] = {}
    reference_totals: dict[str, float] = {}
    reference_variance: dict[str, float] = {}
    all_errors, all_stated = [], []
    for trained, _ in demo_rounds(config):
        game = game_of(trained)
        ids = sorted(u.participant for u in trained.updates)
        started = time.perf_counter()
        reference = sampled(game, args.reference_target, args.reference_cap, 10**6 + trained.round, False)
        reference_seconds = time.perf_counter() - started
        assert reference.stderr is not None
        runs = [sampled(game, args.target, args.cap, seed, args.surrogate) for seed in range(args.seeds)]
        errors = np.array([r.values - reference.values for r in runs])
        stated = np.array([np.sqrt(np.square(r.stderr) + np.square(reference.stderr)) for r in runs])  # type: ignore[arg-type]
        all_errors.append(errors.ravel())
        all_stated.append(stated.ravel())
        for i, pid in enumerate(ids):
            reference_totals[pid] = reference_totals.get(pid, 0.0) + float(reference.values[i])
            reference_variance[pid] = reference_variance.get(pid, 0.0) + float(reference.stderr[i]) ** 2
            for seed, run in enumerate(runs):
                assert run.stderr is not None
                totals.setdefault(pid, [0.0] * args.seeds)[seed] += float(run.values[i])
                variances.setdefault(pid, [0.0] * args.seeds)[seed] += float(run.stderr[i]) ** 2
        evaluations = statistics.median(r.extra["target"]["evaluations"] for r in runs)
        rows.append([
            str(trained.round), f"{evaluations:.0f}", f"{reference.evaluations}", f"{reference_seconds:.0f}",
            f"{np.median([r.stderr for r in runs]):.5f}", f"{math.sqrt(np.mean(errors ** 2)):.5f}",
            f"{coverage(errors, stated):.3f}",
        ])  # fmt: skip
        print(f"  round {trained.round} done", flush=True)
    pids = sorted(totals)
    total_errors = np.array([[totals[p][s] - reference_totals[p] for p in pids] for s in range(args.seeds)])
    total_stated = np.array(
        [[math.sqrt(variances[p][s] + reference_variance[p]) for p in pids] for s in range(args.seeds)]
    )
    errors, stated = np.concatenate(all_errors), np.concatenate(all_stated)
    rows.append([
        "all rounds", "", "", "", f"{np.median(stated):.5f}", f"{math.sqrt(np.mean(errors ** 2)):.5f}",
        f"{coverage(errors, stated):.3f}",
    ])  # fmt: skip
    total_rms = math.sqrt(np.mean(total_errors**2))
    rows.append([
        "totals", "", "", "", f"{np.median(total_stated):.5f}", f"{total_rms:.5f}",
        f"{coverage(total_errors, total_stated):.3f}",
    ])  # fmt: skip
    print()
    header = ["round", "evals (median)", "reference evals", "reference s", "stated stderr (median)",
              "RMS error vs reference", "95% coverage"]  # fmt: skip
    print_table(header, rows)
    print(f"coverage over {errors.size} round values and {total_errors.size} totals; "
          f"load average at end {load_average()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
