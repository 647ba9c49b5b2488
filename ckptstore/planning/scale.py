"""Scale projection: what one job's saves and restores cost at 1k-100k GPUs, and what binds.

Pure functions and frozen dataclasses (no I/O, no torch); ``ckptstore-tool goodput --plan``
renders :func:`sweep`. Inputs are the figures measured on one job (:class:`RankFigures`),
the cluster and object store (:class:`Cluster`) and optional prices (:class:`ScalePrices`).
The model's assumptions (weak scaling, blocking, the bottleneck model, requests, prefixes,
restore) are :func:`project`'s docstring; docs/cli.md says them for users.
S3 documents 3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests per second per
partitioned prefix (the :class:`Cluster` defaults); other stores differ, so they are inputs.
Units: bytes, seconds, GB = 1e9 bytes, GB/s. The input dataclasses live in
:mod:`ckptstore.planning.scale_inputs` and are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptstore.planning.checks import InputError, check
from ckptstore.planning.scale_inputs import (
    GB,
    STORE_LIMITS,
    Cluster,
    Limit,
    RankFigures,
    ScalePrices,
)

__all__ = [
    "LAYOUTS",
    "GB",
    "SPREAD_PREFIXES",
    "STORE_LIMITS",
    "Cluster",
    "Limit",
    "Phase",
    "RankFigures",
    "ScaleCost",
    "ScalePoint",
    "ScalePrices",
    "blocking_per_save",
    "first_store_limit",
    "hottest_prefix_ranks",
    "local_restore_s",
    "project",
    "puts_per_file",
    "restore_phase",
    "save_phase",
    "store_bound_from",
    "sweep",
]

LAYOUTS = ("flat", "spread")
#: Sub-prefixes of ``key_layout="spread"`` (two hex digits).
SPREAD_PREFIXES = 256
_HOURS_PER_MONTH = 365.0 * 24.0 / 12.0
_MAX_GPUS = 10**9


@dataclass(frozen=True)
class Phase:
    """One transfer phase: its time, what binds it and the request load.

    ``limit_s`` is the time each limit alone would take (``seconds`` is their maximum);
    ``hottest_prefix`` is ``"step"`` (the step's own prefix: everything with ``"flat"``, the
    commit objects and metadata reads with ``"spread"``) or ``"shard"`` (the busiest ``<hh>/``);
    ``prefix_rate`` the requests per second it sees at that pace, against ``prefix_limit``.
    """

    seconds: float
    binding: Limit
    limit_s: dict[str, float]
    requests: int
    hottest_prefix_requests: int
    hottest_prefix: str
    prefix_rate: float
    prefix_limit: float


@dataclass(frozen=True)
class ScaleCost:
    """Money per save, per restore and per month of saving every ``interval_min``; None where
    a price is missing. Storage is ``keep_last`` whole checkpoints all month."""

    per_save: float | None
    per_restore: float | None
    storage_month: float | None
    requests_month: float | None
    blocking_month: float | None
    per_month: float | None


@dataclass(frozen=True)
class ScalePoint:
    """The projection for one GPU count and key layout (:func:`project`)."""

    gpus: int
    nodes: int
    layout: str
    checkpoint_gb: float
    blocking_s: float
    save: Phase
    restore_root: Phase
    restore_local_s: float | None
    saves_per_month: float
    cost: ScaleCost


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise InputError("scale", f"{{layout}} must be one of {LAYOUTS}; got {layout!r}", "layout")


def hottest_prefix_ranks(ranks: int, layout: str) -> int:
    """Ranks whose shards share the busiest shard prefix: all of them with ``"flat"``,
    ``ceil(ranks / 256)`` with ``"spread"`` (an even hash)."""
    check("hottest_prefix_ranks", "ranks", ranks, whole=True)
    _check_layout(layout)
    return ranks if layout == "flat" else -(-ranks // SPREAD_PREFIXES)


def puts_per_file(fig: RankFigures) -> int:
    """PUT-class requests to write one file: 1, or initiate + parts + complete."""
    parts = fig.parts_per_file
    return 1 if parts == 1 else parts + 2


def _phase(
    fig: RankFigures,
    cluster: Cluster,
    gpus: int,
    layout: str,
    *,
    rank_gb_s: float,
    per_file: int,
    per_rank_root: int,
    root: int,
    prefix_limit: float,
) -> Phase:
    _check_layout(layout)
    check("scale", "gpus", gpus, whole=True)
    per_rank = fig.files_per_rank * per_file
    shard_hot = hottest_prefix_ranks(gpus, layout) * per_rank
    root_load = per_rank_root * gpus + root
    hottest = shard_hot + root_load if layout == "flat" else max(shard_hot, root_load)
    node_ranks = min(cluster.gpus_per_node, gpus)
    total = fig.bytes_per_rank * gpus
    times = {
        Limit.PER_RANK_BANDWIDTH: fig.bytes_per_rank / (rank_gb_s * GB),
        Limit.NIC: fig.bytes_per_rank * node_ranks / (cluster.nic_gb_s * GB),
        Limit.STORE_BANDWIDTH: (
            0.0 if cluster.store_gb_s is None else total / (cluster.store_gb_s * GB)
        ),
        Limit.PREFIX_REQUEST_RATE: hottest / prefix_limit,
    }
    binding = max(times, key=lambda k: times[k])  # ties: the first, in Limit order
    seconds = times[binding]
    return Phase(
        seconds=seconds,
        binding=binding,
        limit_s={k.value: v for k, v in times.items()},
        requests=per_rank * gpus + root_load,
        hottest_prefix_requests=hottest,
        hottest_prefix="step" if layout == "flat" or root_load >= shard_hot else "shard",
        prefix_rate=hottest / seconds if seconds > 0 else 0.0,
        prefix_limit=prefix_limit,
    )


def save_phase(fig: RankFigures, cluster: Cluster, gpus: int, layout: str) -> Phase:
    """Time from a save's start until it is committed (its upload, bounded as above)."""
    return _phase(
        fig,
        cluster,
        gpus,
        layout,
        rank_gb_s=fig.write_gb_s,
        per_file=puts_per_file(fig),
        per_rank_root=0,
        root=cluster.commit_puts,
        prefix_limit=cluster.put_per_prefix_s,
    )


def restore_phase(fig: RankFigures, cluster: Cluster, gpus: int, layout: str) -> Phase:
    """Time for every rank to read its shard back from the root."""
    return _phase(
        fig,
        cluster,
        gpus,
        layout,
        rank_gb_s=fig.read_gb_s,
        per_file=fig.parts_per_file,
        per_rank_root=cluster.meta_gets_per_rank,
        root=cluster.meta_gets_per_restore,
        prefix_limit=cluster.get_per_prefix_s,
    )


def local_restore_s(fig: RankFigures, cluster: Cluster, gpus: int) -> float | None:
    """Restore time from the local tier (None without ``local_gb_s``): the node's shards
    over its local bandwidth, at most each rank's read throughput, and at least the time the
    step's prefix takes to answer the marker checks (rank 0's small-object GETs, plus any
    per-rank ones)."""
    if cluster.local_gb_s is None:
        return None
    node_ranks = min(cluster.gpus_per_node, gpus)
    return max(
        fig.bytes_per_rank / (fig.read_gb_s * GB),
        fig.bytes_per_rank * node_ranks / (cluster.local_gb_s * GB),
        (cluster.local_check_gets_per_rank * gpus + cluster.meta_gets_per_restore)
        / cluster.get_per_prefix_s,
    )


def blocking_per_save(blocking_s: float, commit_s: float, interval_s: float) -> float:
    """Blocking of one save in steady state: the measured staging time, plus the wait for the
    previous save when it takes longer than the interval to commit."""
    return blocking_s + max(0.0, commit_s - interval_s)


def _price(quantity: float, unit: float | None) -> float | None:
    return None if unit is None else quantity * unit


def project(
    fig: RankFigures,
    cluster: Cluster,
    gpus: int,
    layout: str,
    *,
    interval_min: float = 60.0,
    keep_last: int = 3,
    prices: ScalePrices | None = None,
) -> ScalePoint:
    """Blocking, time until committed, restore times, request rates and cost at ``gpus``.

    Assumptions (each a term a reader can check against their own job):

    * **Weak scaling.** Every GPU is one rank and every rank saves its own shard of
      ``bytes_per_rank`` (FSDP / tensor-parallel state sharded over all ranks), so the checkpoint
      grows with the GPU count and per-rank figures stay as measured.
    * **Blocking does not grow with GPUs.** Each rank stages its own shard into its own buffer, in
      parallel, so one save blocks training for the measured ``blocking_s`` at any GPU count,
      *unless* the previous save has not committed yet when the next starts: then the next save
      waits, and blocking is ``blocking_s + max(0, time_until_committed - interval)``. DCP's
      planning collectives (a gather of every rank's plan) are not modelled.
    * **Bottleneck model.** A transfer phase (a save's upload, a restore's download) takes as long
      as its slowest limit, each limit taken alone and assumed to overlap perfectly with the
      others: per-rank throughput (``bytes_per_rank / rank GB/s``), the node NIC (the node's
      ranks' bytes / NIC GB/s), the store's aggregate bandwidth (all bytes / store GB/s; None is
      no cap) and the request rate of the hottest key prefix (its requests / the per-prefix
      limit). The one that takes longest is the :class:`Limit` that binds.
    * **Requests.** A file of one part is one PUT; a larger one is a multipart upload: initiate,
      one PUT per ``part_bytes`` part, complete (S3 counts all of them against the per-prefix
      PUT/COPY/POST/DELETE rate). The coordinator adds ``commit_puts`` (attempt-named manifest and
      ``.metadata``, their canonical copies, ``COMMITTED``) under the step's own prefix. A restore
      reads every file in ``part_bytes`` ranged GETs, plus the small objects (marker, manifest,
      ``.metadata``) under the step's prefix: ``meta_gets_per_restore`` in all (rank 0 reads them
      once and broadcasts them: 3 by default) and ``meta_gets_per_rank`` per rank (0 by default;
      3 where every rank opens the checkpoint itself, as a bare ``ckptstore.reader`` per rank
      does). So with ckptstore's restore the step's prefix no longer carries a per-rank load,
      and what binds a restore at scale is the shards' own GETs (``"flat"``) or the per-rank
      bandwidth (``"spread"``, up to tens of thousands of ranks). Rank 0's discovery (one
      listing of the root, three GETs per retained step, each step its own prefix) and the
      broadcast of the small objects to every rank are latency, not request rate: not modelled.
    * **Prefixes.** ``"flat"`` puts every shard under the step's prefix; ``"spread"`` under 256
      sub-prefixes by a hash of the rank (``ckptstore.dcp.writer.shard_prefix``), taken as even:
      the hottest holds ``ceil(ranks / 256)`` ranks. The real CRC32C spread is a little uneven:
      its busiest sub-prefix holds 7 ranks of 1,000 (not 4), 47 of 10,000 (not 40) and 406 of
      100,000 (not 391), so spread's shard-prefix times are up to that much optimistic. The
      step's own prefix (commit objects, metadata reads) is one prefix in both layouts.
    * **Restore.** From the root every rank reads its shard; from the local tier
      (the tier copy the tier writer made) each node reads its ranks' shards from local disk at
      ``local_gb_s``, still at most the per-rank read throughput, after every rank has compared
      its tier copy's marker with the root's: the one rank 0 read (``meta_gets_per_restore``) and
      broadcast by default, or ``local_check_gets_per_rank`` GETs per rank on the step's prefix
      where each rank reads the root's marker itself.
    """
    check("scale", "interval_min", interval_min, positive=True)
    check("scale", "keep_last", keep_last, whole=True)
    p = prices or ScalePrices()
    save = save_phase(fig, cluster, gpus, layout)
    restore = restore_phase(fig, cluster, gpus, layout)
    interval_s = interval_min * 60.0
    blocking = blocking_per_save(fig.blocking_s, save.seconds, interval_s)
    # A save starts every interval of training plus its own blocking (which includes any wait
    # for the previous one): max(interval, time until committed) + the measured blocking.
    period_s = interval_s + blocking
    saves_month = _HOURS_PER_MONTH * 3600.0 / period_s
    size_gb = fig.bytes_per_rank * gpus / GB
    per_save = _price(save.requests / 1000.0, p.put_per_1k)
    storage = _price(keep_last * size_gb, p.storage_gb_month)
    requests = None if per_save is None else per_save * saves_month
    blocked = _price(blocking * saves_month * gpus / 3600.0, p.gpu_hour)
    items = [c for c in (storage, requests, blocked) if c is not None]
    cost = ScaleCost(
        per_save=per_save,
        per_restore=_price(restore.requests / 1000.0, p.get_per_1k),
        storage_month=storage,
        requests_month=requests,
        blocking_month=blocked,
        per_month=sum(items) if items else None,
    )
    return ScalePoint(
        gpus=gpus,
        nodes=-(-gpus // cluster.gpus_per_node),
        layout=layout,
        checkpoint_gb=size_gb,
        blocking_s=blocking,
        save=save,
        restore_root=restore,
        restore_local_s=local_restore_s(fig, cluster, gpus),
        saves_per_month=saves_month,
        cost=cost,
    )


def sweep(
    fig: RankFigures,
    cluster: Cluster,
    gpu_counts: tuple[int, ...] = (1_000, 10_000, 100_000),
    *,
    interval_min: float = 60.0,
    keep_last: int = 3,
    prices: ScalePrices | None = None,
) -> list[ScalePoint]:
    """:func:`project` for every GPU count, flat then spread for each."""
    if not gpu_counts:
        raise InputError("sweep", "{gpus} is empty: give at least one GPU count", "gpus")
    return [
        project(fig, cluster, n, lay, interval_min=interval_min, keep_last=keep_last, prices=prices)
        for n in gpu_counts
        for lay in LAYOUTS
    ]


def store_bound_from(
    fig: RankFigures, cluster: Cluster, layout: str, phase: str = "save"
) -> int | None:
    """The smallest GPU count at which a store-side limit (aggregate bandwidth or per-prefix
    request rate) binds ``phase`` (``"save"`` or ``"restore"``); None if none does below
    10**9 GPUs. Store-side times only grow with GPUs and rank-side ones stop growing at one
    full node, so the answer is found by bisection."""
    if phase not in ("save", "restore"):
        raise InputError("scale", f"{{phase}} must be save or restore; got {phase!r}", "phase")
    fn = save_phase if phase == "save" else restore_phase

    def store_bound(gpus: int) -> bool:
        return fn(fig, cluster, gpus, layout).binding in STORE_LIMITS

    if store_bound(1):
        return 1
    lo = min(cluster.gpus_per_node, _MAX_GPUS)  # from here on the predicate is monotone
    if store_bound(lo):
        for n in range(2, lo + 1):
            if store_bound(n):
                return n
    if not store_bound(_MAX_GPUS):
        return None
    hi = _MAX_GPUS
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if store_bound(mid) else (mid, hi)
    return hi


def first_store_limit(
    fig: RankFigures, cluster: Cluster, layout: str, phase: str = "save"
) -> tuple[int, Limit] | None:
    """Which store-side limit binds ``phase`` first as the GPU count grows, and from how
    many GPUs (:func:`store_bound_from`); None if none does below 10**9 GPUs."""
    gpus = store_bound_from(fig, cluster, layout, phase)
    if gpus is None:
        return None
    fn = save_phase if phase == "save" else restore_phase
    return gpus, fn(fig, cluster, gpus, layout).binding
