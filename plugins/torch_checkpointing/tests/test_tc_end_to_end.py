"""torch_checkpointing's CheckpointManager (async save, in its saver process) saving and
loading a small model through CkptStoreStorage on S3 (SeaweedFS) and on a volume, 2 gloo
ranks: each rank loads back bitwise what it saved, and the checkpoint is under its final
name only (the temp directory renamed: server-side copies on S3, none left)."""

import pytest
from tc_job import save_and_load

import ckptstore
from harness.dist import run_distributed


@pytest.mark.distributed
@pytest.mark.processes
def test_checkpoint_manager_round_trip(tmp_path, root_url) -> None:
    # S3's endpoint and keys reach the ranks through the environment (root_url sets it)
    results = run_distributed(save_and_load, 2, tmp_path, root_url, {}, timeout=240, daemon=False)
    for out in results:
        assert out["saved"] == out["loaded"]  # bitwise
    assert results[0]["saved"]["0.weight"] != results[1]["saved"]["0.weight"]
    files = ckptstore.open_store(root_url).find()  # no tmp_step_1 left
    assert files == [f"ckpt/step_1/{k}_{r}.pt" for k in ("model", "step") for r in (0, 1)]
