"""ckptstore-torch-checkpointing: torch_checkpointing's ``Storage`` on ckptstore.

Install with ``pip install 'ckptstore[torch-checkpointing]'``. Select it with one line::

    from ckptstore_tc import CkptStoreStorageConfig
    CheckpointManager.Config(storage_config=CkptStoreStorageConfig("s3://bucket/run1"))

torch_checkpointing's files are then written through ckptstore's transfer engine
(parallel parts, CRC32C per part, retries, nothing visible until whole), read by
parallel ranged GETs, and renamed per its commit table by server-side copies on object
stores (checked; a failed rename leaves nothing half-renamed). Volumes, S3, GCS, Azure
and any fsspec URL. Paths, rename and limits: ``ckptstore_tc.storage`` and
docs/torch_checkpointing.md. Supported: ``torch-checkpointing>=0.1.1,<0.2``.
"""

from ckptstore_tc.storage import CkptStoreStorage, CkptStoreStorageConfig, MissingParentError

__all__ = ["CkptStoreStorageConfig", "CkptStoreStorage", "MissingParentError"]
