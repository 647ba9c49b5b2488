"""Framework integrations; each needs its extra.

- ``ckptstore.integrations.lightning``: ``CkptStoreIO``, a Lightning ``CheckpointIO``
  (``pip install 'ckptstore[lightning]'``)
- ``ckptstore.integrations.hf``: ``CkptStoreCallback`` for ``transformers.Trainer`` and
  ``CkptStoreAccelerate`` for ``accelerate.Accelerator`` (``pip install 'ckptstore[hf]'``)

Importing this package imports no framework; importing a plugin module without its
framework raises ``MissingDependencyError`` naming the install command. Setup lines are
in ``docs/plugins.md``.
"""

__all__: list[str] = []
