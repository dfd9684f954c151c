# Opsdeck: `make run` starts the product on embedded defaults, `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
VAR := $(or $(OPSDECK_VAR_DIR),var)
# Finds or starts PostgreSQL and Redis, sets their URLs (and with --dev: DEBUG, keys), runs
# the command after `--` (portal/launch.py).
LAUNCH := $(PY) -m portal.launch
# Not --quiet: pip's lines are the progress of a first install (a minute or two).
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check

.PHONY: run test lint format bench vendor stop clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing requirements.txt into $(VENV)"
	$(PIP_INSTALL) -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt $(VENV)/.installed
	@echo "Installing requirements-dev.txt into $(VENV)"
	$(PIP_INSTALL) -r requirements-dev.txt
	touch $@

# scripts/run.sh: migrate, start the sandbox cell, load the plans (and with STRIPE_EMULATOR=1
# the Stripe emulator and its catalog), seed the demo, honcho.
run: $(VENV)/.installed
	PORT=$(PORT) $(LAUNCH) --dev -- scripts/run.sh

# PYTEST_ADDOPTS="tests/portal" make test runs a part of the suite. TEST_WORKERS processes
# share the tests a module at a time (most tests wait on a server, a worker or a browser, so
# more processes than cores pay; but past three on two cores, each test's servers and workers
# poll for longer than the waits saved); TEST_WORKERS=0 runs them in this one.
TEST_WORKERS ?= 3
# Bytecode is written (into __pycache__, which git ignores) even where PYTHONDONTWRITEBYTECODE
# is set: the suite starts many processes (workers, servers, commands), each of which
# would otherwise compile every module of the project anew, and each test process would
# rewrite every test module's assertions anew on every run.
test: $(VENV)/.installed-dev
	PYTHONDONTWRITEBYTECODE= $(LAUNCH) -- $(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope

# Speed figures, printed next to baselines measured in the same run (not pass/fail), and kept
# machine-readable in var/bench.json. The plan spec is an argument: the bench/ tooling names no
# operator. BENCH_SPEC=specs/valkey.yaml make bench measures the other plan.
BENCH_SPEC ?= specs/postgres-cnpg.yaml
bench: $(VENV)/.installed-dev
	$(PY) -m sandbox.bench
	$(PY) -m bench.evaluator $(BENCH_SPEC)
	$(LAUNCH) --dev -- $(PY) -m bench.operations $(BENCH_SPEC)
	$(LAUNCH) --dev -- $(PY) -m bench.scale $(BENCH_SPEC)
	$(LAUNCH) --dev -- $(PY) -m bench.metering $(BENCH_SPEC)
	$(LAUNCH) --dev -- $(PY) -m bench.admin_lists $(BENCH_SPEC)
	$(LAUNCH) --dev -- $(PY) -m bench.meter_events

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Refresh static/vendor/ (htmx, Pico CSS, Chart.js) from the npm registry.
vendor:
	scripts/vendor.sh

# Stop `make run`'s web server and workers (honcho, when it still runs: in the background or
# another terminal), the sandbox cluster, the Stripe emulator, and the embedded PostgreSQL and
# Redis if `make run` started them; each returns once its process has exited.
stop:
	@scripts/stop.sh $(VAR)/honcho.pid INT honcho
	@scripts/sandbox.sh stop
	@scripts/stripe_emulator.sh stop
	@scripts/stop.sh $(VAR)/redis/redis.pid
	@scripts/stop.sh $(VAR)/postgres/postmaster.pid INT

# Everything make run created, the database and its keys included (the database first, while
# its server still runs).
clean:
	@if [ -x $(PY) ] && [ -f $(VAR)/encryption_key ]; then \
		$(LAUNCH) --dev -- $(PY) manage.py drop_dev_database || true; fi
	@$(MAKE) --no-print-directory stop
	rm -rf $(VENV) $(VAR)
