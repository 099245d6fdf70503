"""fedsv.fl: the FL core under everything: federated state, aggregation, norm bounds, seeded draws."""
