# Two entry points for humans and CI: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo screenshots test unit lint llama-server bench conformance conformance-ci clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamps: reinstall only when pyproject.toml changes.
$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.runtime

$(VENV)/.conformance: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,conformance]'
	touch $@ $(VENV)/.test $(VENV)/.runtime

$(VENV)/.bench: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $@ $(VENV)/.test $(VENV)/.runtime

demo: $(VENV)/.runtime
	$(BIN)/tokengate console --demo

# SVGs of the console running the demo, time-lapsed (~20 s): into screenshots/.
screenshots: $(VENV)/.runtime
	$(BIN)/python -m console.screenshots

# Builds llama-server from source on a cold cache (~9 min on 2 cores), then reuses it.
llama-server:
	bash tests/llama/build_llama_server.sh

# promtool checks and unit-tests deploy/prometheus/tokengate-rules.yml (installed when missing).
test: $(VENV)/.test
	bash deploy/prometheus/ensure_promtool.sh >/dev/null
	bash tests/redis/ensure_redis.sh >/dev/null
	LLAMA_SERVER_BIN="$${LLAMA_SERVER_BIN:-$$(bash tests/llama/build_llama_server.sh | tail -n 1)}" \
		$(BIN)/pytest $(PYTEST_ARGS)

# llama.cpp's own server test suite (tools/server/tests of the llama.cpp llama-server is built
# from) straight and through `tokengate serve`, compared per test: fails on a test that passes
# straight and fails through the gate unless tests/conformance/differences.toml lists it with its
# reason. Prints the counts (the README's "Conformance" figures). CONFORMANCE_ARGS: e.g. -- -k metrics
conformance: $(VENV)/.conformance
	LLAMA_SERVER_BIN="$${LLAMA_SERVER_BIN:-$$(bash tests/llama/build_llama_server.sh | tail -n 1)}" \
		$(BIN)/python -m tests.conformance.run $(CONFORMANCE_ARGS)

# CI's conformance (.ci/run): the gate side only, against the straight outcomes stored in
# tests/conformance/baseline.json (~5-10 min on 2 cores instead of ~15-20). Fails on an
# undocumented difference, and on a baseline measured for another llama.cpp, suite, model or shim
# (re-measure it with `python -m tests.conformance.run --write-baseline` and commit it).
conformance-ci: $(VENV)/.conformance
	LLAMA_SERVER_BIN="$${LLAMA_SERVER_BIN:-$$(bash tests/llama/build_llama_server.sh | tail -n 1)}" \
		$(BIN)/python -m tests.conformance.run --baseline $(CONFORMANCE_ARGS)

# The lint and type gate (CI runs it before the tests): ruff's rules and format, mypy
# (strict for gate/core, the pure admission core).
lint: $(VENV)/.test
	$(BIN)/ruff check gate console tests bench
	$(BIN)/ruff format --check gate console tests bench
	$(BIN)/mypy

# The pure core and config only: seconds, no llama-server.
unit: $(VENV)/.test
	bash deploy/prometheus/ensure_promtool.sh >/dev/null
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

bench: $(VENV)/.bench
	$(BIN)/python bench/decide_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
