"""Integrations of fedsv's valuation with other federated-learning frameworks (optional extras)."""
