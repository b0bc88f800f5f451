# The two commands: `make demo` and `make test`. Both set up .venv themselves.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3.11
# This machine's pip config lists local mirrors that may not all exist; hide that noise.
QUIET_PIP := 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
VENV ?= .venv
BIN := $(VENV)/bin
ROOT := $(abspath .)
SRC := $(shell find thinkmem_ros launch config models ros_launchers resource -type f \
         -not -name '*.pyc' 2>/dev/null) setup.py setup.cfg package.xml pyproject.toml
# Isolate DDS traffic so parallel runs on one machine never hear each other.
ROS_DOMAIN_ID ?= $(shell echo $$(( $$$$ % 100 + 100 )))
export ROS_DOMAIN_ID
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export AMENT_PREFIX_PATH := $(ROOT)/$(VENV)$(if $(AMENT_PREFIX_PATH),:$(AMENT_PREFIX_PATH))
PYTEST_ARGS ?=

.PHONY: setup test demo lint bench bench-quick clean help
help:
	@echo "make demo   - set up .venv and run the main job end to end"
	@echo "make test   - set up .venv and run the test suite"
	@echo "make lint   - ruff over the package and tests"
	@echo "make bench-quick - every benchmark with --quick, JSON+PNG+RESULTS.md into bench_results/"
	@echo "make bench  - the same at full size (5 seeds; long)"

setup: $(VENV)/.installed

# Third-party dependencies: only re-run when a requirements file changes.
$(VENV)/.deps: requirements/robot.txt requirements/train.txt requirements/test.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "setuptools>=64" wheel $(QUIET_PIP)
	$(BIN)/python -m pip install -q -r requirements/robot.txt -r requirements/train.txt \
	    -r requirements/test.txt $(QUIET_PIP)
	touch $@

# The package itself, as a normal (non-editable) install so the data files land in
# share/ and lib/thinkmem_ros/ exactly as on a robot; re-run whenever a source changes.
$(VENV)/.installed: $(VENV)/.deps $(SRC)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation --force-reinstall . $(QUIET_PIP)
	touch $@

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: setup
	$(BIN)/thinkmem demo

lint: setup
	$(BIN)/ruff check thinkmem_ros test

BENCHES := exp1 exp2 exp3 exp5 exp6 latency node transport values memctl rounds faults fleet
BENCH_DIR ?= bench_results

# Every benchmark, one after another (they compete for the CPU), then the Markdown tables.
bench-quick: setup
	mkdir -p $(BENCH_DIR)
	for b in $(BENCHES); do \
	  $(BIN)/thinkmem bench $$b --quick --json $(BENCH_DIR)/$$b.json \
	      --plot $(BENCH_DIR)/$$b.png || exit 1; done
	$(BIN)/python -m thinkmem_ros.bench.summary $(BENCH_DIR)/*.json > $(BENCH_DIR)/RESULTS.md

bench: setup
	mkdir -p $(BENCH_DIR)
	for b in $(BENCHES); do \
	  $(BIN)/thinkmem bench $$b --json $(BENCH_DIR)/$$b.json \
	      --plot $(BENCH_DIR)/$$b.png || exit 1; done
	$(BIN)/python -m thinkmem_ros.bench.summary $(BENCH_DIR)/*.json > $(BENCH_DIR)/RESULTS.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
