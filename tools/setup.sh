#!/usr/bin/env bash
# Creates .venv with everything `make test` / `make demo` need, on a fresh machine.
# Idempotent: re-running only installs what changed (a stamp records the inputs' hash).
# VENV and TORCH pick another folder and torch release (`make test-torch TORCH=2.14.1`
# builds .venv-torch-2.14.1 so): every pin of torch in the inputs becomes TORCH there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
pinned=$(sed -n 's/^torch==//p' tools/constraints.txt)
TORCH=${TORCH:-$pinned}
stamp=$VENV/.ckptstore-setup
# The inputs' contents and their paths (an editable install points at its folder: a moved
# plugin or harness must be installed again).
inputs="tools/requirements-dev.txt tools/constraints.txt pyproject.toml plugins/*/pyproject.toml
  tools/ckptstore-harness/pyproject.toml tools/package.json"
want=$( (echo $inputs; cat $inputs; [ "$TORCH" = "$pinned" ] || echo "torch==$TORCH") |
  sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# The requirements and constraints with torch pinned to TORCH (as they are by default).
for f in constraints requirements-dev; do
  sed "s/^torch==.*/torch==$TORCH/" "tools/$f.txt" > "$VENV/$f.txt"
done
# pip warns once per package about each configured local index folder that does not hold
# it ("Location 'file:///...' is ignored: it is neither a file nor a directory"): about a
# hundred lines that say nothing about this project's setup. Everything else pip says stays.
pip() {
  "$VENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
pip install -q --upgrade pip
# A machine may cap pip's torch (a machine-wide constraints file, as on this project's
# machines: torch<=2.14.1). Another release than the default is asked for by name and
# pinned by our own constraints below, so that cap is lifted for this venv's installs only.
if [ "$TORCH" != "$pinned" ]; then
  export PIP_CONSTRAINT=/dev/null
fi
# torch first, pinned to the build on this machine's disk (2.13.0's is CPU-only; an unpinned
# torch pulls CUDA, as 2.14.1 does here: its venv takes ~7 GB, 4 of them CUDA and triton).
pip install -q -c "$VENV/constraints.txt" "torch==$TORCH"
pip install -q -c "$VENV/constraints.txt" -r "$VENV/requirements-dev.txt"
pip install -q -c "$VENV/constraints.txt" --no-deps -e .
# torchtitan, for the torchtitan plugin, without its training loop's dependencies: its
# datasets<4.8 pins fsspec below what s3fs/gcsfs here need. The parts the plugin and its
# tests import (checkpointer, optimizer and LR containers) need tyro
# (requirements-dev.txt) and spmd_types only; pip check below allows its other requirements.
pip install -q -c "$VENV/constraints.txt" --no-deps "torchtitan==0.3.0" "spmd_types==0.2.3"
# The framework plugins, each its own distribution (plugins/*), after the core they pin.
pip install -q -c "$VENV/constraints.txt" --no-deps -e plugins/lightning -e plugins/hf \
  -e plugins/torch_checkpointing \
  -e plugins/torchtitan
# torch_checkpointing's own storage tests: its sdist ships them (its wheel does not);
# plugins/torch_checkpointing/tests/test_upstream_storage.py runs them from here.
tc=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch-checkpointing"))')
if [ ! -d "$VENV/peer-tests/torch_checkpointing-$tc/tests" ]; then
  pip download -q --no-deps --no-binary :all: -d "$VENV/peer-tests" "torch-checkpointing==$tc"
  tar xzf "$VENV/peer-tests/torch_checkpointing-$tc.tar.gz" -C "$VENV/peer-tests"
fi
# The test harness (tools/ckptstore-harness): a dev-only distribution the tests, benchmarks and demo import.
pip install -q -c "$VENV/constraints.txt" --no-deps -e tools/ckptstore-harness
broken=$("$VENV/bin/pip" check | grep -v -e "^torchtitan 0.3.0 requires " -e "^No broken" || true)
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
