"""The thread backend's staging: one reused arena of host memory, optionally bounded.

Without a budget every plain dense tensor is copied and nothing is *live*. With
``budget=B`` the arena never holds more than B bytes (64-byte alignment counted):
tensors are placed first-fit in the state's order, and each that does not fit, like
every DTensor / ShardedTensor / sparse tensor, stays live (training's own memory): the
save writes those first and training waits for them, so a state larger than the budget
costs about the write time of what did not fit, never more memory. Each staged tensor
has a storage of its own over its bytes (``HostArena``): a writer saves it as it is,
where a view into one big storage would be cloned first. The arena is reused while the
tensors' dtypes and shapes stay the same; CPU tensors are copied on the rank's share of
the cores (``hostcopy``). Given a ``defer`` predicate, ``stage`` copies the other tensors
only and ``copy_later`` the rest, on the save thread (staging behind the next step); a
state with live tensors is copied whole at once instead.
"""

from __future__ import annotations

import copy
import mmap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptstore.errors import torch_name
from ckptstore.manager.options import check_budget
from ckptstore.manager.saving.hostcopy import HostCopier
from ckptstore.manager.saving.slots import ALIGN, Hole, Slot, allocated, fill, user_values

__all__ = ["ArenaStager", "HostArena", "Prepared", "StagedSave"]


@dataclass(frozen=True)
class Prepared:
    """A state walked by ``ArenaStager.prepare``: its non-tensor values deep-copied (holes
    where the tensors go, filled once by ``stage``), its tensors and which are plain."""

    skeleton: Any
    tensors: list[torch.Tensor]
    plain: list[bool]


@dataclass
class StagedSave:
    """One staged state and the live tensors it still needs; see the module docstring."""

    state: dict[str, Any]
    nbytes: int  # every tensor's bytes, staged or live
    live_bytes: int  # the bytes of the live tensors
    _lo: int = 0  # the arena's address range: [lo, hi)
    _hi: int = 0
    #: The (arena view, tensor) pairs ``ArenaStager.copy_later`` still copies, and the
    #: CUDA event it starts after (``HostCopier.mark``, at ``stage``).
    later: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    later_after: Any = None
    _released: threading.Event = field(default_factory=threading.Event)
    _staged_at: float = field(default_factory=time.perf_counter)
    _waited: float = 0.0

    def __post_init__(self) -> None:
        #: The bytes whose copy was deferred (0: none).
        self.deferred_bytes = sum(_nbytes(src) for _, src in self.later)

    @property
    def has_live(self) -> bool:
        """True when part of the state was not copied (training must wait for its write)."""
        return self.live_bytes > 0

    @property
    def _pending(self) -> bool:
        return self.has_live or self.deferred_bytes > 0

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
            if self._pending:
                self._waited = time.perf_counter() - self._staged_at
            self.later = []
            self._released.set()
        return self._waited

    def wait_released(self) -> float:
        """Return once ``release`` was called (at once when nothing is live or deferred):
        its value."""
        if not self._pending:
            return 0.0
        self._released.wait()
        return self._waited


class HostArena:
    """``size`` bytes of anonymous host memory (pinned with ``pin``); each slot a tensor of
    its own storage over exactly its bytes, so writers save it without a copy (a view into
    one big storage would be cloned first: ``torch.save`` writes a view's whole storage)."""

    def __init__(self, size: int, pin: bool) -> None:
        self.size = size
        self._map: mmap.mmap | None = mmap.mmap(-1, size)
        self._pinned = False
        whole = torch.frombuffer(self._map, dtype=torch.uint8)
        #: The arena's address range, [lo, hi).
        self.lo = whole.data_ptr()
        self.hi = self.lo + size
        del whole
        if pin:
            try:
                with torch_name("torch.cuda._pin_memory_utils"):
                    from torch.cuda import _pin_memory_utils
                _pin_memory_utils.pin_memory(self.lo, size)
            except BaseException:
                self.close()
                raise
            self._pinned = True

    def tensor(self, slot: Slot) -> torch.Tensor:
        """The tensor over ``slot``'s bytes (a new empty one if it has none)."""
        assert self._map is not None, "tensor() after close()"
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=slot.dtype)
        numel = slot.nbytes // torch.empty((), dtype=slot.dtype).element_size()
        flat = torch.frombuffer(self._map, dtype=slot.dtype, count=numel, offset=slot.offset)
        return flat.view(slot.shape)

    def close(self) -> None:
        """Unpin and unmap (once no tensor over it is alive; else when the last one goes)."""
        if self._pinned:
            from torch.cuda import _pin_memory_utils

            _pin_memory_utils.unpin_memory(self.lo)
            self._pinned = False
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a staged tensor is still alive: unmapped when collected
                pass
            self._map = None


class ArenaStager:
    """Copies states into one reused host-memory arena of at most ``budget`` bytes.

    Call order (the manager's one-save-in-flight rule: nobody reads the arena while
    ``stage`` writes it)::

        prepared = stager.prepare(state)  # optional: the state's walk and the deep copy
                                          # of its non-tensor values (ConfigError)
        stager.reserve(prepared)          # optional, once no save reads the arena: lays it
                                          # out and allocates it (StagingMemoryError)
        staged = stager.stage(prepared, defer)
                                          # every tensor that fits copied (but those
                                          # ``defer`` names, when nothing is live), the
                                          # rest of the state deep-copied: a StagedSave,
                                          # or None for non-plain tensors without a budget
                                          # (DCP's DefaultStager stages those instead)
        stager.copy_later(staged)         # the save thread: the deferred copies
        staged.state, staged.is_live(t)   # what the save writes; True for a tensor whose
                                          # bytes are not in the arena
        staged.release()                  # the save wrote every live tensor (or gave up)
        staged.wait_released()            # training thread: returns after ``release``
        stager.close()                    # frees the arena

    ``in_use`` / ``peak_in_use`` count the arena bytes holding a staged copy.
    """

    def __init__(self, *, budget: int | None = None, pin: bool = False) -> None:
        self.budget = check_budget(budget)
        self.pin = pin
        self.arena: HostArena | None = None
        self._copier = HostCopier()
        #: Arenas allocated so far (steady saves allocate none).
        self.allocations = 0
        #: Arena bytes holding the current staged copies, and the most ever held.
        self.in_use = 0
        self.peak_in_use = 0
        self._key: tuple | None = None
        self._slots: list[Slot | None] = []  # per tensor: its slot, or None (live)
        self._views: list[torch.Tensor | None] = []

    def prepare(self, state: dict[str, Any]) -> Prepared:
        """Walk ``state`` and deep-copy what is not a tensor (``stage`` takes the result);
        the arena is not touched, so a save may still be writing from it.

        Raises:
            ConfigError: a non-tensor value of ``state`` cannot be deep-copied.
        """
        tensors: list[torch.Tensor] = []
        plain: list[bool] = []
        skeleton = _strip(state, tensors, plain)
        copied = user_values(
            lambda: copy.deepcopy(skeleton),
            "a save copies the state's non-tensor values, and one of them cannot be copied "
            "({error}); make it copyable (or a tensor, or keep it out of the saved state)",
        )
        return Prepared(copied, tensors, plain)

    def reserve(self, prepared: Prepared) -> None:
        """Lay the arena out for ``prepared``'s tensors, allocating a larger one if they
        no longer fit (nothing when the layout is the current one, or when ``stage`` will
        return None); nothing is copied. ``stage`` does it too; calling it first lets a
        failure be known before a save starts. Only while no save reads the arena.

        Raises:
            StagingMemoryError: the arena could not be allocated (the stager then holds
                none; the next call tries again).
        """
        if self.budget is None and not all(prepared.plain):
            return
        key = _key_of(prepared)
        if key != self._key:
            self._layout(key)

    @torch.no_grad()
    def stage(
        self,
        state: dict[str, Any] | Prepared,
        defer: Callable[[torch.Tensor], bool] | None = None,
    ) -> StagedSave | None:
        """Copy ``state`` (or what ``prepare`` made of it) out of training's hands as far
        as the budget allows; the tensors ``defer`` is true for are left to
        ``copy_later`` (unless some tensor stays live: then everything that fits is
        copied now).

        Returns None (nothing copied) when ``state`` holds a tensor that is not plain and
        dense and there is no budget: the caller stages it another way. Returns once every
        copy is done (CUDA copies included). Raises ``StagingMemoryError`` as ``reserve``.
        """
        prepared = state if isinstance(state, Prepared) else self.prepare(state)
        tensors = prepared.tensors
        if self.budget is None and not all(prepared.plain):
            return None
        self.reserve(prepared)
        pairs = [(d, s) for d, s in zip(self._views, tensors, strict=True) if d is not None]
        later: list[tuple[torch.Tensor, torch.Tensor]] = []
        if defer is not None and len(pairs) == len(tensors):
            later = [p for p in pairs if defer(p[1])]
            pairs = [p for p in pairs if not defer(p[1])]
        self._copier.copy(pairs, self.pin)
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        items = [
            view if view is not None else src
            for view, src in zip(self._views, tensors, strict=True)
        ]
        staged_state = fill(prepared.skeleton, lambda i: items[i])
        total = sum(_nbytes(t) for t in tensors)
        live = sum(_nbytes(t) for t, v in zip(tensors, self._views, strict=True) if v is None)
        lo, hi = (self.arena.lo, self.arena.hi) if self.arena is not None else (0, 0)
        after = self._copier.mark() if later else None
        return StagedSave(staged_state, total, live, lo, hi, later, after)

    @torch.no_grad()
    def copy_later(self, staged: StagedSave) -> None:
        """Copy what ``stage`` deferred for ``staged`` (nothing when it deferred nothing);
        the caller then ``release``s it, whatever this raised."""
        if staged.later:
            self._copier.copy(staged.later, self.pin, staged.later_after, behind=True)

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
        if offset and (self.arena is None or self.arena.size < offset):
            self._key, self._slots, self.in_use = None, [], 0  # until the new one is made
            if self.arena is not None:  # the old arena is freed before the new one is made
                self.arena.close()
                self.arena = None
            self.arena = allocated(offset, lambda: HostArena(offset, self.pin))
            self.allocations += 1
        arena = self.arena
        self._views = [None if s is None or arena is None else arena.tensor(s) for s in slots]
        self.in_use = offset
        self._key, self._slots = key, slots

    def close(self) -> None:
        """Free the arena and stop the copy threads; the next ``stage`` allocates anew."""
        self._copier.close()
        self._views, self._slots, self._key = [], [], None
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        self.in_use = 0


def _key_of(prepared: Prepared) -> tuple:
    """What the arena's layout depends on: each tensor's dtype, shape and plainness."""
    return tuple(
        (t.dtype, tuple(t.shape), ok)
        for t, ok in zip(prepared.tensors, prepared.plain, strict=True)
    )


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
        return Hole(len(tensors) - 1)
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
