"""Loading one committed step for ``CheckpointManager.restore``: local tier first, then remote.

Call order (every rank, the same steps in the same order; the manager drives it)::

    loader = StepLoader(root, engine=..., staging_dir=..., allow_pickle=...,
                        process_group=pg, agree=agreement)
    loader.finish_commits()          # rank 0 only, first: writes the canonical manifest and
                                     # .metadata a crash right after a marker left out
    error = loader.try_load(step, state)
                                     # collective: the local staged copy if every rank has
                                     # one identical to the committed remote step, else (or
                                     # if it fails) the remote one; the error that makes the
                                     # step unloadable (the same on every rank), or None
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from ckptstore.dcp import calls as dcp  # dcp.load, quiet without a process group
from ckptstore.dcp.reader import CkptReader
from ckptstore.dcp.staged import local_tier_matches
from ckptstore.engine.catalog import committed_steps
from ckptstore.engine.commit import finish_publish
from ckptstore.engine.layout import step_name
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import CkptStoreError, CorruptCheckpointError, IncompleteCheckpointError
from ckptstore.manager.agreement import Agreement
from ckptstore.manager.node_tier import NodeTier, node_files
from ckptstore.manager.state import RNGState
from ckptstore.stores.local import LocalStore

__all__ = ["StepLoader"]

log = logging.getLogger(__name__)


class StepLoader:
    """Loads steps of ``root`` (and of the staged local copies in ``staging_dir``)."""

    def __init__(
        self,
        root: Store,
        *,
        engine: TransferEngine,
        staging_dir: str | None,
        allow_pickle: bool,
        process_group: Any,
        agree: Agreement,
    ) -> None:
        self.root = root
        self.engine = engine
        self.staging_dir = staging_dir
        self.allow_pickle = allow_pickle
        self.process_group = process_group
        self.agree = agree

    def finish_commits(self) -> None:
        """Write the canonical copies a crash right after a marker left out (rank 0)."""
        for step in committed_steps(self.root):
            try:
                if finish_publish(self.root.child(step_name(step)), self.engine):
                    log.warning(
                        "step %d was committed by a process that died before writing its "
                        "canonical manifest and .metadata; they are written now",
                        step,
                    )
            except CkptStoreError as exc:  # the restore decides what is loadable
                log.warning("could not finish the commit of step %d: %s", step, exc)

    def try_load(self, step: int, state: dict[str, Any]) -> CkptStoreError | None:
        """Load ``step`` (its local copy first, if any, then the remote one); the error
        that makes it unloadable, or None. The same on every rank."""
        local = self._local_tier(step)
        if local is not None:
            log.info("restoring step %d from the local copy in %s", step, self.staging_dir)
            error = self._load_from(local, step, state)
            if error is None:
                return None
            warnings.warn(
                f"the local copy of step {step} in {self.staging_dir} could not be restored "
                f"({error}); loading the same step from {self.root.url} instead",
                RuntimeWarning,
                stacklevel=3,
            )
        remote = self.root.child(step_name(step))
        tier = self._node_tier(step, remote) if local is None else None
        if tier is not None:
            if tier.local_files:
                log.info(
                    "restoring step %d from the local copy in %s (%d of its files; the rest "
                    "from %s)", step, self.staging_dir, len(tier.local_files), self.root.url,
                )  # fmt: skip
            else:  # another node has files of it; this one reads all remotely
                log.info(
                    "restoring step %d from the remote copy in %s (none of its files in %s)",
                    step, self.root.url, self.staging_dir,
                )  # fmt: skip
            error = self._load_from(tier, step, state)
            log.info(
                "step %d: %d bytes read locally, %d from the remote",
                step, tier.bytes_local, tier.bytes_remote,
            )  # fmt: skip
            if error is None:
                return None
            warnings.warn(
                f"the local files of step {step} in {self.staging_dir} could not be restored "
                f"({error}); loading the same step from {self.root.url} instead",
                RuntimeWarning,
                stacklevel=3,
            )
        log.info("restoring step %d from the remote copy in %s", step, self.root.url)
        return self._load_from(remote, step, state)

    def _node_tier(self, step: int, remote: Store) -> NodeTier | None:
        """This node's share of ``step`` when no rank-agreed whole local copy exists (on
        several nodes, each staging dir holds its own ranks' shards). A collective: used
        only if every rank can use it or none can, so a load that fails on one falls back
        to the remote on all (a rank with none of the files reads them all remotely)."""
        local: LocalStore | None = None
        files: list[str] = []
        if self.staging_dir:
            local = LocalStore(self.staging_dir).child(step_name(step))
            try:
                files = node_files(local, remote)
            except (IncompleteCheckpointError, CorruptCheckpointError):
                files = []
        if not self.agree.any(bool(files)):
            return None
        return NodeTier(local, remote, files)  # a rank with no files reads all remotely

    def _local_tier(self, step: int) -> Store | None:
        """The local staged copy of ``step`` if every rank has one identical to the
        committed remote checkpoint (a collective), else None."""
        local: Store | None = None
        if self.staging_dir:
            local = LocalStore(self.staging_dir).child(step_name(step))
            try:
                if not local_tier_matches(local, self.root.child(step_name(step))):
                    local = None
            except (IncompleteCheckpointError, CorruptCheckpointError):
                local = None
        return local if self.agree.all(local is not None) else None

    def _load_from(self, store: Store, step: int, state: dict[str, Any]) -> CkptStoreError | None:
        error: CkptStoreError | None = None
        reader = None
        try:
            reader = CkptReader(
                store, engine=self.engine, config=self.engine.config, allow_pickle=self.allow_pickle
            )
        except (IncompleteCheckpointError, CorruptCheckpointError) as exc:
            error = exc
        if not self.agree.all(error is None):
            return error or CorruptCheckpointError(f"step {step} failed to open on another rank")
        assert reader is not None
        world = reader.manifest.world_size if reader.manifest else None
        for value in state.values():
            if isinstance(value, RNGState):
                value.expect_world_size(world)
        try:
            dcp.load(state, storage_reader=reader, process_group=self.process_group)
        except CheckpointException as exc:
            inner = dcp.unwrap_checkpoint_exception(exc)
            if isinstance(inner, (CorruptCheckpointError, IncompleteCheckpointError)):
                return inner
            raise inner from exc
        return None
