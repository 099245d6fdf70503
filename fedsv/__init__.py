"""fedsv: federated learning that values every participant's data with the federated Shapley value.

Packages, each importing only from those below it (docs/architecture.md): fedsv.config, fedsv.fl <
fedsv.valuation, fedsv.data, fedsv.wire, fedsv.security < fedsv.task, fedsv.ledger < fedsv.coordinator |
fedsv.participant < fedsv.app, fedsv.integrations.
"""

__version__ = "0.1.0"
