# fleethealth — build, test and run targets. See README.md and docs/ for what each command does.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
SERVICES := scripts/services.sh
SLURM_CONF_FILE := $(CURDIR)/.services/slurm/slurm.conf
# What the tests read to find the real services (see tests/services.py).
TEST_ENV := FLEETHEALTH_REQUIRE_SERVICES=1 \
	FLEETHEALTH_KAFKA=127.0.0.1:9092 \
	FLEETHEALTH_PROMETHEUS=http://127.0.0.1:9090 \
	SLURM_CONF=$(SLURM_CONF_FILE)
PYTEST_ARGS ?=
# Two pytest-xdist workers (the CI machine has 2 cores, and most tests wait on Kafka, Prometheus,
# Slurm or a child process), a test file to one worker (its module fixtures are built once); the Slurm
# tests take turns through a lock (tests/conftest.py). PYTEST_XDIST= runs the suite serially.
PYTEST_XDIST ?= -n 2 --dist loadfile

.PHONY: help venv deps services-up services-down services-status lint test bench demo

help:
	@echo "make venv            create .venv and install fleethealth with dev extras"
	@echo "make deps            apt-get install the service packages that are missing"
	@echo "make services-up     start Kafka, Prometheus, Slurm (scripts/services.sh up)"
	@echo "make services-down   stop them"
	@echo "make lint            ruff + mypy"
	@echo "make test            venv, deps, services up, lint, pytest -n 2, services down (PYTEST_ARGS=..., PYTEST_XDIST= serial)"
	@echo "make bench           benchmark table"
	@echo "make demo            the replay demo on the embedded bus"

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@if [ ! -x $(VENV)/bin/python ]; then \
		if command -v $(PYTHON) >/dev/null; then $(PYTHON) -m venv $(VENV); else python3 -m venv $(VENV); fi; \
	fi
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $@

deps:
	@$(SERVICES) deps

services-up: deps
	@$(SERVICES) up all
	@$(SERVICES) env

services-down:
	@$(SERVICES) down all

services-status:
	@$(SERVICES) status all

lint: venv
	@rc=0; \
	echo "ruff check ."; $(VENV)/bin/ruff check . || rc=1; \
	echo "mypy"; $(VENV)/bin/mypy || rc=1; \
	exit $$rc

# Starts the services this run needs, runs lint and the whole suite, and stops only the services it
# started itself (even when a step fails). Lint runs beside the services' start and the suite (it needs
# neither; mypy is a minute of one core) and its output comes after pytest's. The exit code is
# pytest's; if pytest passed, lint's.
test: venv deps
	@started="$$(mktemp)"; lintlog="$$(mktemp)"; lintpid=""; \
	cleanup() { \
		if [ -n "$$lintpid" ]; then wait "$$lintpid" 2>/dev/null || true; fi; \
		if [ -s "$$started" ]; then $(SERVICES) down $$(sort -u "$$started" | tr '\n' ' ') || true; fi; \
		rm -f "$$started" "$$lintlog"; \
	}; \
	trap cleanup EXIT; trap 'exit 130' INT TERM; \
	$(MAKE) --no-print-directory lint >"$$lintlog" 2>&1 & lintpid=$$!; \
	$(SERVICES) up all --started-file "$$started" || exit $$?; \
	rc=0; $(TEST_ENV) $(VENV)/bin/pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS) || rc=$$?; \
	lint=0; wait "$$lintpid" || lint=$$?; lintpid=""; cat "$$lintlog"; \
	if [ $$rc -eq 0 ] && [ $$lint -ne 0 ]; then echo "make test: tests passed but lint failed"; rc=$$lint; fi; \
	exit $$rc

bench: venv
	@if [ -f benchmarks/__main__.py ]; then $(VENV)/bin/python -m benchmarks; \
	elif [ -f benchmarks/run_all.py ]; then $(VENV)/bin/python benchmarks/run_all.py; \
	else echo "no benchmarks yet (benchmarks/run_all.py)"; fi

demo: venv
	$(VENV)/bin/fleethealth demo
