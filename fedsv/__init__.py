"""fedsv: federated learning that values every participant's data with the federated Shapley value.

Layers, each importing only from those below it: fedsv.valuation < fedsv.common <
fedsv.coordinator | fedsv.participant < fedsv.app (docs/architecture.md).
"""

__version__ = "0.1.0"
