"""fedsv.valuation.errors: what a value's standard error is made of (validation, training, reruns)."""
