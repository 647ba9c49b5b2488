"""Helpers shared by the object-store backends (GCS, Azure, S3): endpoint reachability,
and a few requests at once (``parallel``).

A refused connection or an unknown host on a store's *first* request almost always means
a wrong endpoint or URL, so it fails fast with ``StoreAccessError`` naming the endpoint.
Once the endpoint has answered at least once, the same failures are treated as
transient (a restarting proxy, a flapping link) and the engine retries them.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ckptstore.errors import StoreAccessError, TransientStoreError

__all__ = ["Reachability", "refused", "parallel"]


def _causes(exc: BaseException, depth: int = 0) -> list[BaseException]:
    """``exc`` and every exception it wraps (``__cause__``, SDK ``inner_exception`` ...)."""
    if depth > 8:
        return [exc]
    out = [exc]
    linked: list[object] = [
        exc.__cause__,
        exc.__context__,
        getattr(exc, "inner_exception", None),
        getattr(exc, "reason", None),
        getattr(exc, "os_error", None),
        *exc.args,
    ]
    for inner in linked:
        if isinstance(inner, BaseException) and inner is not exc:
            out.extend(_causes(inner, depth + 1))
    return out


def refused(exc: BaseException) -> bool:
    """True if ``exc`` comes from a refused connection or a failed host-name lookup."""
    for e in _causes(exc):
        if isinstance(e, ConnectionRefusedError | socket.gaierror):
            return True
        text = str(e)
        if "Connection refused" in text or "Name or service not known" in text:
            return True
    return False


class Reachability:
    """Whether a client has ever got an answer from ``endpoint`` (shared by child stores)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.reached = False

    def connection_error(self, exc: BaseException, what: str) -> Exception:
        """The ckptstore error for a connection-level failure of ``what``."""
        if refused(exc) and not self.reached:
            return StoreAccessError(
                f"{what}: cannot connect to {self.endpoint} ({exc}). Nothing answered there: "
                "check the URL and the endpoint in storage_options, and that the service is "
                "reachable from this machine."
            )
        return TransientStoreError(f"{what}: connection to {self.endpoint} failed ({exc})")


def parallel(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``, up to 16 at a time (deletes, compose tree levels, the
    ranges of a server-side copy)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(16, len(items)), thread_name_prefix="ckptstore-req") as pool:
        return list(pool.map(fn, items))
