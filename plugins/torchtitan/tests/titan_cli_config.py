"""A config registry for torchtitan's ``ConfigManager`` (its command line) whose job holds
only what the manager checks (``hf_assets_path``) and torchtitan's checkpoint field, set to
the plugin's config: the full ``Trainer.Config`` needs torchtitan's data dependencies."""

from dataclasses import dataclass, field

from ckptstore_titan import CkptStoreCheckpointManager
from torchtitan.components.checkpointer import BaseCheckpointManager, CheckpointManager


@dataclass(kw_only=True, slots=True)
class Job:
    hf_assets_path: str = "."
    checkpoint: BaseCheckpointManager.Config = field(default_factory=CheckpointManager.Config)


def job_ckptstore() -> Job:
    checkpoint = CkptStoreCheckpointManager.Config.from_titan(
        CheckpointManager.Config(interval=10),
        enable=True,
        folder="s3://bucket/run1",
        storage_options={"anon": False},
    )
    return Job(checkpoint=checkpoint)
