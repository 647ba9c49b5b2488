"""Staging into one shared-memory arena that a writer process maps, reused across saves.

Tensors are copied into 64-byte-aligned slots (CPU tensors on the rank's share of the
cores: ``hostcopy``); everything else is pickled, so training may change it afterwards.
Only plain dense tensors are staged (``nn.Parameter`` too); DTensor, ShardedTensor,
sparse, quantized and nested tensors raise ``ConfigError``. Slots are laid out again only
when the tensors' dtypes and shapes change, and a new arena is allocated only when they
no longer fit, so steady saves copy into the same memory. With ``budget=B`` the tensors,
in the state's order, are packed into *rounds* of at most B bytes, each laid out from
offset 0 of one segment of at most B bytes: ``stage`` copies round 0, ``stage_round(k)``
round k over the one before (once the writer has written it). Training, which must not
change its tensors until the last round is copied, waits about the write time of all
rounds but the last; a tensor larger than B is a ``ConfigError``. Given a ``defer``
predicate, a state of one round has the tensors it names copied by ``copy_later`` (on
the save thread, staging behind the next step) instead of by ``stage``.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ckptstore.errors import ConfigError
from ckptstore.manager.saving.hostcopy import HostCopier
from ckptstore.manager.saving.shared_arena import Arena, StagedState
from ckptstore.manager.saving.slots import ALIGN, Hole, Slot, allocated, user_values

__all__ = ["Prepared", "SharedStager"]

_Plan = tuple[tuple[Slot, ...], list[list[int]], int]  # slots, rounds' slot indices, size


@dataclass(frozen=True)
class Prepared:
    """A state ``SharedStager.prepare`` found stageable: its tensors, its pickled rest and
    (when it differs from the stager's) its layout; nothing copied yet."""

    skeleton: bytes
    tensors: list[torch.Tensor]
    key: tuple
    plan: _Plan | None  # None: the stager's current layout


class SharedStager:
    """Copies states into a reused shared-memory arena (see the module docstring).

    Call order (the caller guarantees no reader uses the arena while ``stage`` or
    ``reserve`` writes it: the manager's one-save-in-flight rule)::

        prepared = stager.prepare(state)  # optional: every check that can refuse the
                                          # state (ConfigError); nothing copied or allocated
        stager.reserve(prepared)          # optional: lays out and allocates the arena
                                          # (StagingMemoryError); nothing copied
        staged = stager.stage(prepared, defer)
                                          # copies round 0 (all, without a budget; with
                                          # one round, all but what ``defer`` names),
                                          # pickles the rest: a StagedState (small,
                                          # picklable)
        stager.copy_later()               # the save thread: the deferred copies
        stager.arena.fd                   # handed once to the reader (``ArenaView``)
        stager.stage_round(k)             # with a budget: round k over the written one
        stager.release()                  # no more rounds: training's tensors let go
        stager.close()                    # frees the arena, once no reader uses it

    ``in_use`` / ``peak_in_use`` count the bytes of the round in the segment,
    ``peak_resident`` the memfd's allocated bytes sampled after each copy.
    """

    def __init__(self, *, pin: bool = False, budget: int | None = None) -> None:
        self.pin = pin
        self.budget = budget
        self.arena: Arena | None = None
        self._copier = HostCopier()
        #: How many arenas were allocated so far (steady saves allocate none).
        self.allocations = 0
        #: Arena bytes holding the round copied last, and the most ever; the most the
        #: kernel said the arena held (with a budget: sampled after each copy).
        self.in_use = 0
        self.peak_in_use = 0
        self.peak_resident = 0
        self._key: tuple | None = None
        self._slots: tuple[Slot, ...] = ()
        self._rounds: list[list[int]] = [[]]  # per round: its slots' indices
        self._sources: list[torch.Tensor] = []  # the tensors of a state with rounds left
        #: The (arena view, tensor) pairs ``copy_later`` still copies, and the CUDA event
        #: it starts after (``HostCopier.mark``, at ``stage``).
        self.later: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._later_after: Any = None
        #: The staged tensors of the current layout, views into the arena (with a budget,
        #: the views of different rounds share its bytes).
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
    def stage(self, state: Any, defer: Callable[[torch.Tensor], bool] | None = None) -> StagedState:
        """Copy every tensor of ``state`` (with a budget: round 0's; with one round, all
        but those ``defer`` names, left to ``copy_later``) into the arena and pickle the
        rest; ``state`` may be what ``prepare`` returned for it.

        Lays the slots out again (allocating a larger arena if they no longer fit) when the
        tensors' dtypes and shapes differ from the last call's. Returns once every copy is
        done (CUDA copies included). With more than one round, ``state``'s tensors are kept
        for ``stage_round`` until ``release``.

        Raises:
            ConfigError: as ``prepare``; or no memfd (not Linux).
            StagingMemoryError: as ``reserve``.
        """
        prepared = state if isinstance(state, Prepared) else self.prepare(state)
        tensors = prepared.tensors
        self.reserve(prepared)
        assert self.arena is not None
        self.later = []
        if defer is not None and len(self._rounds) == 1:
            self.later = [(self.views[i], t) for i, t in enumerate(tensors) if defer(t)]
            now = [t if not defer(t) else None for t in tensors]
            self._copy(0, now)
            self._later_after = self._copier.mark() if self.later else None
        else:
            self._copy(0, tensors)
        self._sources = tensors if len(self._rounds) > 1 else []
        return StagedState(
            prepared.skeleton,
            self._slots,
            self.arena.arena_id,
            self.arena.size,
            len(self._rounds),
        )

    def stage_round(self, round: int) -> None:
        """Copy round ``round`` of the state ``stage`` was last given over the round in the
        arena. Only until ``release``; the caller guarantees that no reader still needs the
        round it replaces."""
        if not self._sources:
            raise ValueError("stage_round() without a state of several rounds staged")
        if not 0 <= round < len(self._rounds):
            raise ValueError(f"the staged state has {len(self._rounds)} rounds, not {round + 1}")
        self._copy(round, self._sources)

    @torch.no_grad()
    def copy_later(self) -> None:
        """Copy what the last ``stage`` deferred (nothing when it deferred nothing); the
        caller then ``release``s, whatever this raised."""
        if self.later:
            self._copier.copy(self.later, self.pin, self._later_after, behind=True)

    def release(self) -> None:
        """The save needs no more rounds: drop the references to the staged state's tensors."""
        self._sources, self.later, self._later_after = [], [], None

    def _copy(self, round: int, tensors: Sequence[torch.Tensor | None]) -> None:
        assert self.arena is not None
        indices = self._rounds[round]
        pairs = [(self.views[i], tensors[i]) for i in indices]
        self._copier.copy([(dst, src) for dst, src in pairs if src is not None], self.pin)
        end = max((self._slots[i].offset + self._slots[i].nbytes for i in indices), default=0)
        self.in_use = end
        self.peak_in_use = max(self.peak_in_use, end)
        if self.budget is not None:
            self.peak_resident = max(self.peak_resident, self.arena.resident())

    def _plan(self, key: tuple) -> _Plan:
        """The slots, rounds and arena size of a state of tensors ``key``; ConfigError for
        a tensor larger than the budget. Changes nothing."""
        budget = self.budget
        slots: list[Slot] = []
        rounds: list[list[int]] = [[]]
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
                offset = 0  # a new round, over the same segment
                rounds.append([])
            slots.append(Slot(offset, nbytes, dtype, shape, len(rounds) - 1))
            rounds[-1].append(i)
            offset += -(-nbytes // ALIGN) * ALIGN
        size = max([ALIGN] + [s.offset + s.nbytes for s in slots])
        if budget is not None:
            size = max(1, min(size, budget))
        return tuple(slots), rounds, size

    def _layout(self, key: tuple, plan: _Plan) -> None:
        slots, rounds, size = plan
        self.views = []
        if self.arena is None or self.arena.size < size:
            old, self.arena = self.arena, None
            self._key, self._slots, self._rounds = None, (), [[]]  # until the new one is made
            if old is not None:
                old.close()
            self.arena = allocated(size, lambda: Arena(size, self.allocations + 1, self.pin))
            self.allocations += 1
        assert self.arena.bytes is not None
        whole = self.arena.bytes
        self.views = [
            whole[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in slots
        ]
        self._key, self._slots, self._rounds = key, slots, rounds

    def close(self) -> None:
        """Free the arena (this process's fd and mapping) and stop the copy threads; the
        next ``stage`` allocates anew."""
        self._copier.close()
        self.views, self._sources = [], []
        self._key = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None


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
