"""Staging into one shared-memory arena that a writer process maps, reused across saves.

Call order::

    stager = SharedStager(pin=torch.cuda.is_available())
    staged = stager.stage(state)     # training side: copies every tensor into the arena and
                                     # pickles the rest; a StagedState (small, picklable)
    stager.arena.fd                  # the arena's file descriptor, handed once to a reader
    view = ArenaView(fd, size, id)   # reader side: maps the arena (once per arena)
    state = staged.rebuild(view)     # the state again, its tensors over the shared bytes
    stager.close()                   # frees the arena (once no reader is using it)

The arena is a Linux memfd: it has no name in /dev/shm, and the kernel frees its memory
when the last process holding it (an fd or a mapping) exits, whichever way it exits.
Tensors are copied into 64-byte-aligned contiguous slots. The slots are laid out again
only when the list of tensor dtypes and shapes changes (an optimizer's state appearing
after its first step); a new arena is allocated only when the tensors no longer fit, so
steady saves copy into the same memory. Everything that is not a tensor (containers,
numbers, strings, objects) is pickled by ``stage``, so training may change it afterwards.
Only plain dense tensors are staged (``nn.Parameter`` too): DTensor, ShardedTensor,
sparse, quantized and nested tensors raise ``ConfigError``. The caller guarantees that no
reader uses the arena while ``stage`` writes it (the manager's one-save-in-flight rule).
"""

from __future__ import annotations

import copy
import mmap
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ckptstore.errors import ConfigError

__all__ = ["ArenaView", "SharedStager", "Slot", "StagedState"]

ALIGN = 64


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in the arena."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Hole:
    index: int  # into StagedState.slots


@dataclass(frozen=True)
class StagedState:
    """One staged state: its pickled structure (tensors replaced by holes) and slots."""

    skeleton: bytes
    slots: tuple[Slot, ...]
    arena_id: int
    arena_size: int

    @property
    def nbytes(self) -> int:
        """The staged tensors' bytes, alignment padding not counted."""
        return sum(s.nbytes for s in self.slots)

    def rebuild(self, view: ArenaView) -> Any:
        """The state, each tensor over exactly its bytes in ``view`` (no copy)."""
        if view.arena_id != self.arena_id:
            raise ValueError(f"state staged in arena {self.arena_id}, not {view.arena_id}")
        try:
            skeleton = pickle.loads(self.skeleton)
        except (AttributeError, ImportError) as exc:
            raise ConfigError(
                f"the writer process cannot unpickle a non-tensor value of the state ({exc}); "
                "define its class in an importable module (not __main__), or use "
                "background='thread'"
            ) from exc
        return _fill(skeleton, lambda i: view.tensor(self.slots[i]))


class Arena:
    """``size`` bytes of shared memory mapped here; ``fd`` stays open for new readers."""

    def __init__(self, size: int, arena_id: int, pin: bool) -> None:
        if not hasattr(os, "memfd_create"):
            raise ConfigError("background='process' needs Linux (os.memfd_create)")
        self.size, self.arena_id = size, arena_id
        self.fd = os.memfd_create("ckptstore-staging", os.MFD_CLOEXEC)
        self._pinned = False
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)
            self.bytes: torch.Tensor | None = torch.frombuffer(self._map, dtype=torch.uint8)
            if pin:
                from torch.cuda import _pin_memory_utils

                _pin_memory_utils.pin_memory(self.bytes.data_ptr(), size)
                self._pinned = True
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unpin, unmap and close the fd; safe to call twice.

        A mapping that a live tensor view still uses stays mapped until the view is
        collected.
        """
        if self._pinned and self.bytes is not None:
            from torch.cuda import _pin_memory_utils

            _pin_memory_utils.unpin_memory(self.bytes.data_ptr())
            self._pinned = False
        self.bytes = None
        if getattr(self, "_map", None) is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive: unmapped when it is collected
                pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SharedStager:
    """Copies states into a reused shared-memory arena; see the module docstring."""

    def __init__(self, *, pin: bool = False) -> None:
        self.pin = pin
        self.arena: Arena | None = None
        #: How many arenas were allocated so far (steady saves allocate none).
        self.allocations = 0
        self._key: tuple | None = None
        self._slots: tuple[Slot, ...] = ()
        #: The staged tensors of the current layout, views into the arena.
        self.views: list[torch.Tensor] = []

    @torch.no_grad()
    def stage(self, state: Any) -> StagedState:
        """Copy every tensor of ``state`` into the arena and pickle the rest.

        Lays the slots out again (allocating a larger arena if they no longer fit) when the
        tensors' dtypes and shapes differ from the last call's. Returns once every copy is
        done (CUDA copies included).

        Raises:
            ConfigError: ``state`` holds a tensor that is not plain and dense (DTensor,
                ShardedTensor, sparse, quantized, nested or meta), or no memfd (not Linux).
        """
        tensors: list[torch.Tensor] = []
        skeleton = pickle.dumps(_strip(state, tensors, "state"), protocol=5)
        key = tuple((t.dtype, tuple(t.shape)) for t in tensors)
        if key != self._key:
            self._layout(key)
        assert self.arena is not None
        cuda = False
        for dst, src in zip(self.views, tensors):
            blocking = not (self.pin and src.device.type == "cuda")
            dst.copy_(src, non_blocking=not blocking)
            cuda = cuda or not blocking
        if cuda:
            torch.cuda.synchronize()
        return StagedState(skeleton, self._slots, self.arena.arena_id, self.arena.size)

    def _layout(self, key: tuple) -> None:
        slots, offset = [], 0
        for dtype, shape in key:
            numel = 1
            for d in shape:
                numel *= d
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            slots.append(Slot(offset, nbytes, dtype, shape))
            offset += -(-nbytes // ALIGN) * ALIGN
        size = max(offset, ALIGN)
        self.views = []
        if self.arena is None or self.arena.size < size:
            old, self.arena = self.arena, None
            if old is not None:
                old.close()
            self.arena = Arena(size, self.allocations + 1, self.pin)
            self.allocations += 1
        assert self.arena.bytes is not None
        whole = self.arena.bytes
        self.views = [
            whole[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in slots
        ]
        self._key, self._slots = key, tuple(slots)

    def close(self) -> None:
        """Free the arena (this process's fd and mapping); the next ``stage`` allocates anew."""
        self.views = []
        self._key = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None


class ArenaView:
    """A reader's mapping of an arena, from the fd it was handed (the fd is closed here)."""

    def __init__(self, fd: int, size: int, arena_id: int) -> None:
        self.arena_id = arena_id
        try:
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def tensor(self, slot: Slot) -> torch.Tensor:
        """The tensor over ``slot``'s bytes of the mapping (no copy; a new empty one if 0 bytes)."""
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=slot.dtype)
        numel = slot.nbytes // torch.empty((), dtype=slot.dtype).element_size()
        flat = torch.frombuffer(self._map, dtype=slot.dtype, count=numel, offset=slot.offset)
        return flat.view(slot.shape)


def _strip(obj: Any, tensors: list[torch.Tensor], path: str) -> Any:
    """``obj`` with every tensor replaced by a hole (containers rebuilt, the rest as is)."""
    if isinstance(obj, torch.Tensor):
        if (
            type(obj) not in (torch.Tensor, torch.nn.Parameter)
            or obj.layout != torch.strided
            or obj.is_quantized
            or obj.is_nested
            or obj.device.type == "meta"
        ):
            raise ConfigError(
                f"background='process' stages plain dense tensors; {path} is a "
                f"{type(obj).__name__} ({obj.layout}, {obj.device}). Use background='thread' "
                "for sharded (DTensor / ShardedTensor) or sparse state"
            )
        tensors.append(obj)
        return _Hole(len(tensors) - 1)
    if type(obj) is dict:
        return {k: _strip(v, tensors, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, dict):
        out = copy.copy(obj)
        for k, v in obj.items():
            out[k] = _strip(v, tensors, f"{path}.{k}")
        return out
    if isinstance(obj, list):
        return [_strip(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        values = [_strip(v, tensors, f"{path}[{i}]") for i, v in enumerate(obj)]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    return obj


def _fill(obj: Any, make: Callable[[int], torch.Tensor]) -> Any:
    """``obj`` (freshly unpickled) with every hole replaced by ``make(index)``."""
    if isinstance(obj, _Hole):
        return make(obj.index)
    if isinstance(obj, dict):
        for k, v in obj.items():
            obj[k] = _fill(v, make)
        return obj
    if isinstance(obj, list):
        obj[:] = [_fill(v, make) for v in obj]
        return obj
    if isinstance(obj, tuple):
        values = [_fill(v, make) for v in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    return obj
