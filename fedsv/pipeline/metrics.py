"""The coordinator's Prometheus metrics, on an injectable registry, and the HTTP endpoint serving them."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from fedsv.ledger import RoundRecord

logger = logging.getLogger(__name__)

# Seconds from a few milliseconds (aggregation, exact valuation of a small round) to an hour (a slow round).
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
PHASES = ("train_wait", "aggregation", "valuation", "evaluation")


class RunMetrics:
    """Every fedsv_* metric of a coordinator, registered on `registry` (a new one when None).

    Counters and histograms count what happened in THIS process: after a restart they start again
    from zero (Prometheus' rate()/increase() treat that as a counter reset); the ledger keeps the
    durable totals. Gauges are set again from the ledger by restore().
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.current_round = Gauge(
            "fedsv_current_round", "Round in progress (last completed when idle)", registry=r
        )
        self.rounds_completed = Counter("fedsv_rounds_completed", "Rounds completed and recorded", registry=r)
        self.round_duration = Histogram(
            "fedsv_round_duration_seconds", "Wall time of a round", buckets=SECONDS_BUCKETS, registry=r
        )
        self.phase_duration = Histogram(
            "fedsv_phase_duration_seconds",
            "Wall time of a round's phase",
            ["phase"],
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.global_accuracy = Gauge("fedsv_global_accuracy", "Test accuracy of the global model", registry=r)
        self.global_loss = Gauge("fedsv_global_loss", "Test loss of the global model", registry=r)
        self.participants_connected = Gauge(
            "fedsv_participants_connected", "Participants with an open event stream", registry=r
        )
        self.participants_selected = Gauge(
            "fedsv_participants_selected", "Selected in the last round", registry=r
        )
        self.participants_received = Gauge(
            "fedsv_participants_received", "Updates received in the last completed round", registry=r
        )
        self.stragglers = Counter(
            "fedsv_stragglers", "Selected participants whose update missed a round", registry=r
        )
        self.updates_rejected = Counter(
            "fedsv_updates_rejected", "RPCs/updates refused", ["reason"], registry=r
        )
        self.updates_public = Counter(
            "fedsv_updates_public",
            "Updates aggregated with the guard's screens off that held nothing beyond the global model's "
            "recent steps (zero, a mimic's step, noise): every coalition holds them, valued 0",
            registry=r,
        )
        self.participant_lookalike_rounds = Counter(
            "fedsv_participant_lookalike_rounds",
            "Rounds the participant's update was far more alike than independent data give to another's (a "
            "copy of one's data, or members of the same classes), each valued apart: merging off",
            ["participant"],
            registry=r,
        )
        self.participant_quarantined = Gauge(
            "fedsv_participant_quarantined",
            "1 while the participant is quarantined (its updates valued, not aggregated), else 0",
            ["participant"],
            registry=r,
        )
        self.awaiting_request = Gauge(
            "fedsv_calls_awaiting_request", "Open calls whose request has not arrived yet", registry=r
        )
        self.bytes = Counter("fedsv_rpc_bytes", "Serialized message bytes", ["rpc", "direction"], registry=r)
        self.messages = Counter("fedsv_rpc_messages", "Messages", ["rpc", "direction"], registry=r)
        self.utility_evaluations = Counter(
            "fedsv_utility_evaluations", "Distinct coalition utilities evaluated by valuation", registry=r
        )
        self.valuation_duration = Histogram(
            "fedsv_valuation_seconds", "Wall time of a round's valuation", buckets=SECONDS_BUCKETS, registry=r
        )
        self.valuation_last_seconds = Gauge(
            "fedsv_valuation_last_round_seconds", "Wall time of the last round's valuation", registry=r
        )
        self.participant_fedsv = Gauge(
            "fedsv_participant_fedsv", "Cumulative federated Shapley value", ["participant"], registry=r
        )
        self.participant_fedsv_normalized = Gauge(
            "fedsv_participant_fedsv_normalized",
            "Cumulative FedSV of L2-normalized round vectors",
            ["participant"],
            registry=r,
        )
        self.participant_fedsv_completed = Gauge(
            "fedsv_participant_fedsv_completed",
            "Completed FedSV: every member valued in every round (completion.py)",
            ["participant"],
            registry=r,
        )
        self.participant_completed_stderr = Gauge(
            "fedsv_participant_fedsv_completed_stderr",
            "Standard error of the completed FedSV against a rerun (+Inf: never selected; NaN: unknown)",
            ["participant"],
            registry=r,
        )
        self.completion_seconds = Gauge(
            "fedsv_completion_seconds",
            "Wall time of the last completion, in the valuation process",
            registry=r,
        )
        self.group_rationality_residual = Gauge(
            "fedsv_group_rationality_residual", "Last round: sum of values - (U_after - U_before)", registry=r
        )
        self.valuation_queue_depth = Gauge(
            "fedsv_valuation_queue_depth", "Rounds committed and waiting for their values", registry=r
        )
        self.valuation_lag_rounds = Gauge(
            "fedsv_valuation_lag_rounds", "Rounds the values run behind the last committed round", registry=r
        )
        self.valuation_lag_seconds = Gauge(
            "fedsv_valuation_lag_seconds",
            "Seconds from the last valued round's commit to its values' commit",
            registry=r,
        )
        self.valuation_backlog_bytes = Gauge(
            "fedsv_valuation_backlog_bytes",
            "Bytes of the inputs of rounds waiting for their values",
            registry=r,
        )
        self.participant_value_stderr = Gauge(
            "fedsv_value_stderr",
            "The estimator's standard error of the cumulative FedSV (0: exact; +Inf: unknown)",
            ["participant"],
            registry=r,
        )
        self.participant_rerun_stderr = Gauge(
            "fedsv_value_rerun_stderr",
            "Standard error of a total against a rerun of the federation (estimator, validation set, "
            "training and selection), set when the valuation has caught up (NaN: unknown)",
            ["participant", "value"],
            registry=r,
        )
        self.round_max_stderr = Gauge(
            "fedsv_round_max_stderr", "Largest standard error of the last valued round's values", registry=r
        )
        self.round_bytes = Gauge("fedsv_round_bytes", "Bytes of the last round", ["direction"], registry=r)
        self.round_bytes_ratio = Gauge(
            "fedsv_round_bytes_ratio_to_minimum",
            "Last round's bytes / physical minimum (one model down per selected, one delta up per received)",
            registry=r,
        )

    # ------------------------------------------------------------------ live events
    def record_rpc(self, rpc: str, direction: str, nbytes: int, messages: int = 1) -> None:
        """Count one message (or `messages`) of `nbytes` in all of `rpc` in `direction` ("up" or "down")."""
        self.bytes.labels(rpc=rpc, direction=direction).inc(nbytes)
        self.messages.labels(rpc=rpc, direction=direction).inc(messages)

    def reject(self, reason: str) -> None:
        self.updates_rejected.labels(reason=reason).inc()

    def set_connected(self, n: int) -> None:
        self.participants_connected.set(n)

    # ------------------------------------------------------------------ per round
    def observe_round(
        self,
        record: RoundRecord,
        cumulative: Mapping[str, Mapping[str, float]],
        errors: Mapping[str, Mapping[str, float]] | None = None,
        alike: Sequence[Sequence[str]] = (),
    ) -> None:
        """A round committed with its values (inline valuation): both halves below.

        `cumulative` is FederatedValuation.sums() after the round (keys "fedsv", "fedsv_normalized", ...),
        `errors` its sum_errors() (the same keys), `alike` the round's look-alike groups (RoundValues).
        """
        self.observe_training(record)
        self.observe_values(record, cumulative, errors=errors, alike=alike)

    def observe_training(self, record: RoundRecord) -> None:
        """A committed round (its values may follow later): counters, histograms and its gauges."""
        self.rounds_completed.inc()
        self.stragglers.inc(len(record.stragglers))
        self.round_duration.observe(record.round_seconds)
        phases = (record.train_wait_seconds, record.aggregation_seconds, record.evaluation_seconds)
        for phase, seconds in zip(("train_wait", "aggregation", "evaluation"), phases, strict=True):
            self.phase_duration.labels(phase=phase).observe(seconds)
        self._set_round_gauges(record)

    def observe_values(
        self,
        record: RoundRecord,
        cumulative: Mapping[str, Mapping[str, float]],
        lag_rounds: int = 0,
        errors: Mapping[str, Mapping[str, float]] | None = None,
        alike: Sequence[Sequence[str]] = (),
    ) -> None:
        """A round's values committed (`record` with its valuation fields): valuation metrics and totals.

        lag_rounds: rounds committed but not yet valued after this one (0 with inline valuation); alike:
        the round's look-alike groups (RoundValues.alike).
        """
        self.utility_evaluations.inc(record.evaluations)
        for pid in (pid for group in alike for pid in group):
            self.participant_lookalike_rounds.labels(participant=pid).inc()
        self.valuation_duration.observe(record.valuation_seconds)
        self.phase_duration.labels(phase="valuation").observe(record.valuation_seconds)
        self.valuation_lag_rounds.set(lag_rounds)
        lag = record.valuation_lag_seconds
        self.valuation_lag_seconds.set(0.0 if math.isnan(lag) else max(0.0, lag))
        # Only the round's participants' totals moved: the others' gauges are not touched (O(m)).
        self._set_value_gauges(record, cumulative, record.received, errors)

    def observe_completed(
        self,
        completed: Mapping[str, float],
        errors: Mapping[str, Mapping[str, float]],
        seconds: float,
    ) -> None:
        """The completed values of every member and every total's error against a rerun (per value key
        and member): the valuation worker sets them when caught up."""
        for pid, value in completed.items():
            self.participant_fedsv_completed.labels(participant=pid).set(float(value))
            self.participant_completed_stderr.labels(participant=pid).set(
                float(errors["fedsv_completed"][pid])
            )
        for key, per_member in errors.items():
            for pid, error in per_member.items():
                self.participant_rerun_stderr.labels(participant=pid, value=key).set(float(error))
        self.completion_seconds.set(seconds)

    def restore(
        self,
        records: Sequence[RoundRecord],
        cumulative: Mapping[str, Mapping[str, float]],
        errors: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        """After a coordinator restart: gauges from the ledger's last round and totals.

        Counters and histograms are left where they are (zero in a fresh process): they are not
        re-seeded from the ledger, so a restart reads as a counter reset, not as a burst of rounds.
        """
        if records:
            self._set_round_gauges(max(records, key=lambda rec: rec.round))
            valued = [rec for rec in records if not rec.pending]
            if valued:  # a member no round selected has no value: no gauge of 0 for it
                drawn = list(dict.fromkeys(pid for rec in records for pid in rec.selected))
                self._set_value_gauges(max(valued, key=lambda rec: rec.round), cumulative, drawn, errors)
            logger.info("metrics restored after round %d", max(rec.round for rec in records))

    def _set_round_gauges(self, record: RoundRecord) -> None:
        self.current_round.set(record.round)
        self.global_accuracy.set(record.test_accuracy)
        self.global_loss.set(record.test_loss)
        self.participants_selected.set(len(record.selected))
        self.participants_received.set(len(record.received))
        self.round_bytes.labels(direction="up").set(record.bytes_up)
        self.round_bytes.labels(direction="down").set(record.bytes_down)
        ratio = record.bytes_ratio_to_minimum
        self.round_bytes_ratio.set(math.nan if ratio is None else ratio)

    def _set_value_gauges(
        self,
        record: RoundRecord,
        cumulative: Mapping[str, Mapping[str, float]],
        participants: Sequence[str] | None = None,
        errors: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        """The round's valuation gauges, and the totals and errors of `participants` (None: everyone's)."""
        self.valuation_last_seconds.set(record.valuation_seconds)
        self.group_rationality_residual.set(record.group_rationality_residual)
        self.round_max_stderr.set(record.max_stderr)
        series = [
            (cumulative.get("fedsv", {}), self.participant_fedsv),
            (cumulative.get("fedsv_normalized", {}), self.participant_fedsv_normalized),
            ({} if errors is None else errors.get("fedsv", {}), self.participant_value_stderr),
        ]
        for values, gauge in series:
            for pid in values if participants is None else participants:
                if pid in values:
                    gauge.labels(participant=pid).set(values[pid])


def serve_metrics(registry: CollectorRegistry, host: str = "0.0.0.0", port: int = 0) -> tuple[Any, int]:
    """Serve `registry` over HTTP on host:port (0 = an ephemeral port) from a daemon thread.

    Returns (server, bound port); stop it with stop_metrics(server) (or server.shutdown()).
    """
    started = start_http_server(port, addr=host, registry=registry)
    if started is None:  # prometheus-client < 0.20 returns nothing
        raise RuntimeError("prometheus-client >= 0.20 is needed to learn the metrics port")
    server = started[0]
    bound = int(server.server_address[1])
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    return server, bound


def stop_metrics(server: Any) -> None:
    """Stop serving and release the port."""
    server.shutdown()
    server.server_close()
