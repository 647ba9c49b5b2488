"""Named crash points for kill -9 fault-injection tests (a real SIGKILL at a named point).

``crashpoint("after_shards")`` kills the calling process with SIGKILL when the
environment variable ``CKPTSTORE_CRASH_AT`` names that point (``after_shards``) or that
point on its Nth visit (``after_shards:3``), and optionally only on one rank
(``CKPTSTORE_CRASH_RANK``). It costs one environment lookup otherwise.

Points: ``after_shards`` (a rank's data files are durable), ``mid_upload`` (a staged
file is half uploaded), ``before_marker`` (manifest + .metadata written, no marker),
``after_marker`` (committed, before canonical copies and cleanup); in the deletion path
(``engine.deletion.delete_step``): ``after_unmark`` (a step's marker deleted, its files not
yet) and ``after_step_deleted`` (a step's files deleted).
"""

from __future__ import annotations

import os
import signal
from collections import Counter

__all__ = ["crashpoint"]

_visits: Counter[str] = Counter()


def crashpoint(name: str) -> None:
    """SIGKILL this process if ``CKPTSTORE_CRASH_AT`` names point ``name``; else return.

    With ``name:N`` only the Nth visit of this process (counted while the rank matches)
    kills; with ``CKPTSTORE_CRASH_RANK`` set, only the process whose ``RANK`` (``0`` when
    unset) equals it.
    """
    spec = os.environ.get("CKPTSTORE_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    rank = os.environ.get("CKPTSTORE_CRASH_RANK")
    if rank is not None and rank != os.environ.get("RANK", "0"):
        return
    _visits[name] += 1
    if not nth or _visits[name] == int(nth):
        os.kill(os.getpid(), signal.SIGKILL)
