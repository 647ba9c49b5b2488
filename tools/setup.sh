#!/usr/bin/env bash
# Creates .venv with everything `make test` / `make demo` need, on a fresh machine.
# Idempotent: re-running only installs what changed (a stamp records the inputs' hash).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=.venv/.ckptstore-setup
# The inputs' contents and their paths (an editable install points at its folder: a moved
# plugin or harness must be installed again).
inputs="tools/requirements-dev.txt tools/constraints.txt pyproject.toml plugins/*/pyproject.toml
  tools/ckptstore-harness/pyproject.toml tools/package.json"
want=$( (echo $inputs; cat $inputs) | sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip warns once per package about each configured local index folder that does not hold
# it ("Location 'file:///...' is ignored: it is neither a file nor a directory"): about a
# hundred lines that say nothing about this project's setup. Everything else pip says stays.
pip() {
  .venv/bin/pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
pip install -q --upgrade pip
# torch first, pinned to the CPU build on this machine's disk (an unpinned torch pulls CUDA).
pip install -q -c tools/constraints.txt "torch==2.13.0"
pip install -q -c tools/constraints.txt -r tools/requirements-dev.txt
pip install -q -c tools/constraints.txt --no-deps -e .
# torchtitan, for the torchtitan plugin, without its training loop's dependencies: its
# datasets<4.8 pins fsspec below what s3fs/gcsfs here need. The parts the plugin and its
# tests import (checkpointer, optimizer and LR containers) need tyro
# (requirements-dev.txt) and spmd_types only; pip check below allows its other requirements.
pip install -q -c tools/constraints.txt --no-deps "torchtitan==0.3.0" "spmd_types==0.2.3"
# The framework plugins, each its own distribution (plugins/*), after the core they pin.
pip install -q -c tools/constraints.txt --no-deps -e plugins/lightning -e plugins/hf \
  -e plugins/torch_checkpointing \
  -e plugins/torchtitan
# torch_checkpointing's own storage tests: its sdist ships them (its wheel does not);
# plugins/torch_checkpointing/tests/test_upstream_storage.py runs them from here.
tc=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch-checkpointing"))')
if [ ! -d ".venv/peer-tests/torch_checkpointing-$tc/tests" ]; then
  pip download -q --no-deps --no-binary :all: -d .venv/peer-tests "torch-checkpointing==$tc"
  tar xzf ".venv/peer-tests/torch_checkpointing-$tc.tar.gz" -C .venv/peer-tests
fi
# The test harness (tools/ckptstore-harness): a dev-only distribution the tests, benchmarks and demo import.
pip install -q -c tools/constraints.txt --no-deps -e tools/ckptstore-harness
broken=$(.venv/bin/pip check | grep -v -e "^torchtitan 0.3.0 requires " -e "^No broken" || true)
if [ -n "$broken" ]; then
  echo "$broken" >&2
  exit 1
fi
# Azurite (Microsoft's Azure Blob emulator) for the Azure tests.
if command -v npm >/dev/null 2>&1; then
  (cd tools && npm install --no-audit --no-fund --loglevel=error >/dev/null)
else
  echo "warning: npm not found; Azure tests will be skipped" >&2
fi
echo "$want" > "$stamp"
