"""Torch DCP over any store: the ``StorageWriter`` / ``StorageReader`` adapters only.

``writer`` (``CkptWriter``) and ``reader`` (``CkptReader``) are the backends
``torch.distributed.checkpoint`` drives, both bound to a store by ``storebound``;
``schedule`` is the writer's one hook for how a rank groups and orders its shard files;
``staged`` writes shards to the node-local tier and uploads them at once, ``format``
encodes one item's bytes, ``metadata`` reads ``.metadata`` without running untrusted
code, ``transcode`` rewrites a checkpoint with another codec and ``calls`` wraps
``dcp.save`` / ``dcp.load`` for ckptstore's own calls.
"""
