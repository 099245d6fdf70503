"""The payout-property suite's parts (bench_payouts.py): free riders, joining twice, look-alikes, fairness."""
