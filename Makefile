# Strata: `make run` starts a single-node broker, `make test` runs the test suite.
# Both set up everything they need (virtualenv, Python and Debian packages) on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast bench-log bench-clients venv system-deps kafka-dist clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(STAMP)

# Debian packages the tests use (kcat is used once the broker exists). Skipped when present.
system-deps:
	@bash scripts/system-deps.sh

# Apache Kafka 4.x jars from Maven Central (for DumpLogSegments and the CLI tools).
kafka-dist:
	@bash scripts/kafka-dist.sh >/dev/null || echo "kafka-dist: not installed (Java/Maven missing?); Kafka tool tests will be skipped"

run: venv
	$(VENV)/bin/strata serve --config config/server.properties

test: venv system-deps kafka-dist
	$(VENV)/bin/pytest -q

test-fast: venv
	$(VENV)/bin/pytest -q -m "not slow"

bench-log: venv
	$(PY) -m strata.bench.log_bench

# Kafka clients against a Strata broker it starts (confluent-kafka and Kafka's perf tools).
bench-clients: venv kafka-dist
	$(PY) -m strata.bench.client_bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
