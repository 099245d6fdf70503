"""The study's math (detection curves and areas, summarization dismissal) and its command-line errors."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fedsv.app.cli import main
from fedsv.app.study.config import StudyConfig, bad_ranks, corrupt_spec
from fedsv.app.study.detection import (
    RANDOM_EXPECTED_AREA,
    curve_area,
    detection_area,
    detection_curve,
    pairwise_auc,
    random_scores,
    value_totals,
)
from fedsv.app.study.summarization import (
    Q_VALUES,
    dismiss_count,
    is_original,
    keep_at_random,
    keep_by_value,
    replay_schedule,
    selection_spec,
)
from fedsv.ledger import ValueRow, federated_valuation
from fedsv.settings.choices import Dataset, Metric, ValuationMethod
from tests.support.records import make_record

# ---------------------------------------------------------------------- detection curves and areas


def test_all_bad_ranked_first_has_area_one() -> None:
    scores = [0.1, 0.2, 0.9, 0.8, 0.7, 0.6]
    bad = [True, True, False, False, False, False]
    curve = detection_curve(scores, bad)
    assert curve.tolist() == [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert detection_area(scores, bad) == pytest.approx(1.0)


def test_all_bad_ranked_last_has_area_zero() -> None:
    scores = [0.9, 0.8, 0.1, 0.2, 0.3, 0.4]
    bad = [True, True, False, False, False, False]
    assert detection_curve(scores, bad)[-3:].tolist() == [0.0, 0.5, 1.0]
    assert detection_area(scores, bad) == pytest.approx(0.0)


def test_area_is_the_pairwise_auc_including_ties() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(3, 15))
        scores = rng.integers(0, 4, size=n).astype(float)  # many ties
        bad = np.zeros(n, dtype=bool)
        bad[rng.choice(n, size=int(rng.integers(1, n)), replace=False)] = True
        assert detection_area(scores, bad) == pytest.approx(pairwise_auc(scores, bad))


def test_random_ranking_expects_one_half() -> None:
    bad = [True] * 3 + [False] * 5
    # exactly: the mean over all orderings of 8 participants (8! permutations)
    areas = [detection_area(np.array(p, dtype=float), bad) for p in itertools.permutations(range(8))]
    assert np.mean(areas) == pytest.approx(RANDOM_EXPECTED_AREA)
    # a ranking that cannot tell anyone apart (all tied) sits exactly at the expectation
    assert detection_area(np.zeros(8), bad) == pytest.approx(0.5)
    assert detection_curve(np.zeros(8), bad)[4] == pytest.approx(0.5)


def test_random_is_the_expectation_over_every_order_not_one_draw() -> None:
    flags = np.zeros(20, dtype=bool)
    flags[[1, 5, 6, 19]] = True
    curve = detection_curve(random_scores(20), flags)
    np.testing.assert_allclose(curve, np.arange(21) / 20)  # found(k) = k/N exactly
    assert detection_area(random_scores(20), flags) == pytest.approx(0.5, abs=1e-12)
    # the mean of many random orders converges to it
    rng = np.random.default_rng(0)
    draws = np.mean([detection_curve(rng.permutation(20).astype(float), flags) for _ in range(4000)], axis=0)
    np.testing.assert_allclose(draws, curve, atol=0.02)


def test_curve_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="no bad participants"):
        detection_curve([1.0, 2.0], [False, False])
    with pytest.raises(ValueError, match="one length"):
        detection_curve([1.0, 2.0], [True])
    with pytest.raises(ValueError, match="finite"):
        detection_curve([1.0, float("nan")], [True, False])
    with pytest.raises(ValueError, match="bad_count"):
        curve_area(np.zeros(3), 0)


def test_value_totals_sum_rounds_and_leave_unvalued_at_zero() -> None:
    records = [make_record(1, ["p000", "p002"], ["p000", "p002"]), make_record(2, ["p000"], ["p000"])]
    rows = [
        ValueRow(1, "p000", 0.3, 0.4, 0.6, 0.8),
        ValueRow(1, "p002", -0.4, 0.0, -0.8, 0.0),
        ValueRow(2, "p000", 0.05, 0.02, 1.0, 1.0),
    ]
    totals = value_totals(federated_valuation(records, rows), 4)
    assert totals["fedsv"].tolist() == pytest.approx([0.35, 0.0, -0.4, 0.0])
    assert totals["fedsv_normalized"].tolist() == pytest.approx([1.6, 0.0, -0.8, 0.0])
    assert totals["loo_normalized"].tolist() == pytest.approx([2.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="unknown participant"):
        value_totals(
            federated_valuation([make_record(1, ["p009"], ["p009"])], [ValueRow(1, "p009", 0, 0, 0, 0)]), 4
        )


def test_bad_ranks_are_seeded() -> None:
    assert bad_ranks(20, 0.2, 5) == bad_ranks(20, 0.2, 5)
    assert len(bad_ranks(20, 0.3, 1)) == 6
    assert bad_ranks(20, 0.0, 1) == []
    assert corrupt_spec([1, 4], "flip:0.3") == "1,4=flip:0.3"


# ---------------------------------------------------------------------- summarization dismissal


def test_dismiss_count_is_floor_and_keeps_one() -> None:
    assert [dismiss_count(q, 10) for q in Q_VALUES] == list(range(10))
    assert [dismiss_count(q, 5) for q in Q_VALUES] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert dismiss_count(0.9, 1) == 0
    with pytest.raises(ValueError):
        dismiss_count(1.0, 5)


def test_keep_by_value_dismisses_the_lowest_totals() -> None:
    totals = np.array([0.5, -0.2, 0.1, 0.3, 0.1, 0.0])
    assert keep_by_value([0, 1, 2, 3, 4], totals, 2) == (0, 3, 4)  # 1 (-0.2), then 2 (tie with 4: lower rank)
    assert keep_by_value([5, 3], totals, 0) == (3, 5)


def test_keep_at_random_is_seeded_and_sized() -> None:
    kept = keep_at_random([7, 2, 9, 4], 2, np.random.default_rng(0))
    assert len(kept) == 2 and set(kept) <= {2, 4, 7, 9}
    assert kept == keep_at_random([7, 2, 9, 4], 2, np.random.default_rng(0))


def test_replay_schedule_and_spec() -> None:
    selection = {1: [0, 1, 2, 3], 2: [1, 3, 4, 5]}
    totals = {"fedsv": np.array([0.4, 0.1, 0.3, 0.2, 0.0, 0.5]), "loo": np.zeros(6)}
    schedule = replay_schedule(selection, "fedsv", 0.5, totals, seed=0)
    assert schedule == {1: (0, 2), 2: (3, 5)}
    assert selection_spec(schedule) == "1=0,2;2=3,5"
    assert is_original(replay_schedule(selection, "loo", 0.0, totals, seed=0), selection)
    assert not is_original(schedule, selection)
    draws = [replay_schedule(selection, "random", 0.5, totals, seed=0, draw=d) for d in range(3)]
    assert draws[0] == replay_schedule(selection, "random", 0.5, totals, seed=0, draw=0)
    assert all(len(kept) == 2 for d in draws for kept in d.values())
    with pytest.raises(ValueError, match="unknown summarization method"):
        replay_schedule(selection, "best", 0.5, totals, seed=0)


# ---------------------------------------------------------------------- config and command line


def test_quick_and_study_defaults() -> None:
    noisy = StudyConfig(quick=True).resolved("noisy")
    assert (noisy.participants, noisy.seeds, noisy.bad_fraction, noisy.flip_ratio) == (20, 2, 0.2, 0.3)
    backdoor = StudyConfig().resolved("backdoor")
    assert (backdoor.seeds, backdoor.bad_fraction) == (3, 0.3)
    assert StudyConfig(dataset=Dataset.CIFAR10, data_dir="x").resolved("noisy").flip_ratio == 0.03
    assert StudyConfig(quick=True, seeds=5).resolved("noisy").seeds == 5
    settings = StudyConfig(partition="noniid").resolved("noisy").settings()
    assert settings == [("noniid", "mlp"), ("noniid", "cnn")]
    assert StudyConfig().resolved("summarize").settings() == [("iid", "mlp"), ("noniid", "mlp")]
    with pytest.raises(ValueError, match="resolved"):
        StudyConfig().settings()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["noisy", "--partition", "sorted"], "partition must be a comma list"),
        (["noisy", "--model", "resnet"], "model must be a comma list"),
        (["backdoor", "--backdoor", "flip:0.1"], "backdoor must be a backdoor spec"),
        (["noisy", "--fraction", "0"], "fraction must be in (0, 1]"),
        (["noisy", "--valuation", "none"], "valuation none gives no values"),
        (["noisy", "--bad-fraction", "1.5"], "bad_fraction must be in [0, 1)"),
    ],
)
def test_bad_input_is_one_line_error(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["study", *flags, "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("fedsv study: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_data_files_are_one_line_error_before_any_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "s"
    code = main(
        ["study", "noisy", "--dataset", "mnist", "--data-dir", str(tmp_path / "none"), "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "fedsv study: error: data directory" in err and "does not exist" in err
    assert not (out / "runs").exists()


def test_unknown_study_is_rejected_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["study", "poison"])
    assert exc.value.code == 2
    assert "invalid choice: 'poison'" in capsys.readouterr().err


def test_experiment_configs_are_valid_study_configs() -> None:
    configs = sorted(Path(__file__).resolve().parents[2].glob("experiments/*.json"))
    assert configs, "experiments/ holds the paper-scale configs"
    for path in configs:
        data = json.loads(path.read_text())
        StudyConfig(**data)


def test_every_method_a_study_reports_has_a_label_and_a_colour() -> None:
    from fedsv.app.study.detection import DETECTION_METHODS, LABELS
    from fedsv.app.study.outputs import COLORS
    from fedsv.app.study.summarization import SUMMARY_METHODS

    for method in (*DETECTION_METHODS, *SUMMARY_METHODS):
        assert method in LABELS and method in COLORS, method


def test_a_finished_run_recorded_before_newer_settings_existed_is_reused(tmp_path: Path) -> None:
    """A ledger whose config predates a setting (it is absent) holds that setting's default: reusable."""
    from fedsv.app.study.runner import _finished
    from fedsv.ledger import Checkpoint, Ledger
    from fedsv.settings.run import RunConfig

    run = RunConfig(participants=4, fraction=0.5, rounds=2, valuation=ValuationMethod.EXACT)
    older = {k: v for k, v in run.to_dict().items() if k not in ("validation_from", "test_size", "metric")}
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-old", older)
        for n in (1, 2):
            ledger.commit_round(
                make_record(n, ["p000", "p001"], ["p000", "p001"]), [], [], Checkpoint(n, b"w", "{}")
            )
    assert _finished(tmp_path, run) is not None
    assert _finished(tmp_path, run.changed(metric=Metric.NEG_LOSS)) is None  # a setting that differs


def test_a_run_stopped_before_its_backlog_was_valued_is_resumed_not_reused(tmp_path: Path) -> None:
    """All rounds trained but one still awaiting its values (the study was stopped while the run's
    valuation lagged): not finished, so not reused; recorded, so the runner resumes it."""
    from fedsv.app.study.runner import _finished, _recorded
    from fedsv.ledger import Checkpoint, Ledger, RoundStatus
    from fedsv.settings.run import RunConfig

    run = RunConfig(participants=4, fraction=0.5, rounds=3, valuation=ValuationMethod.EXACT)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.ensure_run("run-1", run.to_dict())
        for n in (1, 2):
            ledger.commit_round(
                make_record(n, ["p000", "p001"], ["p000", "p001"]), [], [], Checkpoint(n, b"w", "{}")
            )
    recorded = _recorded(tmp_path, run)
    assert recorded is not None and not recorded.finished and recorded.pending == 0  # a round short
    pending = replace(make_record(3, ["p000", "p001"], ["p000", "p001"]), status=RoundStatus.PENDING)
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        ledger.commit_round(pending, [], [], Checkpoint(3, b"w", "{}"))
    recorded = _recorded(tmp_path, run)
    assert recorded is not None and len(recorded.rounds) == 3 and recorded.pending == 1
    assert not recorded.finished and _finished(tmp_path, run) is None
    assert _recorded(tmp_path, run.changed(seed=1)) is None  # another run's ledger: started afresh
