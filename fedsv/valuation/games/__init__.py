"""fedsv.valuation.games: cooperative games (memoized utilities, scores per cell, merged players)."""
