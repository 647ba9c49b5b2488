"""The shared-memory arena a writer process reads a staged state from (``background="process"``).

The arena is a Linux memfd: no name in /dev/shm, and the kernel frees its memory when the
last process holding it (an fd or a mapping) exits, whichever way it exits. The training
side owns an ``Arena`` and copies into it (``shared_stager.SharedStager``); the writer
process maps it once (``ArenaView``) and rebuilds each save's state over its bytes
(``StagedState.rebuild``), no copy. With a staging budget the arena is one segment that
holds one *round* of the state at a time; the view maps it once per round, each at an
address of its own, so every tensor has its own address and ``ArenaView.round_of`` tells
its round by it.
"""

from __future__ import annotations

import mmap
import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch

from ckptstore.errors import ConfigError, torch_name
from ckptstore.manager.saving.slots import Slot, fill

__all__ = ["Arena", "ArenaView", "StagedState"]


@dataclass(frozen=True)
class StagedState:
    """One staged state: its pickled structure (tensors replaced by holes) and slots, in
    ``rounds`` rounds (1: ``stage`` copied the whole state)."""

    skeleton: bytes
    slots: tuple[Slot, ...]
    arena_id: int
    arena_size: int
    rounds: int = 1

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
        return fill(skeleton, lambda i: view.tensor(self.slots[i]))


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
                with torch_name("torch.cuda._pin_memory_utils"):
                    from torch.cuda import _pin_memory_utils

                _pin_memory_utils.pin_memory(self.bytes.data_ptr(), size)
                self._pinned = True
        except BaseException:
            self.close()
            raise

    def resident(self) -> int:
        """The bytes of the arena that hold memory now (the memfd's allocated blocks)."""
        return os.fstat(self.fd).st_blocks * 512

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


class ArenaView:
    """A reader's mappings of an arena, from the fd it was handed (kept, closed by
    ``close``): one mapping per round, made when a slot of that round is first asked for."""

    def __init__(self, fd: int, size: int, arena_id: int) -> None:
        self.arena_id, self.size, self._fd = arena_id, size, fd
        self._maps: list[mmap.mmap] = []
        self._bases: list[int] = []  # each mapping's address
        try:
            self._mapping(0)
        except BaseException:
            self.close()
            raise

    def _mapping(self, round: int) -> mmap.mmap:
        while len(self._maps) <= round:
            m = mmap.mmap(self._fd, self.size)
            first = torch.frombuffer(m, dtype=torch.uint8, count=1)
            self._bases.append(first.data_ptr())
            del first
            self._maps.append(m)
        return self._maps[round]

    def tensor(self, slot: Slot) -> torch.Tensor:
        """The tensor over ``slot``'s bytes of its round's mapping (no copy; a new empty one
        if 0 bytes)."""
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=slot.dtype)
        numel = slot.nbytes // torch.empty((), dtype=slot.dtype).element_size()
        flat = torch.frombuffer(
            self._mapping(slot.round), dtype=slot.dtype, count=numel, offset=slot.offset
        )
        return flat.view(slot.shape)

    def round_of(self, tensor: torch.Tensor) -> int | None:
        """The round whose mapping holds ``tensor``'s bytes; None if none does (or it has
        no bytes)."""
        if tensor.numel() == 0:
            return None
        ptr = tensor.data_ptr()
        for round, base in enumerate(self._bases):
            if base <= ptr < base + self.size:
                return round
        return None

    def drop(self, round: int) -> None:
        """Done with ``round`` for now: drop its mapping's pages from this process (the
        memory stays the arena's; reading them again maps them again)."""
        if round < len(self._maps):
            self._maps[round].madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmap (once no tensor over a mapping is alive; else when the last one goes) and
        close the fd; safe to call twice."""
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # a tensor over it is still alive: unmapped when collected
                pass
        self._maps, self._bases = [], []
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
