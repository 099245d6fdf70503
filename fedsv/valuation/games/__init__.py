"""fedsv.valuation.games: cooperative games and the Shapley estimators over them, in numpy (no torch)."""
