#!/usr/bin/env bash
# #39's GPU row in one run of under 10 minutes, on a machine with a CUDA device:
#   1. GPU -> pinned-memory staging against the bare copy_ floor, and each saver's blocking
#      time (benchmarks.checkpoint.gpu_staging, 4 GiB);
#   2. the step-rate overhead with training on the GPU, a checkpoint every 1 and 10 steps,
#      the demo model and a 1 GiB state (benchmarks.checkpoint.step_rate --device cuda).
#
#   benchmarks/gpu_row.sh [OUT_DIR]     # tables into OUT_DIR (default benchmarks/results)
#
# $PYTHON (default python3) must import torch with CUDA and ckptstore's dependencies; the
# checkout itself goes on PYTHONPATH, so nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="$PWD:$PWD/tools/ckptstore-harness${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
"$py" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_row.sh: this torch sees no CUDA device: run it on a GPU machine")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
PY
timeout 170 "$py" -m benchmarks.checkpoint.gpu_staging --size-gib 4 --saves 4 \
    | tee "$out/gpu_staging.txt"
timeout 360 "$py" -m benchmarks.checkpoint.step_rate --device cuda --world 1 \
    --models demo,sized --state-mib 1024 --blocks 2 --pairs 1 \
    --contenders "ckptstore;ckptstore-process;dcp.async_save + DefaultStager;dcp.save (blocking);rank-0 torch.save" \
    | tee "$out/step_rate_gpu.txt"
