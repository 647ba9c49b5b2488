"""This job's directory of its node's local tier, found and checked at every use.

Other jobs may share the node's ``local_tier_dir``. This job's copies live in a directory
of their own there (``engine.tier_jobs``: named by a hash of the root and run, and
stamped with both), used only once its stamp has been read and found to be this job's.
``TierDir`` is how the save, the trim, the peer tier and the restore reach it; none of
them ever looks at another job's directory or at the older layout's step directories.
"""

from __future__ import annotations

import logging

from ckptstore.engine.names import step_name
from ckptstore.engine.store import Store
from ckptstore.engine.tier_jobs import TierEntry, TierJob, open_job, survey
from ckptstore.errors import CkptStoreError
from ckptstore.manager.report import size_text
from ckptstore.stores.local import LocalStore

__all__ = ["TierDir"]

log = logging.getLogger(__name__)


class TierDir:
    """This job's directory of one node's local tier (``path``; None: no local tier).

    Call order (any rank; every call reads the stamp again, nothing is cached)::

        tier = TierDir(local_tier_dir, TierJob(root_url, run))   # the manager's constructor
        job = tier.open(create=True)   # where a save writes: made with its stamp if absent;
                                       # TierStampError if it is not provably this job's
        job = tier.usable()            # where a restore or a peer reads: None if absent,
                                       # refused or unreadable (each warned about once)
        step = tier.step(n)            # ``usable()``'s directory of step n, or None
        tier.report_others()           # once, on a node's leader: the tier's other
                                       # contents in one log line (other jobs, old layout)
    """

    def __init__(self, path: str | None, job: TierJob | None) -> None:
        assert (path is None) == (job is None), "a local tier needs its job"
        self.path, self.job = path, job
        self._warned: set[str] = set()

    def open(self, *, create: bool = False) -> Store | None:
        """This job's directory, its stamp checked (``engine.tier_jobs.open_job``); None
        without a local tier, or when it is absent and not ``create``d."""
        if self.path is None or self.job is None:
            return None
        return open_job(LocalStore(self.path), self.job, create=create)

    def usable(self, *, create: bool = False) -> Store | None:
        """``open``, a refusal (``TierStampError``) or a directory that cannot be read or
        made warned about (once per message) and taken as no copies: never raises, so a
        restore's ranks stay in step and fall back to the root together."""
        try:
            return self.open(create=create)
        except (OSError, CkptStoreError) as exc:
            if str(exc) not in self._warned:
                self._warned.add(str(exc))
                log.warning("the local tier is not used: %s", exc)
            return None

    def step(self, step: int, *, create: bool = False) -> Store | None:
        """The directory of ``step`` in ``usable()``'s (not made here), or None."""
        job = self.usable(create=create)
        return None if job is None else job.child(step_name(step))

    def report_others(self) -> None:
        """Log (once per call) what else the tier holds: other jobs' directories, whose
        they are and their bytes, and step directories of the older layout. They are never
        used, trimmed or evicted by this job."""
        if self.path is None or self.job is None:
            return
        try:
            entries = [e for e in survey(LocalStore(self.path)) if e.name != self.job.key]
        except (OSError, CkptStoreError) as exc:  # a report only: the save goes on
            log.debug("could not survey the local tier %s: %s", self.path, exc)
            return
        jobs = [e for e in entries if e.kind == "job"]
        legacy = [e for e in entries if e.kind == "legacy"]
        if jobs:
            log.info(
                "the local tier %s also holds %d other jobs' copies (%s): never used, "
                "trimmed or evicted by this job", self.path, len(jobs), _jobs_text(jobs),
            )  # fmt: skip
        if legacy:
            log.warning(
                "the local tier %s holds %d step directories of an older ckptstore's layout "
                "(%s, %s): nothing records their root, so no job uses or deletes them; "
                "remove them when no older job needs them (`ckptstore-tool ls --local-tier "
                "%s` shows them)",
                self.path, len(legacy), ", ".join(e.name for e in legacy[:3]),
                size_text(sum(e.bytes for e in legacy)), self.path,
            )  # fmt: skip


def _jobs_text(jobs: list[TierEntry]) -> str:
    """``run R of root U: 3 steps, 1.2 MB; ...`` (the first three jobs)."""
    parts = []
    for e in jobs[:3]:
        who = f"run {e.run} of root {e.root}" if e.root else f"{e.name} ({e.problem})"
        parts.append(f"{who}: {len(e.steps)} steps, {size_text(e.bytes)}")
    return "; ".join(parts) + (f"; {len(jobs) - 3} more" if len(jobs) > 3 else "")
