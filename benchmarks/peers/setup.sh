#!/usr/bin/env bash
# Creates benchmarks/peers/.venv: torch (CPU build), ckptstore (editable, this checkout) and
# the data loaders it is measured against, for benchmarks/data/vs_peers.py, and the seed's
# own system (databricks-sdk-air) for benchmarks/peers/air_bench.py. Kept apart
# from the project's .venv on purpose: mosaicml-streaming and litdata pin other versions of
# numpy and friends than the project's tests run with. Idempotent (a stamp of the inputs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$here/.venv"
PY=${PYTHON:-python3}
stamp="$venv/.peers-setup"
want=$(cat "$here/requirements.txt" "$repo/tools/constraints.txt" "$repo/pyproject.toml" | sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv is up to date"
  exit 0
fi
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
pip=("$venv/bin/pip" install -q -c "$repo/tools/constraints.txt")
# torch first, alone: the CPU build on this machine's disk (an unpinned one pulls CUDA).
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -r "$here/requirements.txt"
"${pip[@]}" --no-deps -e "$repo"
# PyPI's torchvision (pulled by litdata) links CUDA torch libraries that the CPU torch here
# lacks, so importing it fails; neither peer needs it for token rows or raw bytes.
"$venv/bin/pip" uninstall -q -y torchvision || true
(cd "$repo" && "$venv/bin/python" - <<'PY'
import importlib
from benchmarks.peers.contenders import import_streaming
import_streaming()
for name in ("torch", "ckptstore.data", "litdata", "pyarrow", "s3fs", "databricks.air.data"):
    importlib.import_module(name)
print("peers venv ok")
PY
)
echo "$want" > "$stamp"
