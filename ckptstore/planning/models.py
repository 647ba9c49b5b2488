"""The failure and goodput models: pure functions of rates and times (no I/O, no torch).

Failures are a Poisson process. A per-GPU annual failure rate ``afr`` is a rate (failures per
GPU-year), so ``gpus`` GPUs fail ``gpus * afr / 365`` times a day and::

    P(at least one failure in `days`) = 1 - exp(-failures_per_day * days)

(1 % AFR, 30 days: 256 GPUs -> 19.0 %, 1,024 GPUs -> 56.9 %. The compounding form
``1 - (1 - afr) ** (gpus * days / 365)`` gives 19.1 % / 57.1 %; we keep the exponential one
because it is the same process the goodput models assume.) Goodput = productive training
time / wall-clock time; its two models (Young's first order, Daly's exponential) and their
optimal intervals are :func:`goodput_of`'s docstring.
"""

from __future__ import annotations

import math

from ckptstore.errors import ConfigError
from ckptstore.planning.checks import check, check_afr

__all__ = [
    "MODELS",
    "daly_interval",
    "failure_probability",
    "failures_per_day",
    "goodput_of",
    "two_tier_goodput",
    "young_interval",
]

MODELS = ("first_order", "exponential")
_DAYS_PER_YEAR = 365.0


def failures_per_day(gpus: int, afr: float) -> float:
    """Expected failures a day of ``gpus`` GPUs, each failing at ``afr`` per year (0.01 = 1 %)."""
    check("failures_per_day", "gpus", gpus, whole=True)
    check_afr("failures_per_day", afr)
    return gpus * afr / _DAYS_PER_YEAR


def failure_probability(failures_per_day: float, days: float) -> float:
    """Probability of at least one failure in ``days``: ``1 - exp(-failures_per_day * days)``."""
    check("failure_probability", "failures_per_day", failures_per_day)
    check("failure_probability", "days", days)
    return -math.expm1(-failures_per_day * days)


def young_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Young's optimal training time between saves, ``sqrt(2 * C * MTBF)``.

    ``checkpoint_cost`` (blocking time of one save) and ``mtbf`` share one unit, which is also
    the unit of the result. ``mtbf`` may be ``math.inf`` (no failures): the result is then inf.
    """
    check("young_interval", "checkpoint_cost", checkpoint_cost)
    if not mtbf > 0:
        raise ConfigError(f"young_interval.mtbf must be > 0; got {mtbf!r}")
    if checkpoint_cost == 0:
        return 0.0
    return math.sqrt(2.0 * checkpoint_cost) * math.sqrt(mtbf)  # no under/overflow of C*M


def daly_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Daly's higher-order optimal training time between saves (same units as the inputs).

    ``sqrt(2*C*M) * (1 + s/3 + s**2/9) - C`` with ``s = sqrt(C / (2*M))`` when ``C < 2*M``,
    else ``M``. Never longer than :func:`young_interval`. As published it jumps at ``C = 2*M``
    (from ``8/9 * M`` to ``M``), so it is not monotone in ``mtbf`` across that point.
    """
    check("daly_interval", "checkpoint_cost", checkpoint_cost)
    if not mtbf > 0:
        raise ConfigError(f"daly_interval.mtbf must be > 0; got {mtbf!r}")
    if checkpoint_cost == 0 or math.isinf(mtbf):
        return young_interval(checkpoint_cost, mtbf)
    if checkpoint_cost >= 2.0 * mtbf:
        return mtbf
    s = math.sqrt(checkpoint_cost / (2.0 * mtbf))
    # = sqrt(2*C*M) * (1 + s/3 + s**2/9) - C, since C = sqrt(2*C*M) * s; this form has no
    # cancellation, stays > 0 and is never above Young's (the factor is <= 1).
    return young_interval(checkpoint_cost, mtbf) * (1.0 - 2.0 * s / 3.0 + s * s / 9.0)


def goodput_of(model: str, rate: float, tau: float, cost: float, restart: float) -> float:
    """Goodput of ``model`` for failure rate ``rate`` (1/h) and ``tau``, ``cost``, ``restart`` in
    hours (the formulas below).

    Takes the limits for ``tau`` of 0 or inf and ``rate`` of 0, so optimal intervals of 0
    (free saves) or inf (no failures) can be evaluated.

    Goodput = productive training time / wall-clock time. With failure rate ``lam`` (per
    hour, ``MTBF = 1 / lam``), ``tau`` the training time between two checkpoints, ``C`` the
    time one save blocks training and ``R`` the time a restart takes (all in hours):

    * ``"first_order"`` (default; Young 1974)::

          goodput = 1 - C / tau - lam * (tau / 2 + R)        (clamped to [0, 1])

      Each save costs ``C`` per ``tau`` of training; each failure loses half an interval of
      work on average plus the restart. With ``C = R = 0`` this is ``1 - lam * tau / 2``:
      8.6 failures a day at a 2 h interval -> 64.2 %, at 30 min -> 91.0 %. The model drops
      second-order terms, so it is a lower bound on the exponential model, good while
      ``C << tau << MTBF``. Its exact optimum is Young's ``tau = sqrt(2 * C * MTBF)``.

    * ``"exponential"`` (Daly 2006, failures may also hit saves and restarts)::

          goodput = (tau / M) * exp(-R / M) / (exp((tau + C) / M) - 1)     with M = MTBF

      The same two cases give 68.4 % and 91.3 %. Daly's higher-order interval approximates
      its optimum: ``sqrt(2*C*M) * (1 + s/3 + s**2/9) - C`` with ``s = sqrt(C / (2*M))``
      for ``C < 2*M``, else ``M``.
    """
    if model == "first_order":
        blocking = (math.inf if cost > 0 else 0.0) if tau == 0 else cost / tau
        rework = (math.inf if rate > 0 else 0.0) if math.isinf(tau) else rate * tau / 2.0
        return min(1.0, max(0.0, 1.0 - blocking - rework - rate * restart))
    if model == "exponential":
        if rate == 0:
            return 1.0 if tau + cost == 0 else (tau / (tau + cost) if math.isfinite(tau) else 1.0)
        if math.isinf(tau):
            return 0.0
        period = rate * (tau + cost)
        if period == 0:
            return math.exp(-rate * restart)
        try:
            return (rate * tau) * math.exp(-rate * restart) / math.expm1(period)
        except OverflowError:
            return 0.0
    raise ConfigError(f"goodput model must be one of {MODELS}; got {model!r}")


def two_tier_goodput(
    rate: float,
    share: float,
    local_tau: float,
    root_tau: float,
    cost: float,
    local_restart: float,
    root_restart: float,
) -> float:
    """First-order goodput of two checkpoint tiers (multi-level, as in SCR: Moody et al.).

    A fast tier (the local tier with peer replicas) every ``local_tau`` hours and the
    bucket every ``root_tau``; a failure is survived by the fast tier with probability
    ``share`` (a worker crash, or fewer nodes lost than there are replicas) and needs the
    bucket otherwise. Each save blocks ``cost`` hours (the staging copy, whichever tier it
    goes to), a restart takes ``local_restart`` or ``root_restart`` hours::

        goodput = 1 - C / tau_L
                    - lam * (share * (tau_L / 2 + R_L) + (1 - share) * (tau_R / 2 + R_R))

    clamped to [0, 1]. With ``tau_L = tau_R`` and ``R_L = R_R`` it is :func:`goodput_of`'s
    first-order model. The MISSION example (8.6 failures a day, free
    saves and restarts): the bucket every 2 h alone gives 64.2 %; with a peer tier every
    30 min surviving 90 % of failures, 88.4 % (every failure survived: 91.0 %)."""
    if local_tau <= 0:
        return 0.0 if cost > 0 else 1.0
    rework = share * (local_tau / 2.0 + local_restart) + (1.0 - share) * (
        root_tau / 2.0 + root_restart
    )
    return min(1.0, max(0.0, 1.0 - cost / local_tau - rate * rework))
