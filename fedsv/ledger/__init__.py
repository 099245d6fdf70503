"""fedsv.ledger: the run's durable SQLite ledger, its record types and builder, the checkpoint codec."""

from fedsv.ledger.builder import RoundTimes, TestScore, build_round_record
from fedsv.ledger.checkpoint import Checkpoint, decode_params, encode_params
from fedsv.ledger.checks import LedgerError
from fedsv.ledger.records import RoundRecord, RoundStatus, TrafficRow, UpdateRow, ValuationSummary, ValueRow
from fedsv.ledger.store import Ledger
from fedsv.ledger.valuation_view import federated_valuation, valuation_summary, value_rows

__all__ = [
    "Checkpoint",
    "Ledger",
    "LedgerError",
    "RoundRecord",
    "RoundStatus",
    "RoundTimes",
    "TestScore",
    "TrafficRow",
    "UpdateRow",
    "ValuationSummary",
    "ValueRow",
    "build_round_record",
    "decode_params",
    "encode_params",
    "federated_valuation",
    "valuation_summary",
    "value_rows",
]
