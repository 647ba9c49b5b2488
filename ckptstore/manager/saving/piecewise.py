"""Writers for a state staged in pieces: ``background="process"`` with a staging budget.

With ``CheckpointManager(max_staging_bytes=B, background="process")`` the training side
stages the state into one shared-memory segment of at most B bytes, one piece at a time
(``ckptstore.manager.saving.shared_arena``): piece 0 before ``save`` hands the job over, each other
piece when the writer process asks for it, over the piece it has written. These writers
(in the writer process) order this rank's shard files by piece, one file per piece in
ascending order (non-tensor items join the first), and before the file of a piece that
is not in memory ask for it (``Pieces.fetch``). The request for the last piece this rank
writes says so: training may then go on (its tensors are no longer needed), and the
seconds it waited come back, which the manifest's ``blocking_s`` then includes. A rank
that needs no piece beyond the one in memory says so at once. Everything else, the
on-storage format included, is the base writer's (``CkptWriter`` or ``StagedWriter``).

Call order: the base writer's. ``write_data`` finds each tensor item's piece (where its
bytes lie in the arena) and then calls the base ``write_data``, which calls
``shard_names`` and ``_write_file`` per file in order; ``_write_file`` fetches its piece
first. A piece is copied over the one before it only after that one's file returned
(durable), so no bytes of a piece are read once another is in its place; every tensor
has an address of its own (one mapping of the segment per piece), which tells its piece.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckptstore.dcp.staged import StagedWriter
from ckptstore.dcp.writer import CkptWriter
from ckptstore.engine.store import Store
from ckptstore.manager.saving.shared_arena import ArenaView

__all__ = ["Pieces", "PiecewiseStagedWriter", "PiecewiseWriter", "piecewise_writer"]


class Pieces:
    """The writer process's view of one save's pieces: which piece a tensor lies in, and
    ``fetch``. ``fetch(piece, last)`` asks the training side to stage ``piece`` (None: no
    piece, only ``last``) and returns, for the last request, the seconds training waited."""

    def __init__(self, view: ArenaView, fetch: Callable[[int | None, bool], float]) -> None:
        self.view, self._fetch = view, fetch
        self.current = 0  # the piece in memory: the training side staged piece 0

    def piece_of(self, data: object) -> int | None:
        """The piece holding ``data``'s bytes; None for bytes or an empty tensor."""
        return self.view.piece_of(data) if isinstance(data, torch.Tensor) else None

    def fetch(self, piece: int | None, last: bool) -> float:
        """Have ``piece`` staged over the piece in memory (which must be written)."""
        if piece is not None:
            self.view.drop(self.current)  # written: its pages leave this process's mappings
        waited = self._fetch(piece, last)
        if piece is not None:
            self.current = piece
        return waited


class _Piecewise:
    """The mixin: see the module docstring. Set ``pieces`` before saving."""

    pieces: Pieces
    _item_piece: dict[Any, int | None]
    _need: list[int]
    _file_piece: dict[str, int]
    _released: bool

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """The base ``write_data``, its files in the order of their pieces."""
        self._item_piece = {
            item.index: (
                None
                if item.type == WriteItemType.BYTE_IO
                else self.pieces.piece_of(planner.resolve_data(item))
            )
            for item in plan.items
        }
        self._need = sorted({p for p in self._item_piece.values() if p is not None})
        self._file_piece, self._released = {}, False
        if not self._need or self._need == [self.pieces.current]:
            self._fetch(None)  # the piece in memory is all this rank writes
        return super().write_data(plan, planner)  # type: ignore[misc,no-any-return]

    def shard_names(self, plan: SavePlan) -> list[tuple[str, list]]:
        """One file per needed piece, in order; items of no piece in the first."""
        loose = [i for i in plan.items if self._item_piece.get(i.index) is None]
        groups = [[i for i in plan.items if self._item_piece.get(i.index) == p] for p in self._need]
        if groups:
            groups[0] = loose + groups[0]
        elif loose:
            groups = [loose]
        named: list[tuple[str, list]] = self.name_shards(plan, groups)  # type: ignore[attr-defined]
        self._file_piece = {name: p for (name, _), p in zip(named, self._need)}
        return named

    def _write_file(
        self, name: str, items: list, planner: SavePlanner, store: Store | None = None
    ) -> list[WriteResult]:
        piece = self._file_piece.get(name)
        if piece is not None and piece != self.pieces.current:
            self._fetch(piece)
        return super()._write_file(name, items, planner, store)  # type: ignore[misc,no-any-return]

    def _fetch(self, piece: int | None) -> None:
        """Fetch ``piece``; for the last one, add training's wait to the manifest's
        ``blocking_s`` (as the manager's record does)."""
        last = piece is None or piece == self._need[-1]
        waited = self.pieces.fetch(piece, last)
        if last and not self._released:
            self._released = True
            timings = self.manifest_extra.get("timings")  # type: ignore[attr-defined]
            if isinstance(timings, dict) and "blocking_s" in timings:
                timings["blocking_s"] += waited


class PiecewiseWriter(_Piecewise, CkptWriter):
    """``CkptWriter`` writing a state staged in pieces (``ckptstore.manager.saving.piecewise``)."""


class PiecewiseStagedWriter(_Piecewise, StagedWriter):
    """``StagedWriter`` writing a state staged in pieces (``ckptstore.manager.saving.piecewise``)."""


def piecewise_writer(staged: bool, *args: Any, pieces: Pieces, **kwargs: Any) -> CkptWriter:
    """A ``PiecewiseStagedWriter`` (``staged``) or ``PiecewiseWriter`` of ``args``/``kwargs``."""
    cls = PiecewiseStagedWriter if staged else PiecewiseWriter
    writer = cls(*args, **kwargs)
    writer.pieces = pieces
    writer._item_piece, writer._need, writer._file_piece = {}, [], {}
    writer._released = False
    return writer
