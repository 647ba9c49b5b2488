"""What the plugins share: framework state <-> flat DCP state dicts, and template-free loads.

Frameworks hand a plugin one nested object (Lightning's checkpoint dict) or a folder of
files (Hugging Face). DCP loads *into* a state dict it is given, so a plugin that has no
live objects to load into needs every item's shape and dtype first; it reads them from
the checkpoint's DCP metadata. Call order::

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
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

import ckptstore
from ckptstore.engine.catalog import step_name
from ckptstore.errors import ConfigError, CorruptCheckpointError, IncompleteCheckpointError
from ckptstore.manager import CheckpointManager

__all__ = [
    "OBJECTS_KEY",
    "TENSOR_PREFIX",
    "pack",
    "unpack",
    "to_uint8",
    "from_uint8",
    "template",
    "load_step",
    "load_newest",
    "trailing_int",
]

#: The uint8 tensor holding the ``torch.save``-d structure.
OBJECTS_KEY = "objects"
#: Every packed tensor's key starts with this (so it never collides with OBJECTS_KEY).
TENSOR_PREFIX = "t/"


def to_uint8(data: bytes) -> torch.Tensor:
    """``data`` as a 1-D uint8 tensor (a copy, so it is safe to stage)."""
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )


def from_uint8(t: torch.Tensor) -> bytes:
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
    flat[OBJECTS_KEY] = to_uint8(buf.getvalue())
    return flat


def unpack(flat: dict[str, torch.Tensor], weights_only: bool | None = None) -> Any:
    """The object ``pack`` was given, from the loaded flat state dict."""
    if OBJECTS_KEY not in flat:
        raise ConfigError(
            f"this checkpoint has no {OBJECTS_KEY!r} item: it was not written by a ckptstore "
            "plugin; load it with ckptstore.load and your own state dict"
        )
    skeleton = torch.load(io.BytesIO(from_uint8(flat[OBJECTS_KEY])), weights_only=weights_only)

    def put(k: str, meta: torch.Tensor) -> torch.Tensor:
        t = flat.get(k)
        if t is None or t.shape != meta.shape or t.dtype != meta.dtype:
            raise CorruptCheckpointError(
                f"item {k!r} is missing or has the wrong shape/dtype; the checkpoint's "
                "structure and tensors disagree"
            )
        return t

    return _map_tensors(skeleton, put)


def template(mgr: CheckpointManager, step: int, keys: Iterable[str] | None = None) -> dict:
    """Empty CPU tensors for the tensor items of ``step`` (all, or only ``keys``)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = ckptstore.reader(mgr.root.child(step_name(step))).read_metadata().state_dict_metadata
    wanted = set(meta) if keys is None else set(keys)
    missing = wanted - set(meta)
    if missing:
        raise IncompleteCheckpointError(f"step {step} has no item(s) {sorted(missing)}")
    out: dict[str, torch.Tensor] = {}
    for k in sorted(wanted):
        m = meta[k]
        if not isinstance(m, TensorStorageMetadata):
            raise ConfigError(f"item {k!r} of step {step} is not a tensor; not a plugin checkpoint")
        out[k] = torch.empty(m.size, dtype=m.properties.dtype)
    return out


def load_step(mgr: CheckpointManager, step: int, keys: Iterable[str] | None = None) -> dict:
    """The verified items of committed ``step`` (raises if it is torn or corrupt)."""
    flat = template(mgr, step, keys)
    mgr.restore(flat, step=step)
    return flat


def load_newest(
    mgr: CheckpointManager, keys: Iterable[str] | None = None
) -> tuple[int, dict] | None:
    """(step, items) of the newest committed step that verifies, or None if none does.

    A step that fails verification is skipped with a warning naming what was wrong, as
    ``CheckpointManager.restore`` does.
    """
    for step in reversed(mgr.steps()):
        try:
            return step, load_step(mgr, step, keys)
        except (CorruptCheckpointError, IncompleteCheckpointError) as exc:
            warnings.warn(
                f"checkpoint step {step} could not be restored ({exc}); falling back to the "
                "previous committed step",
                RuntimeWarning,
                stacklevel=2,
            )
    return None


def trailing_int(name: str) -> int | None:
    """The number a name ends with (``checkpoint-500`` -> 500, ``step_7`` -> 7), if any."""
    digits = ""
    for ch in reversed(os.path.basename(name.rstrip("/"))):
        if not ch.isdigit():
            break
        digits = ch + digits
    return int(digits) if digits else None
