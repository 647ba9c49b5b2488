"""How a ``CheckpointManager`` reports failed saves: raised, or warned about, once each.

A failed background save is reported at the next ``save``/``wait`` and by ``close``.
Until the manager has committed its first save (nothing of the run is protected yet: a
typo, an unwritable root, wrong credentials) and with ``strict=True`` it is raised;
after that it is a warning naming the step that stays the newest, and training goes on.
A save some rank cannot take at all is refused on every rank at once (``refuse``).
"""

from __future__ import annotations

import warnings
from typing import NoReturn

from ckptstore import errors
from ckptstore.errors import CkptStoreError
from ckptstore.manager.agreement import Agreement

__all__ = ["FailureLog", "interrupted"]


class FailureLog:
    """The manager's failed saves, and what is newest when one fails.

    Call order: ``failed(exc)`` / ``committed(step)`` as each save ends (the save
    thread), ``restored(step)`` after a restore; ``report()`` at ``wait`` (and after a
    synchronous save), ``take()`` in the next save's agreement, ``refuse`` when a rank
    cannot take a save, ``untold()`` at close. The same on every rank: saves commit or
    fail on all alike.
    """

    def __init__(self, root_url: str, strict: bool) -> None:
        self.root_url, self.strict = root_url, strict
        self.unreported: list[BaseException] = []
        self.last_failed: BaseException | None = None
        #: The last failure raised to the caller: ``close`` does not raise it again.
        self.told: BaseException | None = None
        #: The newest step this manager committed or restored (what a failed save leaves
        #: the newest), and whether any save of it committed yet (until then every
        #: failure raises).
        self.newest: int | None = None
        self.committed_any = False

    def failed(self, exc: BaseException) -> None:
        """A save failed with ``exc``: reported at the next ``report``/``take``."""
        self.unreported.append(exc)
        self.last_failed = exc

    def committed(self, step: int) -> None:
        """A save of ``step`` committed: the last save did not fail."""
        self.committed_any = True
        self.last_failed = None
        self.restored(step)

    def restored(self, step: int) -> None:
        """``step`` was committed or restored: a failed save leaves it (or a newer) newest."""
        self.newest = max(step, self.newest or step)

    def raises(self) -> bool:
        """Whether a failed save is raised (else warned about): with ``strict``, and until
        the first save of this manager commits."""
        return self.strict or not self.committed_any

    def fallback(self) -> str:
        """What a failed save leaves the newest checkpoint, for its message."""
        if self.newest is None:
            return f"no checkpoint of this job is committed under {self.root_url} yet"
        return f"step {self.newest} stays the newest checkpoint"

    def report(self, stacklevel: int = 3) -> None:
        """Warn about (while ``raises``: raise the first of) the failures not reported
        yet; ``stacklevel`` 3 names the caller of the public method that called this."""
        failures, self.unreported = self.unreported, []
        for exc in failures:
            if self.raises():
                self.told = exc
                raise exc
            warnings.warn(
                f"a background checkpoint save failed: {exc}; training goes on and "
                f"{self.fallback()}",
                RuntimeWarning,
                stacklevel=stacklevel,
            )

    def take(self, stacklevel: int) -> BaseException | None:
        """A previous save's failure: warned about now (None), or returned to be raised
        on every rank by the save's agreement while ``raises``."""
        if not self.raises():
            self.report(stacklevel=stacklevel + 1)
            return None
        failures, self.unreported = self.unreported, []
        return failures[0] if failures else None

    def untold(self) -> BaseException | None:
        """At close: the last save's failure unless it was raised to the caller already
        (the failures not reported yet are dropped: ``close`` raises at most that one)."""
        self.unreported.clear()
        last = self.last_failed
        return last if last is not None and last is not self.told else None

    def refuse(self, agree: Agreement, step: int, own: BaseException | None, src: int) -> NoReturn:
        """Raise on every rank (a collective: rank ``src`` says why it cannot take the
        save of ``step``); nothing was staged or written."""
        why = agree.broadcast(_describe(own) if agree.rank == src else None, src)
        note = f"the save of step {step} was not started on any rank"
        if own is not None:
            if hasattr(own, "add_note"):  # Python >= 3.11
                alone = agree.group is None
                own.add_note(note if alone else f"{note} (this is rank {agree.rank})")
            self.told = own
            raise own
        name, message = why
        cls = getattr(errors, name, None)
        if not (isinstance(cls, type) and issubclass(cls, CkptStoreError)):
            cls, message = CkptStoreError, f"{name}: {message}"
        raise cls(f"{message} (rank {src}); {note}")


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C, or an error a Ctrl-C caused on its way through torch's
    code (its serializer reports an interrupted write as ``RuntimeError: [enforce fail
    ...] unexpected pos``, with the ``KeyboardInterrupt`` as its context)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _describe(exc: BaseException | None) -> tuple[str, str]:
    """(class name, message) of ``exc``, for the ranks that raise it after its own."""
    return (type(exc).__name__, str(exc)) if exc is not None else ("CkptStoreError", "")
