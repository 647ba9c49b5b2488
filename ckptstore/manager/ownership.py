"""One job per root: rank 0 owns the root from its first save, and each step names its run.

The owner lease (``<root>/ckptstore.owner.json``, ``engine.owner``) is refreshed in the
background until ``close``; a save while another live run owns the root is refused on
every rank with ``RootInUseError`` naming that run. A stale owner (no heartbeat for
60 s, its process gone, or not beating while the first save watches it) is taken over.
Each manifest records the run that committed it (``extra["run"]``).
"""

from __future__ import annotations

import logging

from ckptstore import errors
from ckptstore.engine.lease import Heartbeat
from ckptstore.engine.manifest import Manifest
from ckptstore.engine.owner import claim_root
from ckptstore.engine.store import Store
from ckptstore.errors import CkptStoreError, RootInUseError

__all__ = ["RootOwner", "describe_run", "run_of"]

log = logging.getLogger(__name__)


class RootOwner:
    """Rank 0's claim on the root: ``claim()`` at every save, ``release()`` at close."""

    def __init__(self, root: Store, run_id: str) -> None:
        self.root, self.run_id = root, run_id
        self._owner: Heartbeat | None = None  # from the first save until release

    def claim(self) -> BaseException | None:
        """Own the root (at the first save) or check it is still ours; the
        ``RootInUseError`` naming another live run, else None. A store error while
        claiming is no refusal: the save goes on (and fails like any save if the root
        cannot be written) and the claim is tried again at the next save."""
        if self._owner is not None:
            try:
                self._owner.ensure_fresh()
                return None
            except errors.InUseError as exc:  # taken over, or not refreshed for long
                owner, self._owner = self._owner, None
                owner.stop(delete=False)
                if owner.lost is not None:
                    return RootInUseError(str(exc))
        try:
            self._owner = claim_root(self.root, self.run_id)
        except RootInUseError as exc:
            return exc
        except CkptStoreError as exc:
            log.warning("could not claim %s for run %r: %s", self.root, self.run_id, exc)
        return None

    def release(self) -> None:
        """Stop the heartbeat and delete the lease: the root is free for the next job."""
        if self._owner is not None:
            self._owner.stop()
            self._owner = None


def run_of(manifest: Manifest) -> str | None:
    """The run that wrote ``manifest`` (``extra["run"]``), None when it does not say."""
    run = manifest.extra.get("run")
    return run if isinstance(run, str) else None


def describe_run(manifest: Manifest) -> str:
    """``run 'x'``, or a note that the manifest names none (an older writer's)."""
    run = run_of(manifest)
    return f"run {run!r}" if run is not None else "a run that recorded no run id"
