# Opsdeck: `make run` starts the product on embedded defaults, `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: run test lint format vendor stop clean

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
	$(PY) manage.py seed_demo
	@echo
	@echo "Opsdeck is starting at http://127.0.0.1:$(PORT)/ (Ctrl-C stops it)"
	@echo
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/honcho start --procfile Procfile --port $(PORT)

test: $(VENV)/.installed-dev
	$(PY) -m pytest

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Refresh static/vendor/ (htmx, Pico CSS) from the npm registry.
vendor:
	scripts/vendor.sh

# Stop the embedded PostgreSQL and Redis that `make run` may have started under var/.
stop:
	-test -f var/redis/redis.pid && kill $$(cat var/redis/redis.pid)
	-test -f var/postgres/postmaster.pid && kill $$(head -1 var/postgres/postmaster.pid)

clean: stop
	rm -rf $(VENV) var
