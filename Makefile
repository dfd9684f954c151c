# Opsdeck: `make run` starts the product on embedded defaults, `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
VAR := $(or $(OPSDECK_VAR_DIR),var)

.PHONY: run test lint format bench vendor stop clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt $(VENV)/.installed
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

run: export DEBUG = 1
run: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_specs specs/
	scripts/sandbox.sh start
	@printf '{"ACCESS_KEY_ID": "sandbox", "ACCESS_SECRET_KEY": "sandbox"}' > $(VAR)/sandbox/credentials.json
	$(PY) manage.py add_cell --name sandbox --kubeconfig $(VAR)/sandbox/kubeconfig --region local \
		--cloud sandbox --backup-destination s3://sandbox/opsdeck \
		--backup-credentials $(VAR)/sandbox/credentials.json --default
	$(PY) manage.py seed_demo
	@echo
	@echo "Opsdeck is starting at http://127.0.0.1:$(PORT)/ (Ctrl-C stops it)"
	@echo
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho start --procfile Procfile --port $(PORT)

test: $(VENV)/.installed-dev
	$(PY) -m pytest

# Speed figures, printed next to baselines measured in the same run (not pass/fail).
bench: $(VENV)/.installed-dev
	$(PY) -m sandbox.bench
	$(PY) -m deployments.workflow.evaluator_bench
	DEBUG=1 $(PY) manage.py bench_operations

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Refresh static/vendor/ (htmx, Pico CSS) from the npm registry.
vendor:
	scripts/vendor.sh

# Stop the sandbox cluster, and the embedded PostgreSQL and Redis if `make run` started them.
stop:
	@scripts/sandbox.sh stop
	@if [ -f $(VAR)/redis/redis.pid ]; then kill $$(cat $(VAR)/redis/redis.pid) || true; fi
	@if [ -f $(VAR)/postgres/postmaster.pid ]; then \
		kill $$(head -1 $(VAR)/postgres/postmaster.pid) || true; fi

# Everything make run created, the database and its keys included.
clean: stop
	@if [ -x $(PY) ] && [ -f $(VAR)/encryption_key ]; then \
		DEBUG=1 $(PY) manage.py drop_dev_database || true; fi
	rm -rf $(VENV) $(VAR)
