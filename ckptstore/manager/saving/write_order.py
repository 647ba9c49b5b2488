"""The manager's write schedules (``dcp.schedule.WriteSchedule``): what a save waits for.

``LiveFirst`` (thread backend, a state over the staging budget): the tensors not copied
(*live*: training's own memory) go first, in a file of their own, and training is
released once that file is durable. ``InRounds`` (process backend with a budget): one
file per staged round, in order, each round fetched from the training side first.
``Refusing``: a rank that could not get its state ready fails the save in DCP's planning
step, which every rank enters, so every rank fails at once. The seconds training waited
are added to the manifest's ``timings["blocking_s"]``, as the manager's record does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

from ckptstore.dcp.schedule import PlainSchedule, split_items
from ckptstore.manager.saving.shared_arena import ArenaView

__all__ = ["LiveFirst", "Rounds", "InRounds", "Refusing"]

_Resolve = Callable[[WriteItem], Any]


def _add_wait(timings: dict[str, float], waited: float) -> None:
    if "blocking_s" in timings:
        timings["blocking_s"] += waited


class LiveFirst(PlainSchedule):
    """The live items in the first file, then the others as ``PlainSchedule`` splits
    them; ``release()`` (returning the seconds training waited) once the live file is
    durable, or at the end of ``write_data`` whichever way it ends, or at once when no
    item is live. ``timings``: the manifest's, whose ``blocking_s`` grows by the wait."""

    def __init__(
        self,
        is_live: Callable[[torch.Tensor], bool],
        release: Callable[[], float],
        timings: dict[str, float],
    ) -> None:
        self.is_live, self.release, self.timings = is_live, release, timings
        self._live_file = False
        self._released = False

    def group(self, items: list[WriteItem], resolve: _Resolve, files_per_rank: int) -> list[list]:
        """[the live items] + ``split_items`` of the rest (no live item: ``split_items``)."""
        live = [i for i in items if i.type != WriteItemType.BYTE_IO and self._live(resolve(i))]
        if not live:
            self._release()
            return split_items(items, files_per_rank)
        ids = {i.index for i in live}
        self._live_file = True
        return [live, *split_items([i for i in items if i.index not in ids], files_per_rank)]

    def _live(self, data: object) -> bool:
        return isinstance(data, torch.Tensor) and self.is_live(data)

    def after_file(self, index: int) -> None:
        """After the live file: the live tensors' bytes are durable, training may go on."""
        if index == 0 and self._live_file:
            self._release()

    def end(self) -> None:
        """Release training if the live file was never written (a save that failed)."""
        self._release()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            _add_wait(self.timings, self.release())


class Rounds:
    """The writer process's view of one save's rounds: which round a tensor lies in, and
    ``fetch``. ``fetch(round, last)`` asks the training side to stage ``round`` (None: no
    round, only ``last``) and returns, for the last request, the seconds training waited."""

    def __init__(self, view: ArenaView, fetch: Callable[[int | None, bool], float]) -> None:
        self.view, self._fetch = view, fetch
        self.current = 0  # the round in memory: the training side staged round 0

    def round_of(self, data: object) -> int | None:
        """The round holding ``data``'s bytes; None for bytes or an empty tensor."""
        return self.view.round_of(data) if isinstance(data, torch.Tensor) else None

    def fetch(self, round: int | None, last: bool) -> float:
        """Have ``round`` staged over the round in memory (which must be written)."""
        if round is not None:
            self.view.drop(self.current)  # written: its pages leave this process's mappings
        waited = self._fetch(round, last)
        if round is not None:
            self.current = round
        return waited


class InRounds(PlainSchedule):
    """One file per round this rank needs, in ascending order (items of no round join the
    first); before each file whose round is not in memory, ``rounds.fetch`` it. The
    request for the last needed round says so (training may go on: its tensors are no
    longer needed); a rank that needs no round beyond the one in memory says so at once.
    A round is fetched over the one before only after that one's file is durable."""

    def __init__(self, rounds: Rounds, timings: dict[str, float]) -> None:
        self.rounds, self.timings = rounds, timings
        self._need: list[int] = []
        self._released = False

    def group(self, items: list[WriteItem], resolve: _Resolve, files_per_rank: int) -> list[list]:
        """The items of each needed round, one group per round (``files_per_rank`` unused)."""
        round_of = {
            i.index: None if i.type == WriteItemType.BYTE_IO else self.rounds.round_of(resolve(i))
            for i in items
        }
        self._need = sorted({p for p in round_of.values() if p is not None})
        if not self._need or self._need == [self.rounds.current]:
            self._fetch(None)  # the round in memory is all this rank writes
        loose = [i for i in items if round_of[i.index] is None]
        groups = [[i for i in items if round_of[i.index] == p] for p in self._need]
        if groups:
            groups[0] = loose + groups[0]
        elif loose:
            groups = [loose]
        return groups

    def before_file(self, index: int) -> None:
        """Fetch the file's round unless it is the one in memory."""
        if index < len(self._need) and self._need[index] != self.rounds.current:
            self._fetch(self._need[index])

    def _fetch(self, round: int | None) -> None:
        last = round is None or round == self._need[-1]
        waited = self.rounds.fetch(round, last)
        if last and not self._released:
            self._released = True
            _add_wait(self.timings, waited)


class Refusing(PlainSchedule):
    """A rank that cannot take part: ``set_up`` raises ``refusal`` in DCP's planning step
    (each rank's errors there reach every rank) before anything is written."""

    def __init__(self, refusal: BaseException) -> None:
        self.refusal = refusal

    def set_up(self) -> None:
        """Raise the refusal."""
        raise self.refusal
