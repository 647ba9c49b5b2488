"""Torch DCP over any store: the ``StorageWriter`` / ``StorageReader`` and their staging.

``writer`` (``CkptWriter``) and ``reader`` (``CkptReader``) are the backends
``torch.distributed.checkpoint`` drives, both bound to a store by ``storebound``;
``staged`` writes shards to local disk and uploads them at once, ``shared_staging`` copies a
state into shared memory for a writer process, ``format`` encodes one item's bytes,
``metadata`` reads ``.metadata`` without running untrusted code, ``transcode`` rewrites a
checkpoint with another codec and ``calls`` wraps ``dcp.save`` / ``dcp.load`` for
ckptstore's own calls.
"""
