"""Torch DCP over any store: the ``StorageWriter`` / ``StorageReader`` adapters only.

``writer`` (``CkptWriter``) and ``reader`` (``CkptReader``) are the backends
``torch.distributed.checkpoint`` drives, both bound to a store by ``storebound``;
``schedule`` is the writer's one hook for how a rank groups and orders its shard files;
``shard_file`` serialises one shard file's items; ``encoding`` encodes one item's bytes
(``decoding`` reads it back); ``metadata`` builds the manifest and ``.metadata`` the writer
commits and reads ``.metadata`` back without running untrusted code
(``metadata_checks``, ``metadata_bounds`` check it); the local tier's writer, which
tees shards into a tier copy, is ``ckptstore.tier.tier_writer``'s; ``transcode`` rewrites
a checkpoint with another codec and ``save_load`` wraps ``dcp.save`` / ``dcp.load`` for
ckptstore's own calls.
"""
