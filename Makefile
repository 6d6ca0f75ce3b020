# Two commands for a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: run test test-fast lint clean sandbox-aws sandbox-kube

# Errors only: pip's warnings are the build backend's notes to packagers (setuptools' "Editable
# installation" banner), nothing a user acts on; a failing install still prints why.
PIP_QUIET := --quiet --quiet

$(BIN)/python:
	@echo "Creating $(VENV) with $(PYTHON)…"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	@echo "Installing rtui with Ray, PyTorch (CPU) and transformers into $(VENV): a few minutes the first time…"
	$(BIN)/python -m pip install $(PIP_QUIET) -e '.[local]'
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	@echo "Installing rtui with its test tools into $(VENV): a few minutes the first time…"
	$(BIN)/python -m pip install $(PIP_QUIET) -e '.[local,dev]'
	touch $@ $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/rtui --target local

# The real wizard against the test suite's AWS and Kubernetes doubles: no account, nothing billed.
sandbox-aws: $(STAMP_DEV)
	$(BIN)/python -m sandbox aws

sandbox-kube: $(STAMP_DEV)
	$(BIN)/python -m sandbox kube

# Two pytest workers: the tests that start a real Ray cluster or a tmux terminal form one group that
# runs on one worker, one at a time as before (two Ray clusters on two cores would starve each other's
# deadlines); everything else (moto, the Kubernetes emulator, Pilot) is spread over both.
# `make test TEST_WORKERS=0` runs it all in one process, in order.
TEST_WORKERS ?= 2

# The suite starts hundreds of Python processes that import rtui (the `rtui` binary, bench scripts, the
# sandbox) and each pytest worker rewrites every test module: with PYTHONDONTWRITEBYTECODE set (as
# some machines and container images do), each compiles it all anew. Measured on 2 cores from a tree
# without bytecode: collecting every test 18.2 s -> 11.2 s, tests/test_cli_errors.py with
# test_cli_help.py 47.6 s -> 38.9 s. The bytecode goes to __pycache__ dirs, which git ignores.
TEST_ENV := PYTHONDONTWRITEBYTECODE=

test: $(STAMP_DEV)
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider --durations=20 -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# While developing: a subset that runs in under 2 minutes on 2 cores (measured in the closing note of
# issue 37). It leaves out the tests that start a real Ray cluster, drive tmux or make local cluster
# dirs under /tmp, those marked slow (over ~3 s each), and the aws and kube targets' tests on their
# server doubles (mark `doubles`, set in tests/conftest.py); `make test` stays the whole suite, and is
# what CI and the README run.
FAST := not ray and not tmux and not host_clusters and not slow and not doubles

test-fast: $(STAMP_DEV)
	$(TEST_ENV) $(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 -n $(TEST_WORKERS) -m "$(FAST)" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

lint: $(STAMP_DEV)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV)
