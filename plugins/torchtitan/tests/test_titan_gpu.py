"""torchtitan's own training loop end to end (``torchrun -m torchtitan.train``, its llama3
debug model, one GPU), checkpointed through ckptstore by a config registry a user would
write (titan_gpu_config.py): a run of 4 steps commits steps 2 and 4 (async), a second run
resumes from step 4 and commits 6. torchtitan's training loop needs an accelerator and
its data dependencies (datasets, tokenizers, torchdata: not installed by tools/setup.sh,
whose fsspec they would downgrade) and its repository's test assets (the tokenizer and
``c4_test``): set TORCHTITAN_REPO to a torchtitan 0.3 checkout; skipped otherwise."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import ckptstore

REPO = os.environ.get("TORCHTITAN_REPO", "")
_MISSING = [m for m in ("datasets", "tokenizers", "torchdata") if not importlib.util.find_spec(m)]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.processes,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torchtitan's trainer needs CUDA"),
    pytest.mark.skipif(bool(_MISSING), reason=f"torchtitan's trainer needs {_MISSING}"),
    pytest.mark.skipif(
        not os.path.isdir(os.path.join(REPO, "tests", "assets")),
        reason="set TORCHTITAN_REPO to a torchtitan checkout (its tests/assets)",
    ),
]


def _train(folder: str, steps: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(
        os.environ,
        CKPTSTORE_TITAN_FOLDER=folder,
        PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
    cmd += ["-m", "torchtitan.train", "--module", "titan_gpu_config"]
    cmd += ["--config", "llama3_debugmodel_ckptstore", "--training.steps", str(steps)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_torchtitan_debug_model_trains_saves_and_resumes(tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    _train(folder, 4)
    root = ckptstore.open_store(folder)
    assert list(ckptstore.committed_steps(root)) == [2, 4]
    # a fresh start would save step 2 again and be refused (it is committed): the run
    # resumed from step 4
    _train(folder, 6)
    assert list(ckptstore.committed_steps(root)) == [2, 4, 6]
