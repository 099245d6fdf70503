"""What the guard did to a round's updates, as the coordinator records and tells it: each refused update's
reason (the round's record and fedsv_updates_rejected_total's label), a log line per decision, and
quarantine in the logs and metrics."""

from __future__ import annotations

import logging

from fedsv.fl.update_guard import GuardedRound
from fedsv.pipeline.metrics import RunMetrics

logger = logging.getLogger("fedsv.coordinator.round_loop")  # the round's lines, where operators read them

SAID = {  # reason -> what the update did (each with its cosine with the validation set's descent or step)
    "against_validation": "points against the step the validation set itself takes from w_t",
    "direction_rejected": "works against the validation set and the round is better without it",
    "null_update": "carries no information (norm 0, or a random direction): a free rider's",
    "round_worse": "points against the validation set in a round whose aggregate it made worse",
}
SHARES = {  # reason -> what a share of the update says
    "public_step": "carries nothing beyond the global model's recent steps (%.0f%% of it along them): a "
    "free rider's",
    "made_up": "moved its first layer outside the span of the validation data's inputs (%.0f%% of it "
    "there) as made-up inputs do",
}


def refusals(guarded: GuardedRound) -> dict[str, str]:
    """Each update the guard kept from aggregation: participant -> reason."""
    return {
        **dict.fromkeys(guarded.bounded.rejected, "norm_rejected"),
        **dict.fromkeys(guarded.against, "against_validation"),
        **dict.fromkeys(guarded.turned_away, "direction_rejected"),
        **dict.fromkeys(guarded.null, "null_update"),
        **dict.fromkeys(guarded.mimic, "public_step"),
        **dict.fromkeys(guarded.made_up, "made_up"),
        **dict.fromkeys(guarded.identical, "identical_update"),
        **dict.fromkeys(guarded.worse, "round_worse"),
        **dict.fromkeys(guarded.held, "quarantined"),
    }


def report_guard(number: int, guarded: GuardedRound, metrics: RunMetrics) -> None:
    """Every decision of round `number`'s guard into the logs and the metrics."""
    bounded = guarded.bounded
    for pid, declared in guarded.capped.items():
        metrics.reject("weight_capped")
        logger.warning("round %d: %s declared %d samples; its FedAvg weight is capped", number, pid, declared)
    for pid in [*bounded.clipped, *bounded.rejected]:
        reason = "norm_clipped" if pid in bounded.clipped else "norm_rejected"
        metrics.reject(reason)
        logger.warning(
            "round %d: %s's update has norm %.4g, over the bound %.4g: %s",
            number,
            pid,
            bounded.norms[pid],
            bounded.bound,
            "clipped" if reason == "norm_clipped" else "rejected",
        )
    cosines = {
        "against_validation": guarded.against,
        "direction_rejected": guarded.turned_away,
        "null_update": guarded.null,
        "round_worse": guarded.worse,
    }
    for reason, found in cosines.items():
        reference = "step" if reason == "against_validation" else "descent"
        for pid, cosine in found.items():
            metrics.reject(reason)
            logger.warning(
                "round %d: %s's update %s (its cosine with the validation set's %s: %.3f): rejected",
                number,
                pid,
                SAID[reason],
                reference,
                cosine,
            )
    for reason, found_share in (("public_step", guarded.mimic), ("made_up", guarded.made_up)):
        for pid, share in found_share.items():
            metrics.reject(reason)
            logger.warning(f"round %d: %s's update {SHARES[reason]}: rejected", number, pid, 100 * share)
    for pid, partner in guarded.identical.items():
        metrics.reject("identical_update")
        logger.warning(
            "round %d: %s sent the very update %s sent (no member's own training does): rejected",
            number,
            pid,
            partner,
        )
    for pid, along in guarded.public.items():
        metrics.updates_public.inc()
        logger.warning(
            "round %d: %s's update carries nothing beyond the global model's recent steps (%.0f%% of "
            "it along them): aggregated (the guard's screens are off), valued 0 in every coalition",
            number,
            pid,
            100 * along,
        )
    _report_reputation(number, guarded, metrics)


def _report_reputation(number: int, guarded: GuardedRound, metrics: RunMetrics) -> None:
    """Quarantine in the logs and the metrics: who is held back, who entered or left quarantine."""
    for pid, effect in guarded.held.items():
        metrics.reject("quarantined")
        logger.warning(
            "round %d: %s is quarantined: its update (validation loss %+.4g if aggregated) is valued, "
            "not aggregated",
            number,
            pid,
            effect,
        )
    for pid, score in guarded.reputation.quarantined.items():
        metrics.participant_quarantined.labels(participant=pid).set(1)
        logger.warning(
            "round %d: %s quarantined from the next round: its last updates made the validation loss "
            "worse by %.1f standard errors",
            number,
            pid,
            score,
        )
    for pid, score in guarded.reputation.readmitted.items():
        metrics.participant_quarantined.labels(participant=pid).set(0)
        logger.info("round %d: %s readmitted (its updates in quarantine score %.1f)", number, pid, score)
