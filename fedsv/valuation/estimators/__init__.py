"""fedsv.valuation.estimators: the Shapley estimators, their samplers and planning, over games, numpy only."""
