"""fedsv coordinator: selects participants, aggregates, values each round, keeps the ledger."""
