"""ckptstore-lightning: PyTorch Lightning checkpoints through ckptstore, in one line.

Install and use::

    pip install 'ckptstore[lightning]'          # ckptstore, ckptstore-lightning, lightning

    from ckptstore_lightning import CkptStoreIO
    trainer = Trainer(plugins=[CkptStoreIO()],            # or CkptStoreIO("s3://bucket/run1")
                      callbacks=[ModelCheckpoint(every_n_train_steps=500, save_last=True)])
    trainer.fit(model, ckpt_path="last")                  # newest *committed* step, if any

Each checkpoint is one ckptstore step, ``<root>/step_<global_step>/``, written by a
``ckptstore.CheckpointManager``: staged, then serialised, uploaded and committed in the
background; checksummed, verified on load, falling back past a corrupt step. ``root``
defaults to the directory Lightning saves into (``ModelCheckpoint``'s dirpath). The file
Lightning names (``epoch=0-step=500.ckpt``, ``last.ckpt``) becomes a small JSON *pointer*
to the step, written once the step has committed, so ``ModelCheckpoint``'s top-k,
``best_model_path`` and ``ckpt_path="last"`` keep working unchanged.

Options: ``CkptStoreIO(root, options, **keywords)`` takes a ``ckptstore.ManagerOptions``
and/or any of its fields as keywords, as ``CheckpointManager`` does (``local_tier_dir``,
``writer``, ``background``, ``max_staging_bytes``, ...); ``keep`` is the IO's own pruning
beyond the names (default ``KeepLast(1)``).

Several processes (``strategy="ddp"`` under Lightning's launcher or ``torchrun``): every
rank saves the model and optimizer tensors (identical under DDP, so DCP spreads their
writes), rank 0 the rest, and the step commits once. A strategy that writes its own
checkpoints (FSDP, ModelParallel, DeepSpeed) or spawns its ranks is refused with a
``ConfigError`` when the Trainer is built. Supported: ``lightning>=2.2,<3``; the version
is lockstep with ``ckptstore``'s. More in docs/plugins.md of the ckptstore repository.
"""

from ckptstore_lightning.io import POINTER_FORMAT, CkptStoreIO

__all__ = ["CkptStoreIO", "POINTER_FORMAT"]
