# fedsv: `make demo` sets everything up and runs the main job; `make test` runs lint, types and every test;
# `make check` runs lint, types and the quick tier (tests/unit) in a few minutes.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test check lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

# The main job: ten members of the embedded MNIST sample that differ (two with half their labels flipped,
# one holding 30 images, one free rider that trains nothing and replays the federation's own step).
DEMO_FEDERATION := --participants 10 --rounds 10 --corrupt "0-1=flip:0.5;2=keep:30;3=mimic:1"

demo: install
	$(BIN)/fedsv launch $(DEMO_FEDERATION) --out runs/demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q

check: lint
	$(BIN)/python -m pytest -q tests/unit

bench: install
	$(BIN)/python benchmarks/bench_valuation.py
	$(BIN)/python benchmarks/bench_rounds.py
	$(BIN)/python benchmarks/bench_load.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
