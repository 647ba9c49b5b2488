"""Named crash points for fault-injection tests (a real SIGKILL, or SIGSTOP, at a named point).

``crashpoint("after_shards")`` kills the calling process with SIGKILL when the
environment variable ``CKPTSTORE_CRASH_AT`` names that point (``after_shards``) or that
point on its Nth visit (``after_shards:3``), and optionally only on one rank
(``CKPTSTORE_CRASH_RANK``). With ``CKPTSTORE_CRASH_SIGNAL=STOP`` it stops the process
there instead (every thread, as a cgroup freezer or a VM pause would), for a test to
resume with SIGCONT. It costs one environment lookup otherwise.

Points: ``after_shards`` (a rank's data files are durable), ``mid_upload`` (a staged
file is half uploaded), ``before_marker`` (manifest + .metadata written, no fence),
``after_fence`` (the attempt's commit fence taken, its files not yet checked),
``after_check`` (its files checked, no marker), ``after_marker`` (committed, before
canonical copies and cleanup); in the deletion path (``engine.deletion``):
``after_unmark`` (a step's marker deleted, its files not yet), ``after_condemn`` (an
attempt's delete fence taken, its files not yet deleted) and ``after_step_deleted`` (a
step's files deleted). The commit and deletion points
run on the coordinator alone (rank 0: it commits, and retention runs there), so pairing
one with ``CKPTSTORE_CRASH_RANK`` naming another rank is refused (``ConfigError`` from the
first crash point any rank reaches) instead of never firing.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

from ckptstore.errors import ConfigError

__all__ = ["crashpoint", "COORDINATOR_POINTS"]

_visits: Counter[str] = Counter()

#: Points only the coordinator (rank 0) reaches.
COORDINATOR_POINTS = frozenset(
    {
        "before_marker",
        "after_fence",
        "after_check",
        "after_marker",
        "after_unmark",
        "after_condemn",
        "after_step_deleted",
    }
)


def crashpoint(name: str) -> None:
    """SIGKILL (or SIGSTOP) this process if ``CKPTSTORE_CRASH_AT`` names point ``name``;
    else return.

    With ``name:N`` only the Nth visit of this process (counted while the rank matches)
    kills; with ``CKPTSTORE_CRASH_RANK`` set, only the process whose ``RANK`` (``0`` when
    unset) equals it.
    """
    spec = os.environ.get("CKPTSTORE_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    rank = os.environ.get("CKPTSTORE_CRASH_RANK")
    if point in COORDINATOR_POINTS and rank not in (None, "0"):
        raise ConfigError(
            f"CKPTSTORE_CRASH_AT={spec} with CKPTSTORE_CRASH_RANK={rank} would never fire: "
            f"{point} is reached by the coordinator (rank 0) alone; set "
            "CKPTSTORE_CRASH_RANK=0 or leave it unset"
        )
    if point != name:
        return
    if rank is not None and rank != os.environ.get("RANK", "0"):
        return
    _visits[name] += 1
    if not nth or _visits[name] == int(nth):
        stop = os.environ.get("CKPTSTORE_CRASH_SIGNAL", "KILL").upper() == "STOP"
        os.kill(os.getpid(), signal.SIGSTOP if stop else signal.SIGKILL)
