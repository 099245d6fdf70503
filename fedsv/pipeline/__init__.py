"""fedsv.pipeline: what every engine's rounds share: pending rounds, valuation worker and process, metrics."""
