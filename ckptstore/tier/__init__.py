"""The local tier: a node's own disk where a job keeps fresh copies of its steps.

One object, ``LocalTier`` (``tier.local_tier``), built once by the manager from its options,
the root and the run id, holds all of it: its store (this job's directory of each node's
tier), its keep rules and cadences, its nodes and peers; it is what the save, the trim,
the replication and the restore are handed. Its parts, one concern each:

* ``jobs``: whose copies a tier holds (one stamped directory per job), ``TierSpec`` (the
  picklable part the save step gets) and the check that a tier does not overlap the root;
* ``rules``: what a node keeps and what a restore trusts;
* ``tier_writer``: ``TierWriter``, the DCP writer that tees each shard into the tier copy and
  the root at once;
* ``view``: ``TierView``, a restore's read of one step, each file from the tier copy
  where it has it, else from the root;
* ``replicas``, ``peers``, ``peer_copy``: the copies between nodes' tiers (which ranks
  share a node: ``local_tier.Nodes``).

Adding a tier kind means its module here, its construction in ``LocalTier.of`` and its
test. This ``__init__`` imports nothing, so that ``ckptstore-tool ls --local-tier``
(``jobs``, ``rules``) runs without torch; import the modules themselves.
"""
