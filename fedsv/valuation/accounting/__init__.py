"""fedsv.valuation.accounting: values per round and across rounds, completion, recommended value, verdict."""
