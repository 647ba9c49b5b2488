"""docs/dcp.md's example runs as written: ``dcp.async_save`` through a persistent
``ckptstore.writer`` on 2 torchrun processes, in the thread mode, then resumed in the
process mode; every step committed and verified."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from ckptstore.engine.catalog import committed_steps
from ckptstore.engine.verify import verify_checkpoint
from ckptstore.stores.local import LocalStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "dcp.md")


def blocks(lang: str) -> list[str]:
    with open(DOC, encoding="utf-8") as f:
        return re.findall(rf"^```{lang}\n(.*?)^```$", f.read(), flags=re.S | re.M)


def test_doc_blocks_are_the_ones_this_test_runs() -> None:
    assert [code.splitlines()[0] for code in blocks("python")] == ["# train_dcp.py"]
    (bash,) = blocks("bash")
    assert bash.splitlines() == [
        "torchrun --nproc-per-node 2 train_dcp.py --steps 4",
        "torchrun --nproc-per-node 2 train_dcp.py --steps 2 --mode process",
    ]


@pytest.mark.distributed
def test_async_save_example_commits_and_resumes(tmp_path) -> None:
    (tmp_path / "train_dcp.py").write_text(blocks("python")[0])
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    outputs = []
    for line in blocks("bash")[0].splitlines():
        argv = shlex.split(line)
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", *argv[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        outputs.append(proc.stdout)
    assert "committed steps: [1, 2, 3, 4]" in outputs[0]
    assert "resumed from step 4" in outputs[1]
    assert "committed steps: [1, 2, 3, 4, 5, 6]" in outputs[1]
    root = LocalStore(str(tmp_path / "checkpoints" / "dcp-run"))
    assert list(committed_steps(root)) == [1, 2, 3, 4, 5, 6]
    assert verify_checkpoint(root.child("step_000000006")).ok
