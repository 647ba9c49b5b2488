"""Torch DCP over any store: the ``StorageWriter`` / ``StorageReader`` adapters only.

``writer`` (``CkptWriter``) and ``reader`` (``CkptReader``) are the backends
``torch.distributed.checkpoint`` drives, both bound to a store by ``storebound``;
``schedule`` is the writer's one hook for how a rank groups and orders its shard files;
``shard_file`` serialises one shard file's items; ``indexes`` builds the manifest and
``.metadata`` the writer commits; ``staged`` writes shards to the node-local tier and
uploads them at once, ``encoding`` encodes one item's bytes, ``metadata`` reads
``.metadata`` without running untrusted code, ``transcode`` rewrites a checkpoint with
another codec and ``save_load`` wraps ``dcp.save`` / ``dcp.load`` for ckptstore's own
calls.
"""
