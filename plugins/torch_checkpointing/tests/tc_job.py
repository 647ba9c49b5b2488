"""A rank's body for the end-to-end test (module level: harness.dist pickles it): save a
small model with torch_checkpointing's CheckpointManager through CkptStoreStorage, load it
into a zeroed copy, and return both's bytes (the test compares them)."""

from typing import Any

import torch
from torch_checkpointing.checkpoint_manager import CheckpointManager
from torch_checkpointing.config import AsyncCheckpointSaverConfig
from torch_checkpointing.staging import CheckpointStagerConfig

from ckptstore_tc import CkptStoreStorageConfig


def save_and_load(rank: int, world_size: int, tmp: Any, url: str, options: dict) -> dict:
    torch.manual_seed(100 + rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    state = {k: v.numpy().tobytes() for k, v in model.state_dict().items()}
    storage = CkptStoreStorageConfig(url, mount="/", storage_options=options)
    save = AsyncCheckpointSaverConfig(
        staging_config=CheckpointStagerConfig(use_pinned_memory=False, use_non_blocking_copy=False)
    )
    manager = CheckpointManager.Config(save=save, storage_config=storage).build()
    try:
        future = manager.save("/ckpt/step_1", {"model": model.state_dict(), "step": 1})
        if future is not None:
            future.result(timeout=120)
        torch.distributed.barrier()
        for p in model.parameters():
            p.data.zero_()
        manager.load("/ckpt/step_1", into={"model": model.state_dict(), "step": 0})
    finally:
        manager.close()
    # bytes, not tensors: a tensor would travel through shared memory the rank frees on exit
    loaded = {k: v.numpy().tobytes() for k, v in model.state_dict().items()}
    return {"saved": state, "loaded": loaded}
