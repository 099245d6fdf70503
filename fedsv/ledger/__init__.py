"""fedsv.ledger: the run's durable SQLite ledger, its record types and builder, the checkpoint codec."""

from fedsv.ledger.builder import RoundTimes, TestScore, build_round_record
from fedsv.ledger.checkpoint import Checkpoint, decode_params, encode_params
from fedsv.ledger.checks import LedgerError
from fedsv.ledger.records import (
    ClassValueRow,
    EffectRow,
    FoldValueRow,
    RoundRecord,
    RoundStatus,
    TrafficRow,
    UpdateRow,
    ValuationSummary,
    ValueRow,
)
from fedsv.ledger.store import LEDGER_FILE, Ledger
from fedsv.ledger.valuation_view import (
    class_rows,
    drew_balanced,
    federated_valuation,
    valuation_summary,
    value_rows,
)

__all__ = [
    "LEDGER_FILE",
    "Checkpoint",
    "ClassValueRow",
    "EffectRow",
    "FoldValueRow",
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
    "class_rows",
    "decode_params",
    "drew_balanced",
    "encode_params",
    "federated_valuation",
    "valuation_summary",
    "value_rows",
]
