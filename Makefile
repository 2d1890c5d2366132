# yuzu: two commands. `make run` serves with embedded defaults (SQLite, in-memory channel layer,
# in-process worker, a local agent); `make test` runs ruff, mypy and the suite. Set YUZU_DATABASE_URL and
# YUZU_REDIS_URL to use PostgreSQL, Redis and separate Celery workers instead.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MCP_VENV := .venv-mcp

.PHONY: run test fuzz deps test-deps clean

run: deps
	$(PY) manage.py migrate --noinput -v0
	$(PY) manage.py bootstrap
	$(PY) manage.py serve

test: test-deps
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest $(PYTEST_ARGS)

# The adversarial suite's full runs (docs/security.md): the fuzz and the approval properties at full counts
# in-process (the full counts outlast pytest.ini's 300 s per test on a loaded machine), then the same
# generators and schemathesis against a real daphne (bench/fuzz/). Minutes.
fuzz: test-deps
	YUZU_FUZZ=full $(PY) -m pytest tests/yuzu/test_fuzz.py tests/approvals/test_approval_properties.py -q --timeout 3600 $(PYTEST_ARGS)
	$(PY) bench/fuzz/run.py --json var/fuzz-last.json

deps: $(VENV)/.installed

test-deps: deps $(VENV)/.test-installed $(MCP_VENV)/.installed tests/ts-client/node_modules/.installed
	@$(PY) tests/support/system_deps.py

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	touch $@

$(VENV)/.test-installed: requirements-test.txt $(VENV)/.installed
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-test.txt
	touch $@

# The official MCP Python client lives in its own environment: its import name `mcp` clashes with
# this project's `mcp` app (see docs/development.md).
$(MCP_VENV)/.installed: tests/mcp_client/requirements.txt
	test -x $(MCP_VENV)/bin/python || $(PYTHON) -m venv $(MCP_VENV)
	$(MCP_VENV)/bin/python -m pip install -q --disable-pip-version-check -r tests/mcp_client/requirements.txt
	touch $@

tests/ts-client/node_modules/.installed: tests/ts-client/package.json tests/ts-client/package-lock.json
	cd tests/ts-client && npm ci --silent --no-audit --no-fund
	touch $@

clean:
	rm -rf $(VENV) $(MCP_VENV) tests/ts-client/node_modules var
