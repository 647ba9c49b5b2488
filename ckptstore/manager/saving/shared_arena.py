"""Staging into one shared-memory arena that a writer process maps, reused across saves.

Call order::

    stager = SharedStager(pin=torch.cuda.is_available(), budget=None)
    prepared = stager.prepare(state) # training side, optional: every check that can refuse
                                     # the state (ConfigError), nothing copied or allocated:
                                     # safe while a reader still uses the arena
    stager.reserve(prepared)         # training side, optional, once no reader uses the
                                     # arena: lays it out and allocates what the state needs
                                     # (what can fail: StagingMemoryError); nothing copied
    staged = stager.stage(prepared)  # training side (or ``stage(state)``): copies every
                                     # tensor into the arena (with a budget: those of piece
                                     # 0) and pickles the rest; a StagedState (small,
                                     # picklable)
    stager.arena.fd                  # the arena's file descriptor, handed once to a reader
    view = ArenaView(fd, size, id)   # reader side: maps the arena (once per arena)
    state = staged.rebuild(view)     # the state again, its tensors over the shared bytes
    stager.stage_piece(k)            # with a budget, training side: piece k copied over the
                                     # piece before it (which the reader has written)
    view.drop(k)                     # reader side: done with piece k (its page table
                                     # entries dropped; the memory stays the arena's)
    stager.release()                 # the save needs no more piece: the references to
                                     # training's tensors are dropped
    view.close()                     # reader side, for a new arena or at exit
    stager.close()                   # frees the arena (once no reader is using it)

The arena is a Linux memfd: it has no name in /dev/shm, and the kernel frees its memory
when the last process holding it (an fd or a mapping) exits, whichever way it exits.
Tensors are copied into 64-byte-aligned contiguous slots (CPU tensors on the rank's share
of the cores: ``hostcopy``). The slots are laid out again
only when the list of tensor dtypes and shapes changes (an optimizer's state appearing
after its first step); a new arena is allocated only when the tensors no longer fit, so
steady saves copy into the same memory. Everything that is not a tensor (containers,
numbers, strings, objects) is pickled by ``stage``, so training may change it afterwards.
Only plain dense tensors are staged (``nn.Parameter`` too): DTensor, ShardedTensor,
sparse, quantized and nested tensors raise ``ConfigError``. The caller guarantees that no
reader uses the arena while ``stage`` writes it (the manager's one-save-in-flight rule).

With ``budget=B`` the arena is one segment of at most B bytes, reused for every piece of
the state: the tensors, in the state's order, are packed into *pieces* of at most B bytes
each (a new piece starts where the next tensor does not fit), every piece laid out from
offset 0 of the segment. ``stage`` copies
piece 0; ``stage_piece(k)`` copies piece k over whatever piece is there. The memfd is never
larger than B, so neither is the staging memory (``in_use`` / ``peak_in_use`` count the
bytes of the piece in the segment; ``peak_resident`` samples the memfd's allocated bytes
from the kernel after each copy). A reader maps the segment once per piece, each at an
address of its own, so that every tensor of the state has its own address (and a writer
can tell by it which piece a tensor is in: ``ArenaView.piece_of``), though all of them
share the one segment. The cost: piece k+1 can only be copied once the reader has written
piece k, so training, which must not change its tensors until the last piece it needs is
copied, waits for about the write time of all pieces but the last. A tensor larger than B
cannot be staged (``ConfigError``).
"""

from __future__ import annotations

import copy
import mmap
import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch

from ckptstore.errors import ConfigError
from ckptstore.manager.saving.hostcopy import HostCopier
from ckptstore.manager.saving.slots import ALIGN, Hole, Slot, allocated, fill, user_values

__all__ = ["Arena", "ArenaView", "Prepared", "SharedStager", "StagedState"]



@dataclass(frozen=True)
class StagedState:
    """One staged state: its pickled structure (tensors replaced by holes) and slots, in
    ``pieces`` pieces (1: ``stage`` copied the whole state)."""

    skeleton: bytes
    slots: tuple[Slot, ...]
    arena_id: int
    arena_size: int
    pieces: int = 1

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


_Plan = tuple[tuple[Slot, ...], list[list[int]], int]  # slots, pieces' slot indices, size


@dataclass(frozen=True)
class Prepared:
    """A state ``SharedStager.prepare`` found stageable: its tensors, its pickled rest and
    (when it differs from the stager's) its layout; nothing copied yet."""

    skeleton: bytes
    tensors: list[torch.Tensor]
    key: tuple
    plan: _Plan | None  # None: the stager's current layout


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


class SharedStager:
    """Copies states into a reused shared-memory arena; see the module docstring."""

    def __init__(self, *, pin: bool = False, budget: int | None = None) -> None:
        self.pin = pin
        self.budget = budget
        self.arena: Arena | None = None
        self._copier = HostCopier()
        #: How many arenas were allocated so far (steady saves allocate none).
        self.allocations = 0
        #: Arena bytes holding the piece copied last, and the most ever; the most the
        #: kernel said the arena held (with a budget: sampled after each copy).
        self.in_use = 0
        self.peak_in_use = 0
        self.peak_resident = 0
        self._key: tuple | None = None
        self._slots: tuple[Slot, ...] = ()
        self._pieces: list[list[int]] = [[]]  # per piece: its slots' indices
        self._sources: list[torch.Tensor] = []  # the tensors of a state with pieces left
        #: The staged tensors of the current layout, views into the arena (with a budget,
        #: the views of different pieces share its bytes).
        self.views: list[torch.Tensor] = []

    def prepare(self, state: Any) -> Prepared:
        """Check that ``state`` can be staged, copying nothing and allocating nothing (the
        arena may still be read meanwhile); ``stage`` takes the result.

        Raises:
            ConfigError: ``state`` holds a tensor that is not plain and dense (DTensor,
                ShardedTensor, sparse, quantized, nested or meta), a non-tensor value that
                cannot be pickled or, with a budget, a tensor larger than it.
        """
        tensors: list[torch.Tensor] = []
        stripped = _strip(state, tensors, "state")
        skeleton = user_values(
            lambda: pickle.dumps(stripped, protocol=5),
            "background='process' pickles the state's non-tensor values for the writer process, "
            "and one of them cannot be pickled ({error}); make it picklable (or a tensor), or "
            "use background='thread'",
        )
        key = tuple((t.dtype, tuple(t.shape)) for t in tensors)
        return Prepared(skeleton, tensors, key, None if key == self._key else self._plan(key))

    def reserve(self, prepared: Prepared) -> None:
        """Lay the arena out for ``prepared``'s tensors, allocating a larger one if they
        no longer fit (nothing when the layout is the current one); nothing is copied.
        ``stage`` does it too; calling it first lets a failure be known before a save
        starts. Only while no reader uses the arena.

        Raises:
            StagingMemoryError: the arena could not be allocated (the stager then holds
                none; the next call tries again).
        """
        if prepared.key != self._key:
            self._layout(prepared.key, prepared.plan or self._plan(prepared.key))

    @torch.no_grad()
    def stage(self, state: Any) -> StagedState:
        """Copy every tensor of ``state`` (with a budget: piece 0's) into the arena and
        pickle the rest; ``state`` may be what ``prepare`` returned for it.

        Lays the slots out again (allocating a larger arena if they no longer fit) when the
        tensors' dtypes and shapes differ from the last call's. Returns once every copy is
        done (CUDA copies included). With more than one piece, ``state``'s tensors are kept
        for ``stage_piece`` until ``release``.

        Raises:
            ConfigError: as ``prepare``; or no memfd (not Linux).
            StagingMemoryError: as ``reserve``.
        """
        prepared = state if isinstance(state, Prepared) else self.prepare(state)
        tensors = prepared.tensors
        self.reserve(prepared)
        assert self.arena is not None
        self._copy(0, tensors)
        self._sources = tensors if len(self._pieces) > 1 else []
        return StagedState(
            prepared.skeleton,
            self._slots,
            self.arena.arena_id,
            self.arena.size,
            len(self._pieces),
        )

    def stage_piece(self, piece: int) -> None:
        """Copy piece ``piece`` of the state ``stage`` was last given over the piece in the
        arena. Only until ``release``; the caller guarantees that no reader still needs the
        piece it replaces."""
        if not self._sources:
            raise ValueError("stage_piece() without a state of several pieces staged")
        if not 0 <= piece < len(self._pieces):
            raise ValueError(f"the staged state has {len(self._pieces)} pieces, not {piece + 1}")
        self._copy(piece, self._sources)

    def release(self) -> None:
        """The save needs no more piece: drop the references to the staged state's tensors."""
        self._sources = []

    def _copy(self, piece: int, tensors: list[torch.Tensor]) -> None:
        assert self.arena is not None
        indices = self._pieces[piece]
        self._copier.copy([(self.views[i], tensors[i]) for i in indices], self.pin)
        end = max((self._slots[i].offset + self._slots[i].nbytes for i in indices), default=0)
        self.in_use = end
        self.peak_in_use = max(self.peak_in_use, end)
        if self.budget is not None:
            self.peak_resident = max(self.peak_resident, self.arena.resident())

    def _plan(self, key: tuple) -> _Plan:
        """The slots, pieces and arena size of a state of tensors ``key``; ConfigError for
        a tensor larger than the budget. Changes nothing."""
        budget = self.budget
        slots: list[Slot] = []
        pieces: list[list[int]] = [[]]
        offset = 0
        for i, (dtype, shape) in enumerate(key):
            numel = 1
            for d in shape:
                numel *= d
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            if budget is not None and offset + nbytes > budget:
                if nbytes > budget:
                    raise ConfigError(
                        f"a tensor of the state ({tuple(shape)}, {dtype}: {nbytes} bytes) is "
                        f"larger than max_staging_bytes={budget}: background='process' "
                        "stages each tensor whole. Raise the budget, or use "
                        "background='thread', which writes such a tensor straight from "
                        "training's memory"
                    )
                offset = 0  # a new piece, over the same segment
                pieces.append([])
            slots.append(Slot(offset, nbytes, dtype, shape, len(pieces) - 1))
            pieces[-1].append(i)
            offset += -(-nbytes // ALIGN) * ALIGN
        size = max([ALIGN] + [s.offset + s.nbytes for s in slots])
        if budget is not None:
            size = max(1, min(size, budget))
        return tuple(slots), pieces, size

    def _layout(self, key: tuple, plan: _Plan) -> None:
        slots, pieces, size = plan
        self.views = []
        if self.arena is None or self.arena.size < size:
            old, self.arena = self.arena, None
            self._key, self._slots, self._pieces = None, (), [[]]  # until the new one is made
            if old is not None:
                old.close()
            self.arena = allocated(size, lambda: Arena(size, self.allocations + 1, self.pin))
            self.allocations += 1
        assert self.arena.bytes is not None
        whole = self.arena.bytes
        self.views = [
            whole[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in slots
        ]
        self._key, self._slots, self._pieces = key, slots, pieces

    def close(self) -> None:
        """Free the arena (this process's fd and mapping) and stop the copy threads; the
        next ``stage`` allocates anew."""
        self._copier.close()
        self.views, self._sources = [], []
        self._key = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None


class ArenaView:
    """A reader's mappings of an arena, from the fd it was handed (kept, closed by
    ``close``): one mapping per piece, made when a slot of that piece is first asked for."""

    def __init__(self, fd: int, size: int, arena_id: int) -> None:
        self.arena_id, self.size, self._fd = arena_id, size, fd
        self._maps: list[mmap.mmap] = []
        self._bases: list[int] = []  # each mapping's address
        try:
            self._mapping(0)
        except BaseException:
            self.close()
            raise

    def _mapping(self, piece: int) -> mmap.mmap:
        while len(self._maps) <= piece:
            m = mmap.mmap(self._fd, self.size)
            first = torch.frombuffer(m, dtype=torch.uint8, count=1)
            self._bases.append(first.data_ptr())
            del first
            self._maps.append(m)
        return self._maps[piece]

    def tensor(self, slot: Slot) -> torch.Tensor:
        """The tensor over ``slot``'s bytes of its piece's mapping (no copy; a new empty one
        if 0 bytes)."""
        if slot.nbytes == 0:
            return torch.empty(slot.shape, dtype=slot.dtype)
        numel = slot.nbytes // torch.empty((), dtype=slot.dtype).element_size()
        flat = torch.frombuffer(
            self._mapping(slot.piece), dtype=slot.dtype, count=numel, offset=slot.offset
        )
        return flat.view(slot.shape)

    def piece_of(self, tensor: torch.Tensor) -> int | None:
        """The piece whose mapping holds ``tensor``'s bytes; None if none does (or it has
        no bytes)."""
        if tensor.numel() == 0:
            return None
        ptr = tensor.data_ptr()
        for piece, base in enumerate(self._bases):
            if base <= ptr < base + self.size:
                return piece
        return None

    def drop(self, piece: int) -> None:
        """Done with ``piece`` for now: drop its mapping's pages from this process (the
        memory stays the arena's; reading them again maps them again)."""
        if piece < len(self._maps):
            self._maps[piece].madvise(mmap.MADV_DONTNEED)

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
        return Hole(len(tensors) - 1)
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


