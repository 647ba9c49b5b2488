"""ckptstore-torchtitan: torchtitan checkpoints through ckptstore.

Install with ``pip install 'ckptstore[torchtitan]'`` (ckptstore, ckptstore-torchtitan,
torchtitan). In a torchtitan ``config_registry`` function, set
``checkpoint=CkptStoreCheckpointManager.Config(enable=True, folder="s3://bucket/run1", ...)``:
torchtitan's DCP checkpointer then saves every step through ``ckptstore.writer`` (parallel
native uploads, CRC32C manifest, create-only commit) and resumes from the newest committed
step through ``ckptstore.reader`` (every range verified), with torchtitan's async modes,
``keep_latest_k`` and ``initial_load_path`` working as before. Use and call order:
``ckptstore_titan.checkpointer``; what changes for a user, and the limits: docs/torchtitan.md.
Supported: ``torchtitan>=0.3,<0.4``, lockstep with ``ckptstore``.
"""

from ckptstore_titan.checkpointer import CkptStoreCheckpointManager

__all__ = ["CkptStoreCheckpointManager"]
