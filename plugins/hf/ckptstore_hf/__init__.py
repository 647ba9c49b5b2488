"""ckptstore-hf: Hugging Face ``Trainer`` and Accelerate checkpoints through ckptstore.

Install with ``pip install 'ckptstore[hf]'`` (ckptstore, ckptstore-hf, transformers,
accelerate). ``CkptStoreCallback`` (Trainer) and ``CkptStoreAccelerate`` (hooks) let the
framework write its checkpoint folder locally, in its own format, then upload that folder
as one ckptstore step (staged, written and committed in the background by a
``ckptstore.CheckpointManager``, checksummed, verified on read). On resume the newest
committed step that verifies is written back as the framework's local folder, and newer
local folders (torn or never committed) are moved aside to ``.ckptstore-uncommitted``, so
the framework's own "latest checkpoint" logic picks the committed one. Both take
``(root, options, **keywords)``, as ``CheckpointManager`` does. Use, call order and
several processes: ``ckptstore_hf.hooks``. Supported: ``transformers>=4.40,<6``,
``accelerate>=0.30,<2``, lockstep with ``ckptstore``; more in docs/plugins.md.
"""

from ckptstore_hf.hooks import CkptStoreAccelerate, CkptStoreCallback

__all__ = ["CkptStoreCallback", "CkptStoreAccelerate"]
