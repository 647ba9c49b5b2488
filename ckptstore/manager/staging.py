"""The thread backend's staging: one reused arena of host memory, optionally bounded.

Call order (the manager's one-save-in-flight rule: nobody reads the arena while ``stage``
writes it)::

    stager = ArenaStager(budget=None, pin=torch.cuda.is_available())
    staged = stager.stage(state)     # training thread: every tensor that fits the budget
                                     # copied into the arena, the rest of the state
                                     # deep-copied; a StagedSave, or None when the state
                                     # holds non-plain tensors and there is no budget (the
                                     # caller stages it with DCP's DefaultStager instead)
    staged.state                     # what the save writes: arena views, the copies, and
                                     # the *live* tensors (training's own, not copied)
    staged.is_live(tensor)           # True for a tensor whose bytes are not in the arena
    staged.release()                 # the save wrote every live tensor (or gave up)
    staged.wait_released()           # training thread: returns after ``release``; both
                                     # return the seconds training waited for it
    stager.close()                   # frees the arena

Without a budget every plain dense tensor is staged and nothing is live. With
``budget=B`` the arena never holds more than B bytes (64-byte alignment padding counted):
tensors are placed first-fit in the state's order, and each that does not fit, like
every DTensor / ShardedTensor / sparse tensor, stays live: the save writes those first,
in files of their own, and training waits for them (``wait_released``). So a state larger
than the budget costs blocking time of about the write time of the part that did not fit,
and never more host memory than the budget. ``in_use`` / ``peak_in_use`` count the
arena bytes holding a staged copy (what the budget bounds). The arena is allocated once
and reused while the tensors' dtypes and shapes stay the same; a layout that needs more
room (and the budget allows) allocates a larger one.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptstore.dcp.shared_staging import ALIGN, Slot, _fill, _Hole
from ckptstore.errors import ConfigError

__all__ = ["ArenaStager", "StagedSave", "check_budget"]


def check_budget(value: object) -> int | None:
    """``value`` as a staging budget in bytes (None: unbounded); ConfigError if it is not one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"max_staging_bytes must be a positive number of bytes (or None for no limit), "
            f"not {value!r}"
        )
    return value


@dataclass
class StagedSave:
    """One staged state and the live tensors it still needs; see the module docstring."""

    state: dict[str, Any]
    nbytes: int  # every tensor's bytes, staged or live
    live_bytes: int  # the bytes of the live tensors
    _lo: int = 0  # the arena's address range: [lo, hi)
    _hi: int = 0
    _released: threading.Event = field(default_factory=threading.Event)
    _staged_at: float = field(default_factory=time.perf_counter)
    _waited: float = 0.0

    @property
    def has_live(self) -> bool:
        """True when part of the state was not copied (training must wait for its write)."""
        return self.live_bytes > 0

    def is_live(self, tensor: torch.Tensor) -> bool:
        """True when ``tensor``'s bytes are not in the arena (training's own memory)."""
        if tensor.numel() == 0:
            return False
        ptr = tensor.data_ptr()
        return not (self._lo <= ptr < self._hi)

    def release(self) -> float:
        """Say that no live tensor is needed any more: the seconds from the end of ``stage``
        until the first call (what training waits beyond the copy; 0.0 with nothing
        live), the same on every call."""
        if not self._released.is_set():
            if self.has_live:
                self._waited = time.perf_counter() - self._staged_at
            self._released.set()
        return self._waited

    def wait_released(self) -> float:
        """Return once ``release`` was called (at once when nothing is live): its value."""
        if not self.has_live:
            return 0.0
        self._released.wait()
        return self._waited


class ArenaStager:
    """Copies states into one reused host-memory arena of at most ``budget`` bytes."""

    def __init__(self, *, budget: int | None = None, pin: bool = False) -> None:
        self.budget = check_budget(budget)
        self.pin = pin
        self.arena: torch.Tensor | None = None
        #: Arenas allocated so far (steady saves allocate none).
        self.allocations = 0
        #: Arena bytes holding the current staged copies, and the most ever held.
        self.in_use = 0
        self.peak_in_use = 0
        self._key: tuple | None = None
        self._slots: list[Slot | None] = []  # per tensor: its slot, or None (live)
        self._views: list[torch.Tensor | None] = []

    @torch.no_grad()
    def stage(self, state: dict[str, Any]) -> StagedSave | None:
        """Copy ``state`` out of training's hands as far as the budget allows.

        Returns None (nothing copied) when ``state`` holds a tensor that is not plain and
        dense and there is no budget: the caller stages it another way. Returns once every
        copy is done (CUDA copies included).
        """
        tensors: list[torch.Tensor] = []
        plain: list[bool] = []
        skeleton = _strip(state, tensors, plain)
        if self.budget is None and not all(plain):
            return None
        key = tuple((t.dtype, tuple(t.shape), ok) for t, ok in zip(tensors, plain, strict=True))
        if key != self._key:
            self._layout(key)
        cuda = False
        for dst, src in zip(self._views, tensors, strict=True):
            if dst is None:
                continue
            non_blocking = self.pin and src.device.type == "cuda"
            dst.copy_(src, non_blocking=non_blocking)
            cuda = cuda or non_blocking
        if cuda:
            torch.cuda.synchronize()
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        items = [
            view if view is not None else src
            for view, src in zip(self._views, tensors, strict=True)
        ]
        staged_state = _fill(copy.deepcopy(skeleton), lambda i: items[i])
        total = sum(_nbytes(t) for t in tensors)
        live = sum(_nbytes(t) for t, v in zip(tensors, self._views, strict=True) if v is None)
        lo = self.arena.data_ptr() if self.arena is not None else 0
        hi = lo + (self.arena.numel() if self.arena is not None else 0)
        return StagedSave(staged_state, total, live, lo, hi)

    def _layout(self, key: tuple) -> None:
        slots: list[Slot | None] = []
        offset = 0
        for dtype, shape, ok in key:
            numel = 1
            for d in shape:
                numel *= d
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            padded = -(-nbytes // ALIGN) * ALIGN
            if not ok or (self.budget is not None and offset + padded > self.budget):
                slots.append(None)  # live: written from training's memory, first
                continue
            slots.append(Slot(offset, nbytes, dtype, shape))
            offset += padded
        self._views = []
        if offset and (self.arena is None or self.arena.numel() < offset):
            self.arena = None  # the old arena is freed before the new one is allocated
            self.arena = torch.empty(offset, dtype=torch.uint8, pin_memory=self.pin)
            self.allocations += 1
        whole = self.arena
        self._views = [
            None
            if s is None or whole is None
            else whole[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)
            for s in slots
        ]
        self.in_use = offset
        self._key, self._slots = key, slots

    def close(self) -> None:
        """Free the arena; the next ``stage`` allocates anew."""
        self._views, self._slots, self._key = [], [], None
        self.arena = None
        self.in_use = 0


def _nbytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel() * local.element_size())


def _is_plain(t: torch.Tensor) -> bool:
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.is_nested
        and t.device.type != "meta"
    )


def _strip(obj: Any, tensors: list[torch.Tensor], plain: list[bool]) -> Any:
    """``obj`` with every tensor replaced by a hole (containers rebuilt, the rest as is)."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        plain.append(_is_plain(obj))
        return _Hole(len(tensors) - 1)
    if isinstance(obj, dict):
        out = copy.copy(obj)
        for k, v in obj.items():
            out[k] = _strip(v, tensors, plain)
        return out
    if isinstance(obj, list):
        return [_strip(v, tensors, plain) for v in obj]
    if isinstance(obj, tuple):
        values = [_strip(v, tensors, plain) for v in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    return obj
