"""Accelerate ``save_state`` / ``load_state`` hooks on 2 CPU gloo processes.

Real runs of ``accelerate_job.py`` under Accelerate's own launcher: rank 1 killed -9 inside
the third ``save_state`` upload, then ``prepare_resume`` + ``load_state`` on every process
resumes exactly (model, Adam, StepLR, the loop's own counter, the next folder number).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("accelerate")

from tests.plugins.util import assert_equal_tree, committed, run_job, statuses  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))  # the job scripts' folder


def accelerate(tmp: str, root: str, until: int, *extra: str):
    argv = [os.path.join(HERE, "accelerate_job.py"), "--project", f"{tmp}/proj", "--root", root]
    argv += ["--until", str(until), "--record", f"{tmp}/record.pt", *extra]
    return run_job(argv, accelerate=2, timeout=150)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = str(tmp_path_factory.mktemp("acc-ref"))
    proc = accelerate(tmp, f"{tmp}/root", 8)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(f"{tmp}/record.pt", weights_only=False)


def test_rank_killed_mid_save_state_then_load_state_resumes_exactly(
    tmp_path, root_url, reference
) -> None:
    tmp = str(tmp_path)
    assert reference["world"] == 2
    # save_state #3 (checkpoint_2, after step 6): rank 1 dies once its shards are durable.
    proc = accelerate(tmp, root_url, 8, "--crash-at", "after_shards:3", "--crash-rank", "1")
    assert proc.returncode != 0, proc.stderr[-4000:]
    st = statuses(root_url)
    assert st[1] == "committed" and st.get(2) != "committed", st

    proc = accelerate(tmp, root_url, 8, "--resume")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rec = torch.load(f"{tmp}/record.pt", weights_only=False)
    local = os.path.join(tmp, "proj", "checkpoints")
    assert rec["path"] == os.path.join(local, "checkpoint_1")
    assert rec["start"] == (4, 2)  # the loop's counter, and the next automatic folder number
    assert_equal_tree(rec["start_state"], reference["by_step"][4])
    assert_equal_tree(rec["by_step"][8], reference["by_step"][8])
    # Accelerate's own copy of the uncommitted checkpoint_2 was moved aside, not deleted.
    assert "checkpoint_2" in os.listdir(os.path.join(tmp, "proj", ".ckptstore-uncommitted"))
    assert committed(root_url) == [1, 2, 3]  # KeepLast(3); the torn 2 was redone
