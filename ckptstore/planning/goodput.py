"""Goodput planning math: how much a checkpoint interval, a failure rate and a price list cost.

Pure functions and frozen dataclasses (no I/O, no torch); ``ckptstore-tool goodput`` renders
:func:`plan`'s report with :func:`report_rows`.

The failure and goodput models themselves (formulas, sources, worked figures) are in
:mod:`ckptstore.planning.models`; input validation in :mod:`ckptstore.planning.checks`. Their
public names are re-exported here.

The cost account (:class:`CostAccount`) uses the first-order model, so its three time losses add
up to ``run_hours * (1 - goodput)`` before clamping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckptstore.planning.checks import InputError, check, check_afr
from ckptstore.planning.models import (
    MODELS,
    daly_interval,
    failure_probability,
    failures_per_day,
    goodput_of,
    two_tier_goodput,
    young_interval,
)

__all__ = [
    "MODELS",
    "CostAccount",
    "GoodputInputs",
    "GoodputReport",
    "InputError",
    "Prices",
    "TimeLoss",
    "daly_interval",
    "expected_goodput",
    "failure_probability",
    "failures_per_day",
    "plan",
    "report_rows",
    "young_interval",
]

_DAYS_PER_MONTH = 365.0 / 12.0


@dataclass(frozen=True)
class GoodputInputs:
    """One training run to plan.

    Give the failure rate either as ``failures_per_day`` or as ``gpus`` + ``afr`` (annual failure
    rate per GPU, a fraction: 1 % is 0.01). ``gpus`` is also needed for GPU-hours and the disk
    per node. ``interval_min`` is the training time between saves; ``blocking_s`` the time one
    save stops training (the staging copy for async saves); ``restart_min`` the time from a
    failure until training runs again, not counting re-done work.

    Cost-account fields: ``checkpoint_gb`` (one whole checkpoint; None, the default, when
    unknown: the storage, transfer and staging-disk items are then None), ``keep_last`` (retention),
    ``gpus_per_node``, ``data_cache_gb`` (local dataset cache per node) and ``tier_copies``
    (tier copies on local NVMe per node, each the node's even share).

    A second, faster tier (the local tier with peer replicas): ``peer_interval_min``
    (training minutes between its saves; None: no such tier), ``peer_share`` (the fraction
    of failures it survives: worker crashes, and node losses that leave every shard on a
    surviving peer), ``peer_restart_min`` (a restart from it; default ``restart_min``).
    ``interval_min`` and ``restart_min`` are then the bucket's.
    """

    interval_min: float
    days: float = 30.0
    failures_per_day: float | None = None
    gpus: int | None = None
    afr: float | None = None
    blocking_s: float = 0.0
    restart_min: float = 0.0
    checkpoint_gb: float | None = None
    keep_last: int = 3
    gpus_per_node: int = 8
    data_cache_gb: float = 0.0
    tier_copies: float = 2.0
    peer_interval_min: float | None = None
    peer_share: float = 0.9
    peer_restart_min: float | None = None

    def __post_init__(self) -> None:
        own = "GoodputInputs"
        check(
            own,
            "interval_min",
            self.interval_min,
            positive=True,
            hint=" (minutes of training between two checkpoints)",
        )
        check(own, "days", self.days, positive=True, hint=" (wall-clock length of the run)")
        check(
            own,
            "failures_per_day",
            self.failures_per_day,
            hint=" (0 plans for a run without failures)",
        )
        check(own, "gpus", self.gpus, whole=True)
        check_afr(own, self.afr)
        if self.failures_per_day is not None and self.afr is not None:
            raise InputError(
                own,
                "give the failure rate as {failures_per_day} or as {gpus} + {afr}, not both",
                *("failures_per_day", "gpus", "afr"),
            )
        if self.failures_per_day is None and (self.afr is None or self.gpus is None):
            raise InputError(
                own,
                "no failure rate; set {failures_per_day}, or {gpus} and {afr}",
                *("failures_per_day", "gpus", "afr"),
            )
        check(own, "blocking_s", self.blocking_s)
        check(own, "restart_min", self.restart_min)
        check(own, "checkpoint_gb", self.checkpoint_gb)
        check(own, "keep_last", self.keep_last, whole=True, hint=" (checkpoints kept by retention)")
        check(own, "gpus_per_node", self.gpus_per_node, whole=True)
        check(own, "data_cache_gb", self.data_cache_gb)
        check(own, "tier_copies", self.tier_copies)
        check(own, "peer_interval_min", self.peer_interval_min, positive=True)
        check(own, "peer_restart_min", self.peer_restart_min)
        check(own, "peer_share", self.peer_share, hint=" (a fraction of failures: 90 % is 0.9)")
        if self.peer_share > 1:
            raise InputError(
                own,
                f"{{peer_share}} is a fraction of failures: 90 % is 0.9; got {self.peer_share!r}",
                "peer_share",
            )

    @property
    def rate_per_day(self) -> float:
        """Expected failures a day, given or derived from ``gpus`` and ``afr``."""
        if self.failures_per_day is not None:
            return float(self.failures_per_day)
        assert self.gpus is not None and self.afr is not None  # checked in __post_init__
        return failures_per_day(self.gpus, self.afr)

    @property
    def mtbf_hours(self) -> float:
        """Mean time between failures of the whole job, in hours (inf without failures)."""
        rate = self.rate_per_day
        return 24.0 / rate if rate > 0 else math.inf

    @property
    def nodes(self) -> int | None:
        """Nodes of the job (``ceil(gpus / gpus_per_node)``), None when ``gpus`` is unknown."""
        return None if self.gpus is None else -(-self.gpus // self.gpus_per_node)


def expected_goodput(inputs: GoodputInputs, model: str = "first_order") -> float:
    """Expected fraction of wall-clock time spent on productive training (see the module doc)."""
    return goodput_of(
        model,
        inputs.rate_per_day / 24.0,
        inputs.interval_min / 60.0,
        inputs.blocking_s / 3600.0,
        inputs.restart_min / 60.0,
    )


@dataclass(frozen=True)
class Prices:
    """Unit prices; any left None is not priced.

    ``gpu_hour`` per GPU-hour; ``storage_gb_month`` per GB-month of checkpoint storage;
    ``transfer_gb`` per GB written or read back; ``nvme_gb`` per GB of local NVMe staging/cache
    capacity for the whole run (a flat charge, not prorated).
    """

    gpu_hour: float | None = None
    storage_gb_month: float | None = None
    transfer_gb: float | None = None
    nvme_gb: float | None = None

    def __post_init__(self) -> None:
        for name in ("gpu_hour", "storage_gb_month", "transfer_gb", "nvme_gb"):
            check("Prices", name, getattr(self, name), hint=" (or None to leave it unpriced)")


def _price(quantity: float | None, unit_price: float | None) -> float | None:
    return None if quantity is None or unit_price is None else quantity * unit_price


@dataclass(frozen=True)
class TimeLoss:
    """Wall-clock hours of the run lost to one cause; GPU-hours and money where known."""

    hours: float
    gpu_hours: float | None
    cost: float | None


@dataclass(frozen=True)
class CostAccount:
    """What failures and checkpointing cost over the run (first-order model).

    ``saves = run_hours / interval``; ``restores`` = expected failures, each reading one
    checkpoint back. Storage is ``keep_last * checkpoint_gb`` for the whole run (an upper
    bound: it ignores the ramp-up). Local tier disk per node is ``tier_copies *
    checkpoint_gb / nodes + data_cache_gb``; None when ``gpus`` is unknown. Storage, transfer
    and staging disk are None when ``checkpoint_gb`` is.
    """

    run_hours: float
    failure_rework: TimeLoss
    failure_restarts: TimeLoss
    checkpoint_blocking: TimeLoss
    saves: float
    restores: float
    storage_gb_months: float | None
    storage_cost: float | None
    transfer_gb: float | None
    transfer_cost: float | None
    nodes: int | None
    staging_gb_per_node: float | None
    staging_gb_total: float | None
    nvme_cost: float | None

    @property
    def lost_hours(self) -> float:
        """Wall-clock hours lost to failures and blocking saves together."""
        return sum(
            x.hours for x in (self.failure_rework, self.failure_restarts, self.checkpoint_blocking)
        )

    @property
    def total_cost(self) -> float | None:
        """Sum of the priced items (unpriced ones count 0); None when nothing is priced."""
        costs = [
            c
            for c in (
                self.failure_rework.cost,
                self.failure_restarts.cost,
                self.checkpoint_blocking.cost,
                self.storage_cost,
                self.transfer_cost,
                self.nvme_cost,
            )
            if c is not None
        ]
        return sum(costs) if costs else None


@dataclass(frozen=True)
class GoodputReport:
    """Result of :func:`plan`. Probabilities and goodputs are fractions; intervals in minutes."""

    inputs: GoodputInputs
    failures_per_day: float
    mtbf_hours: float
    failure_probability: float
    expected_failures: float
    goodput: float
    goodput_exponential: float
    young_interval_min: float
    goodput_at_young: float
    daly_interval_min: float
    goodput_exponential_at_daly: float
    account: CostAccount
    #: First-order goodput with the peer tier as well (None: no ``peer_interval_min``).
    goodput_with_peers: float | None = None


def plan(inputs: GoodputInputs, prices: Prices | None = None) -> GoodputReport:
    """Goodput, failure odds, optimal intervals and the cost account for ``inputs``."""
    p = prices or Prices()
    rate_d = inputs.rate_per_day
    rate_h = rate_d / 24.0
    mtbf_h = inputs.mtbf_hours
    tau_h, cost_h = inputs.interval_min / 60.0, inputs.blocking_s / 3600.0
    restart_h = inputs.restart_min / 60.0
    run_h = inputs.days * 24.0
    failures = rate_d * inputs.days
    saves = run_h / tau_h
    young_h = young_interval(cost_h, mtbf_h)
    daly_h = daly_interval(cost_h, mtbf_h)

    def loss(hours: float) -> TimeLoss:
        gpu_h = None if inputs.gpus is None else hours * inputs.gpus
        return TimeLoss(hours, gpu_h, _price(gpu_h, p.gpu_hour))

    size = inputs.checkpoint_gb
    storage = transfer = None
    if size is not None:
        storage = inputs.keep_last * size * inputs.days / _DAYS_PER_MONTH
        transfer = (saves + failures) * size
    nodes = inputs.nodes
    per_node = total_disk = None
    if nodes is not None and size is not None:
        per_node = inputs.tier_copies * size / nodes + inputs.data_cache_gb
        total_disk = per_node * nodes
    account = CostAccount(
        run_hours=run_h,
        failure_rework=loss(failures * tau_h / 2.0),
        failure_restarts=loss(failures * restart_h),
        checkpoint_blocking=loss(saves * cost_h),
        saves=saves,
        restores=failures,
        storage_gb_months=storage,
        storage_cost=_price(storage, p.storage_gb_month),
        transfer_gb=transfer,
        transfer_cost=_price(transfer, p.transfer_gb),
        nodes=nodes,
        staging_gb_per_node=per_node,
        staging_gb_total=total_disk,
        nvme_cost=_price(total_disk, p.nvme_gb),
    )
    return GoodputReport(
        inputs=inputs,
        failures_per_day=rate_d,
        mtbf_hours=mtbf_h,
        failure_probability=failure_probability(rate_d, inputs.days),
        expected_failures=failures,
        goodput=expected_goodput(inputs),
        goodput_exponential=expected_goodput(inputs, "exponential"),
        young_interval_min=young_h * 60.0,
        goodput_at_young=goodput_of("first_order", rate_h, young_h, cost_h, restart_h),
        daly_interval_min=daly_h * 60.0,
        goodput_exponential_at_daly=goodput_of("exponential", rate_h, daly_h, cost_h, restart_h),
        account=account,
        goodput_with_peers=_with_peers(inputs, rate_h),
    )


def _with_peers(inputs: GoodputInputs, rate_h: float) -> float | None:
    """The two-tier goodput of ``inputs`` (None without a peer tier)."""
    if inputs.peer_interval_min is None:
        return None
    peer_restart = (
        inputs.restart_min if inputs.peer_restart_min is None else inputs.peer_restart_min
    )
    return two_tier_goodput(
        rate_h,
        inputs.peer_share,
        inputs.peer_interval_min / 60.0,
        inputs.interval_min / 60.0,
        inputs.blocking_s / 3600.0,
        peer_restart / 60.0,
        inputs.restart_min / 60.0,
    )


def report_rows(report: GoodputReport, currency: str = "$") -> list[tuple[str, float, str]]:
    """The report as ``(label, value, unit)`` table rows, fractions in percent.

    Unknown or unpriced items are left out; money is labelled ``currency``. Without a
    checkpoint cost (``blocking_s == 0``) the optimal-interval rows and the blocking loss are
    left out too: with free saves the optimum is to save continuously, which plans nothing.
    """
    a, cur = report.account, currency
    costly = report.inputs.blocking_s > 0
    rows: list[tuple[str, float | None, str]] = [
        ("Failures per day", report.failures_per_day, "1/day"),
        ("Mean time between failures", report.mtbf_hours, "h"),
        ("P(at least one failure during the run)", 100.0 * report.failure_probability, "%"),
        ("Expected failures during the run", report.expected_failures, "failures"),
        ("Checkpoint interval", report.inputs.interval_min, "min"),
        ("Goodput (first-order model)", 100.0 * report.goodput, "%"),
        ("Goodput (exponential model)", 100.0 * report.goodput_exponential, "%"),
    ]
    if report.goodput_with_peers is not None:
        rows += [
            ("Peer tier interval", report.inputs.peer_interval_min, "min"),
            ("Failures the peer tier survives", 100.0 * report.inputs.peer_share, "%"),
            ("Goodput with the peer tier (first-order)", 100.0 * report.goodput_with_peers, "%"),
            ("Gain of the peer tier", 100.0 * (report.goodput_with_peers - report.goodput), "pp"),
        ]
    if costly:
        rows += [
            ("Young optimal interval", report.young_interval_min, "min"),
            ("Goodput at Young interval (first-order)", 100.0 * report.goodput_at_young, "%"),
            ("Daly optimal interval", report.daly_interval_min, "min"),
            (
                "Goodput at Daly interval (exponential)",
                100.0 * report.goodput_exponential_at_daly,
                "%",
            ),
        ]
    rows.append(("Run length", a.run_hours, "h"))
    losses = [("re-done work after failures", a.failure_rework), ("restarts", a.failure_restarts)]
    if costly:
        losses.append(("blocking checkpoint saves", a.checkpoint_blocking))
    for label, item in losses:
        rows += [
            (f"Lost to {label}", item.hours, "h"),
            (f"Lost to {label}", item.gpu_hours, "GPU-h"),
            (f"Lost to {label}", item.cost, cur),
        ]
    rows += [
        ("Checkpoints written", a.saves, "checkpoints"),
        ("Restores", a.restores, "checkpoints"),
        ("Checkpoint storage", a.storage_gb_months, "GB-month"),
        ("Checkpoint storage", a.storage_cost, cur),
        ("Transfer (saves + restores)", a.transfer_gb, "GB"),
        ("Transfer (saves + restores)", a.transfer_cost, cur),
        ("Nodes", None if a.nodes is None else float(a.nodes), "nodes"),
        ("Staging + cache disk per node", a.staging_gb_per_node, "GB"),
        ("Staging + cache disk, all nodes", a.staging_gb_total, "GB"),
        ("Staging + cache disk", a.nvme_cost, cur),
        ("Total (priced items)", a.total_cost, cur),
    ]
    return [(label, float(value), unit) for label, value, unit in rows if value is not None]
