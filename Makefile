# Two commands for a fresh machine (see README):
#   make demo   set up and run the main job
#   make test   set up and run the whole test suite (ruff, mypy, pytest)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo demo-slow test lint typecheck unit bench reliability clean

$(BIN)/iolens: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	@touch $@

setup: $(BIN)/iolens

demo: setup
	bash scripts/demo.sh

# The same training with its dataset on a throttled loop device (root, loop devices, cgroup v1 blkio).
demo-slow: setup
	bash scripts/demo.sh --slow-disk

lint: setup
	$(BIN)/ruff check --output-format concise src tests bench scripts

typecheck: setup
	$(BIN)/mypy

unit: setup
	bash scripts/unit.sh $(PYTEST_ARGS)

test: lint typecheck unit

bench: setup
	$(BIN)/python bench/bench_sample.py --out bench/RESULTS.md
	$(BIN)/python bench/bench_batch.py --out bench/RESULTS.md
	$(BIN)/python bench/bench_stage.py --out bench/RESULTS.md
	$(BIN)/python bench/bench_run.py --out bench/RESULTS.md
	$(BIN)/python bench/bench_report.py --out bench/RESULTS.md
	$(BIN)/python bench/bench_exporter.py --out bench/RESULTS.md
	$(BIN)/python bench/bench_discovery.py --out bench/RESULTS.md
	$(BIN)/python bench/bench_predictions.py --out bench/RESULTS.md

# Runs the fault, bad-input and security suites and rewrites RELIABILITY.md (root: every case).
reliability: setup
	$(BIN)/python scripts/reliability.py --out RELIABILITY.md

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
