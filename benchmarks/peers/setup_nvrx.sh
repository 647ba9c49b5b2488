#!/usr/bin/env bash
# Creates benchmarks/peers/.nvrx-venv for benchmarks/peers/nvrx_local.py: torch (CPU build),
# nvidia-resiliency-ext 0.4.1 and ckptstore's own dependencies (ckptstore itself is imported
# from this checkout through PYTHONPATH). A venv of its own, not benchmarks/peers/.venv: it is
# a separate comparison and the data loaders' pins were not checked against it. Never run by
# CI (CI runs no benchmark). Idempotent (a stamp of the inputs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$here/.nvrx-venv"
PY=${PYTHON:-python3}
stamp="$venv/.nvrx-setup"
want=$( (cat "$0" "$repo/tools/constraints.txt" "$repo/pyproject.toml") | sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv is up to date"
  exit 0
fi
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
pip=("$venv/bin/pip" install -q -c "$repo/tools/constraints.txt")
# torch first, alone: the CPU build on this machine's disk (an unpinned one pulls CUDA).
"${pip[@]}" "torch==2.13.0"
# numpy: nvidia_resiliency_ext.checkpointing.utils imports it but 0.4.1 does not declare it.
"${pip[@]}" "nvidia-resiliency-ext==0.4.1" numpy "crc32c>=2.4" "fsspec>=2024.6"
(cd "$repo" && PYTHONPATH="$repo" "$venv/bin/python" -c '
import benchmarks.peers.nvrx_rank, ckptstore.manager
print("nvrx venv ok")')
echo "$want" > "$stamp"
