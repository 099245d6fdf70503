"""fedsv.valuation.round: one FL round as a cooperative game (w_t plus a coalition's deltas), in torch."""
