# The two newcomer commands: `make demo` and `make test`. Both set up .venv first.
PY := .venv/bin/python
PYTEST := $(PY) -m pytest

.PHONY: setup demo test test-fast lint bench bench-quick bench-objstore bench-objstore-quick clean

setup:
	bash tools/setup.sh

demo: setup
	$(PY) tools/demo.py

# Everything: server and multi-process tests included (what CI runs).
test: setup
	$(PYTEST) -q --durations=25

# The quick inner loop (~1-2 min on 2 cores): every test that runs in the pytest process
# alone -- no object-store server, no torch.distributed group, no child process (writer
# processes, kill -9 runs, script and CLI subprocesses), nothing slow. `make test` runs all.
test-fast: setup
	$(PYTEST) -q -m "not server and not distributed and not processes and not slow"

lint: setup
	$(PY) -m ruff check ckptstore plugins tests benchmarks tools examples
	$(PY) -m ruff format --check ckptstore plugins tests benchmarks tools examples
	$(PY) -m mypy
	$(PY) -m mypy --python-version 3.10
	PYTHONPATH=. .venv/bin/lint-imports

# The benchmark suite (benchmarks/suite/, scenarios in benchmarks/suite/config.py); it
# starts its own SeaweedFS. Results: benchmarks/results/<config>-<time>/ (JSON, report, PNGs).
bench: setup
	PYTHONPATH=. $(PY) -m benchmarks.suite --config full

# Small version of the same: under 5 minutes on 2 cores.
bench-quick: setup
	PYTHONPATH=. $(PY) -m benchmarks.suite --config quick

# S3 (a SeaweedFS it starts), direct and through a shaped link; ~20 min here, --quick a few.
bench-objstore: setup
	PYTHONPATH=. $(PY) -m benchmarks.objstore.save_load

bench-objstore-quick: setup
	PYTHONPATH=. $(PY) -m benchmarks.objstore.save_load --quick

clean:
	rm -rf .venv tools/node_modules .pytest_cache .mypy_cache .ruff_cache
