"""Peer Shapley estimators (shapiq, pyDVL) that bench_estimators.py runs in benchmarks/.peers-venv."""
