"""Safe unpickling of DCP object items: ``torch.load(weights_only=True)`` first.

An object (BYTE_IO) item reaches DCP's own unpickling only after a ``weights_only=True``
load of the same bytes succeeded; else ``UnsafePickleError`` names the item (unless the
reader allows pickles, for a checkpoint one trusts). The CLI's safe loads use
:func:`load_safe_object` too.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadPlanner

from ckptstore.errors import UnsafePickleError

__all__ = ["check_safe_object", "load_safe_object", "unpickles_unsafely"]


def unpickles_unsafely(planner: LoadPlanner) -> bool:
    """True if ``planner`` hands object bytes to ``torch.load(weights_only=False)``: DCP's
    default planner does (a planner of one's own is its author's to make safe)."""
    return isinstance(planner, DefaultLoadPlanner) and (
        type(planner).load_bytes is DefaultLoadPlanner.load_bytes
    )


def load_safe_object(data: bytes | memoryview) -> Any:
    """Unpickle one DCP object item with ``torch.load(weights_only=True)``: plain
    containers, numbers, strings, tensors, and ``io.BytesIO`` (a value type DCP saves as
    its own kind of item; rebuilding one from bytes runs nothing). Raises what torch raises.
    """
    with torch.serialization.safe_globals([io.BytesIO]):
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def check_safe_object(data: Any, fqn: str, url: str) -> None:
    """Raise ``UnsafePickleError`` unless ``data`` loads with :func:`load_safe_object`:
    nothing else is imported or run."""
    try:
        load_safe_object(data)
    except Exception as exc:  # noqa: BLE001 - any refusal means: do not unpickle it
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsafePickleError(
            f"{url}: object item {fqn!r} is a pickle that weights_only loading refuses "
            f"({reason[:200]}); it was not unpickled. If you trust this checkpoint and "
            "its writer, allow the classes it names with "
            "torch.serialization.add_safe_globals([...]) (ckptstore honours torch's "
            "allowlist), or unpickle anything with ckptstore.reader(url, allow_pickle=True) "
            "(or CheckpointManager(..., allow_pickle=True))."
        ) from None
