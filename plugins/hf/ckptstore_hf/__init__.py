"""ckptstore-hf: Hugging Face ``Trainer`` and Accelerate checkpoints through ckptstore.

Install and use, one line each::

    pip install 'ckptstore[hf]'       # ckptstore, ckptstore-hf, transformers, accelerate

    from ckptstore_hf import CkptStoreAccelerate, CkptStoreCallback

    ckpt = CkptStoreCallback("s3://bucket/run1")
    trainer = Trainer(..., callbacks=[ckpt])
    trainer.train(resume_from_checkpoint=ckpt.resume_from)  # newest committed; None: fresh
    ckpt.close()                                            # the last upload committed

    ckpt = CkptStoreAccelerate("s3://bucket/run1").register(accelerator)
    if path := ckpt.prepare_resume():               # None on a fresh run
        accelerator.load_state(path)                # then train, save_state(...) as usual

Both let the framework write its checkpoint folder locally, in its own format, and then
upload that folder as one ckptstore step (staged, written and committed in the
background by a ``ckptstore.CheckpointManager``, checksummed, verified on read). On
resume the newest committed step that verifies is written back as the framework's local
folder, and local folders newer than it (torn or never committed) are moved aside to
``.ckptstore-uncommitted``, so the framework's own "latest checkpoint" logic picks the
committed one. Both take ``(root, options, **keywords)``: a ``ckptstore.ManagerOptions``
and/or any of its fields, as ``CheckpointManager`` does.

Several processes (``torchrun --nproc-per-node N``, ``accelerate launch --num_processes N``):
every rank runs the same hooks. A save waits until every rank has written its files, then
every rank uploads a share of the folder and the step commits once. On resume every rank
loads the committed step and the process that saves for its file system (the framework's
``should_save`` / main process; with ``save_on_each_node``, one per node) writes the local
folder. Supported: ``transformers>=4.40,<6``, ``accelerate>=0.30,<2``; the version is
lockstep with ``ckptstore``'s. More in docs/plugins.md of the ckptstore repository.
"""

from ckptstore_hf.hooks import CkptStoreAccelerate, CkptStoreCallback

__all__ = ["CkptStoreCallback", "CkptStoreAccelerate"]
