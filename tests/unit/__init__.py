"""Unit tests: estimators, games, codec, ledger, data, models and the CLI pieces, in one process."""
