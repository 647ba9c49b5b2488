# The two newcomer commands: `make demo` and `make test`. Both set up .venv first.
PY := .venv/bin/python
PYTEST := $(PY) -m pytest

.PHONY: setup demo test test-fast test-torch lint bench bench-quick bench-objstore bench-objstore-quick clean

setup:
	bash tools/setup.sh

demo: setup
	$(PY) tools/demo.py

# Everything: server and multi-process tests included (what CI runs), on two workers
# (pytest-xdist: a file is one unit of work, the files with long tests first: conftest.py),
# then the few tests marked `alone` (they read machine-wide state) with nothing beside them.
# Both runs run; either failing fails the target.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder
# The files holding `alone` tests, so the second run collects those alone (not the suite).
ALONE_FILES = $(shell grep -rl "mark\.alone" tests plugins --include='test_*.py')
test: setup
	s=0; $(PYTEST) -q $(XDIST) -m "not alone" --durations=25 || s=1; \
	$(PYTEST) -q -m alone $(ALONE_FILES) || s=1; exit $$s

# The quick inner loop (under a minute on 2 cores, two workers): every test that runs in
# the pytest process alone -- no object-store server, no torch.distributed group, no child
# process (writer processes, kill -9 runs, script and CLI subprocesses), nothing slow.
# `make test` runs all.
test-fast: setup
	$(PYTEST) -q $(XDIST) -m "not server and not distributed and not processes and not slow"

# The torch-facing suites (DCP, its conformance, manager, CLI, the store contract, the
# private torch names, the compatibility matrix, the framework plugins) on each tested
# torch release, each in a venv of its own: `make test-torch` runs them on every release
# (TORCH_TESTED, tests/test_torch_range.py's TESTED); `make test-torch TORCH=2.15.0` on one.
# make setup's release runs in .venv, another in .venv-torch-<release> (tools/setup.sh with
# VENV and TORCH; 2.14.1 and 2.15.0 are CUDA builds, ~7 GB each, run on the CPU). Every
# release runs even if one fails.
TORCH_TESTED := 2.13.0 2.14.1 2.15.0
TORCH_SUITES := tests/dcp tests/dcp_conformance tests/manager tests/cli \
	tests/stores/test_conformance.py tests/test_torch_range.py tests/compat \
	plugins/lightning/tests plugins/hf/tests plugins/torchtitan/tests
test-torch:
	@failed=""; for v in $(or $(TORCH),$(TORCH_TESTED)); do \
	  venv=.venv-torch-$$v; grep -qx "torch==$$v" tools/constraints.txt && venv=.venv; \
	  echo "== torch $$v ($$venv)"; \
	  VENV=$$venv TORCH=$$v bash tools/setup.sh && \
	  $$venv/bin/python -m pytest -q --durations=10 $(TORCH_SUITES) || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "torch-facing suites failed on torch$$failed" >&2; exit 1; fi

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
