"""Lightning's checkpoint dict <-> a flat DCP state dict, and loads without a template.

Lightning hands the plugin one nested object (its checkpoint dict). DCP loads *into* a
state dict it is given, so with no live objects to load into the plugin needs every
item's shape and dtype first: ``ckptstore.api.empty_state_dict`` reads them from the
checkpoint's DCP metadata. Call order::

    flat = pack(obj)                           # {"t/<path>": tensor, ..., OBJECTS_KEY: uint8}
    mgr.save(step, flat)                       # CheckpointManager: async, committed, verified
    flat = load_step(mgr, step)                # or load_newest(mgr): newest first, falls back
    obj = unpack(flat, weights_only=...)       # the same nested object, tensors on the CPU

``pack`` keeps every tensor found in nested dicts, lists and tuples as a DCP tensor under
its path, and ``torch.save``-s the rest of the structure (each tensor replaced by a meta
tensor of the same shape and dtype) into one uint8 tensor, so ``weights_only`` loading is
honoured exactly as ``torch.load`` honours it.
"""

from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ckptstore import CheckpointManager, newer_steps, step_name
from ckptstore.api import empty_state_dict
from ckptstore.errors import (
    ConfigError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NewerFormatError,
    NoLoadableCheckpointError,
)

__all__ = [
    "OBJECTS_KEY",
    "TENSOR_PREFIX",
    "pack",
    "unpack",
    "load_step",
    "load_newest",
]

#: The uint8 tensor holding the ``torch.save``-d structure.
OBJECTS_KEY = "objects"
#: Every packed tensor's key starts with this (so it never collides with OBJECTS_KEY).
TENSOR_PREFIX = "t/"


def _to_uint8(data: bytes) -> torch.Tensor:
    """``data`` as a 1-D uint8 tensor (a copy, so it is safe to stage)."""
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )


def _from_uint8(t: torch.Tensor) -> bytes:
    return t.contiguous().numpy().tobytes()


def _map_tensors(obj: Any, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> Any:
    """A copy of ``obj`` with every tensor in its dicts/lists/tuples replaced by ``fn``.

    Keys are ``t/<path>`` with '/'-joined dict keys and list indices; a clash (say the
    keys ``1`` and ``"1"``) gets ``#<n>``. The walk is deterministic, so the keys made
    while packing are made again, in the same order, while unpacking.
    """
    seen: set[str] = set()

    def key(path: tuple[Any, ...]) -> str:
        k = TENSOR_PREFIX + "/".join(str(p) for p in path)
        base, n = k, 1
        while k in seen:
            k, n = f"{base}#{n}", n + 1
        seen.add(k)
        return k

    def walk(o: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(o, torch.Tensor):
            return fn(key(path), o)
        if isinstance(o, dict):
            out = copy.copy(o)  # keeps OrderedDict / AttributeDict and their attributes
            for k, v in o.items():
                out[k] = walk(v, (*path, k))
            return out
        if isinstance(o, list):
            return [walk(v, (*path, i)) for i, v in enumerate(o)]
        if isinstance(o, tuple):
            items = [walk(v, (*path, i)) for i, v in enumerate(o)]
            return type(o)(*items) if hasattr(o, "_fields") else type(o)(items)
        return o

    return walk(obj, ())


def pack(obj: Any) -> dict[str, torch.Tensor]:
    """``obj`` as a flat DCP state dict (tensors as tensors, the rest as one object)."""
    flat: dict[str, torch.Tensor] = {}

    def take(k: str, t: torch.Tensor) -> torch.Tensor:
        flat[k] = t.detach()
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    skeleton = _map_tensors(obj, take)
    buf = io.BytesIO()
    torch.save(skeleton, buf)
    flat[OBJECTS_KEY] = _to_uint8(buf.getvalue())
    return flat


def unpack(flat: dict[str, torch.Tensor], weights_only: bool | None = None) -> Any:
    """The object ``pack`` was given, from the loaded flat state dict."""
    if OBJECTS_KEY not in flat:
        raise ConfigError(
            f"this checkpoint has no {OBJECTS_KEY!r} item: it was not written by a ckptstore "
            "plugin; load it with ckptstore.load and your own state dict"
        )
    skeleton = torch.load(io.BytesIO(_from_uint8(flat[OBJECTS_KEY])), weights_only=weights_only)

    def put(k: str, meta: torch.Tensor) -> torch.Tensor:
        t = flat.get(k)
        if t is None or t.shape != meta.shape or t.dtype != meta.dtype:
            raise CorruptCheckpointError(
                f"item {k!r} is missing or has the wrong shape/dtype; the checkpoint's "
                "structure and tensors disagree"
            )
        return t

    return _map_tensors(skeleton, put)


def load_step(mgr: CheckpointManager, step: int) -> dict:
    """The verified items of committed ``step`` (raises if it is torn or corrupt)."""
    flat = empty_state_dict(mgr.root.child(step_name(step)))
    mgr.restore(flat, step=step)
    return flat


def load_newest(mgr: CheckpointManager) -> tuple[int, dict] | None:
    """(step, items) of the newest committed step that verifies, or None if the root
    holds no committed step.

    A step that fails verification, or that a newer torch or ckptstore wrote, is skipped
    with a warning naming what was wrong, as ``CheckpointManager.restore`` does; if every
    one is, ``NoLoadableCheckpointError`` lists them (never a silent fresh start).
    """
    refused: list[tuple[int, str]] = []
    for step in reversed(mgr.steps()):
        try:
            return step, load_step(mgr, step)
        except (CorruptCheckpointError, IncompleteCheckpointError, NewerFormatError) as exc:
            refused.append((step, str(exc)))
            warnings.warn(
                f"checkpoint step {step} could not be restored ({exc}); falling back to the "
                "previous committed step",
                RuntimeWarning,
                stacklevel=2,
            )
    refused += newer_steps(mgr.root)  # committed, yet not among mgr.steps()
    if refused:
        raise NoLoadableCheckpointError.of(mgr.root.url, sorted(refused, reverse=True))
    return None
