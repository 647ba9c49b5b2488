# The two newcomer commands: `make demo` and `make test`. Both set up .venv first.
PY := .venv/bin/python
PYTEST := $(PY) -m pytest

.PHONY: setup demo test test-fast lint bench bench-quick clean

setup:
	bash tools/setup.sh

demo: setup
	$(PY) tools/demo.py

# Everything: server and multi-process tests included (what CI runs).
test: setup
	$(PYTEST) -q

# The quick inner loop: no servers, no multi-process groups, nothing slow.
test-fast: setup
	$(PYTEST) -q -m "not server and not distributed and not slow"

lint: setup
	$(PY) -m ruff check ckptstore tests benchmarks tools plugins examples
	$(PY) -m ruff format --check ckptstore tests benchmarks tools plugins examples
	$(PY) -m mypy

bench: setup
	$(PY) benchmarks/bench_local.py

bench-quick: setup
	$(PY) benchmarks/bench_local.py --quick

clean:
	rm -rf .venv tools/node_modules .pytest_cache .mypy_cache .ruff_cache
