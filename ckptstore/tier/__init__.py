"""The local tier: a node's own disk where a job keeps fresh copies of its steps.

One object, ``LocalTier`` (``tier.local``), built once by the manager from its options,
holds all of it and is what the save, the trim, the replication and the restore are
handed. Its parts, one concern each:

* ``jobs``: whose copies a tier holds (one stamped directory per job), ``TierSpec`` (the
  picklable part the save step gets) and the check that a tier does not overlap the root;
* ``rules``: what a node keeps and what a restore trusts;
* ``writer``: ``TierWriter``, the DCP writer that tees each shard into the tier copy and
  the root at once;
* ``view``: ``TierView``, a restore's read of one step, each file from the tier copy
  where it has it, else from the root;
* ``nodes``, ``replicas``, ``peers``, ``peer_copy``: which ranks share a node, and the
  copies between nodes' tiers.

Adding a tier kind means its module here, its construction in ``LocalTier.of`` and its
test. This ``__init__`` imports nothing, so that ``ckptstore-tool ls --local-tier``
(``jobs``, ``rules``) runs without torch; import the modules themselves.
"""
