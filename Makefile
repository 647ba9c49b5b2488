# The two newcomer commands: `make demo` and `make test`. Both set up .venv first.
PY := .venv/bin/python
PYTEST := $(PY) -m pytest

.PHONY: setup demo test test-fast test-torch lint bench bench-quick bench-objstore bench-objstore-quick clean

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

# The torch-facing suites (DCP, its conformance, manager, CLI, the store contract, the
# private torch names) on another torch release, in a venv of its own:
# `make test-torch TORCH=2.14.1` builds .venv-torch-2.14.1 (tools/setup.sh with VENV and
# TORCH) and runs them there.
TORCH_SUITES := tests/dcp tests/dcp_conformance tests/manager tests/cli \
	tests/stores/test_conformance.py tests/test_torch_range.py
test-torch:
	@test -n "$(TORCH)" || { echo "usage: make test-torch TORCH=<version>, e.g. 2.14.1" >&2; exit 2; }
	VENV=.venv-torch-$(TORCH) TORCH=$(TORCH) bash tools/setup.sh
	.venv-torch-$(TORCH)/bin/python -m pytest -q --durations=10 $(TORCH_SUITES)

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
	rm -rf .venv .venv-torch-* tools/node_modules .pytest_cache .mypy_cache .ruff_cache
