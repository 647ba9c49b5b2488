"""The inputs of :mod:`ckptstore.planning.scale`: measured per-rank figures, the cluster and
its object store, prices, and the :class:`Limit` a transfer phase can be bound by.

Frozen dataclasses checked on construction (:class:`~ckptstore.planning.checks.InputError`
naming the field). Units: bytes, seconds, GB = 1e9 bytes, GB/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ckptstore.planning.checks import check

__all__ = ["GB", "STORE_LIMITS", "Cluster", "Limit", "RankFigures", "ScalePrices"]

GB = 1e9


class Limit(str, Enum):
    """What bounds a transfer phase (the bottleneck model of :mod:`ckptstore.planning.scale`)."""

    PER_RANK_BANDWIDTH = "per_rank_bandwidth"
    NIC = "nic"
    STORE_BANDWIDTH = "store_bandwidth"
    PREFIX_REQUEST_RATE = "prefix_request_rate"

    def __str__(self) -> str:
        return self.value


#: The limits on the store's side: they grow with the GPU count.
STORE_LIMITS = (Limit.STORE_BANDWIDTH, Limit.PREFIX_REQUEST_RATE)


@dataclass(frozen=True)
class RankFigures:
    """What one rank does per save, as measured on a real job.

    ``bytes_per_rank``: the largest rank's shard bytes; ``write_gb_s`` / ``read_gb_s``: one
    rank's save / restore throughput in GB/s (bytes over the background upload time);
    ``blocking_s``: the time one save stops training; ``files_per_rank``: shard files per
    rank; ``part_bytes``: multipart part and ranged-read size (``TransferConfig.part_size``).
    """

    bytes_per_rank: float
    write_gb_s: float
    read_gb_s: float
    blocking_s: float = 0.0
    files_per_rank: int = 1
    part_bytes: int = 32 * 2**20

    def __post_init__(self) -> None:
        own = "RankFigures"
        check(own, "bytes_per_rank", self.bytes_per_rank, positive=True)
        check(own, "write_gb_s", self.write_gb_s, positive=True, hint=" (GB/s per rank)")
        check(own, "read_gb_s", self.read_gb_s, positive=True, hint=" (GB/s per rank)")
        check(own, "blocking_s", self.blocking_s)
        check(own, "files_per_rank", self.files_per_rank, whole=True)
        check(own, "part_bytes", self.part_bytes, whole=True)

    @property
    def parts_per_file(self) -> int:
        """Parts (or ranged reads) of one file of ``bytes_per_rank / files_per_rank``."""
        return max(1, math.ceil(self.bytes_per_rank / self.files_per_rank / self.part_bytes))


@dataclass(frozen=True)
class Cluster:
    """The cluster and its object store. Bandwidths in GB/s; None: no such cap / no tier.

    ``nic_gb_s`` is one node's bandwidth to the store; ``store_gb_s`` the store's aggregate
    cap for the job; ``put_per_prefix_s`` / ``get_per_prefix_s`` the request rates one key
    prefix sustains (S3's documented figures by default); ``local_gb_s`` a node's local-tier
    read bandwidth (None: no local-tier row). ``commit_puts``, ``meta_gets_per_restore``,
    ``meta_gets_per_rank`` and ``local_check_gets_per_rank`` count the small objects under the
    step's own prefix (see :mod:`ckptstore.planning.scale`). The defaults are
    ``CheckpointManager.restore``'s: rank 0 reads the marker, manifest and ``.metadata`` once
    (3 GETs per restore) and broadcasts them, so no rank reads them itself and a rank checks
    its tier copy against the broadcast marker (0 GETs per rank). A job whose every rank
    opens the checkpoint itself (``dcp.load`` with a bare ``ckptstore.reader`` per rank) is
    ``meta_gets_per_restore=0, meta_gets_per_rank=3, local_check_gets_per_rank=1``.
    """

    gpus_per_node: int = 8
    nic_gb_s: float = 25.0
    store_gb_s: float | None = None
    put_per_prefix_s: float = 3500.0
    get_per_prefix_s: float = 5500.0
    local_gb_s: float | None = None
    commit_puts: int = 5
    meta_gets_per_rank: int = 0
    local_check_gets_per_rank: int = 0
    meta_gets_per_restore: int = 3

    def __post_init__(self) -> None:
        own = "Cluster"
        check(own, "gpus_per_node", self.gpus_per_node, whole=True)
        check(own, "nic_gb_s", self.nic_gb_s, positive=True)
        check(own, "store_gb_s", self.store_gb_s, positive=True, hint=" (or None: no cap)")
        check(own, "put_per_prefix_s", self.put_per_prefix_s, positive=True)
        check(own, "get_per_prefix_s", self.get_per_prefix_s, positive=True)
        check(own, "local_gb_s", self.local_gb_s, positive=True, hint=" (or None: no tier)")
        check(own, "commit_puts", self.commit_puts)
        check(own, "meta_gets_per_rank", self.meta_gets_per_rank)
        check(own, "local_check_gets_per_rank", self.local_check_gets_per_rank)
        check(own, "meta_gets_per_restore", self.meta_gets_per_restore)


@dataclass(frozen=True)
class ScalePrices:
    """Unit prices; any left None is not priced. ``put_per_1k`` / ``get_per_1k`` per 1,000
    requests (S3 Standard lists $0.005 and $0.0004), ``storage_gb_month`` per GB-month,
    ``gpu_hour`` per GPU-hour (prices the GPU time saves block)."""

    storage_gb_month: float | None = None
    put_per_1k: float | None = None
    get_per_1k: float | None = None
    gpu_hour: float | None = None

    def __post_init__(self) -> None:
        for name in ("storage_gb_month", "put_per_1k", "get_per_1k", "gpu_hour"):
            check("ScalePrices", name, getattr(self, name), hint=" (or None to leave it unpriced)")
