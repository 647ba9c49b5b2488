"""Loading one committed step for ``CheckpointManager.restore``: local tier first, then remote.

Only rank 0 reads a step's small objects (and lists the root), once per restore and only
for the steps the restore gets to: the newest that opens, then older ones one at a time
as fallbacks need them. The other ranks get the bytes it read and verified in one
broadcast per step and hand them to their ``CkptReader`` (its ``committed=`` seam), which
re-checks them without a store read. So a restore's request count on a step's prefix
grows neither with the world size (bar each rank's shard reads) nor with the number of
steps the root keeps. A step rank 0 cannot open is never a candidate, on any rank. Which
local files a restore trusts is ``engine.local_tier``'s rule, and only this job's
directory of each node's tier is looked into (``manager.tier_dir``: its stamp names this
root and run); another job's copies in the same tier are never read. A step saved to the
local tier alone (``LOCAL_ONLY``) is found on the nodes instead: each rank opens the
newest in its job's directory whose manifest names this run, and the rank holding the
newest of all broadcasts it; it is tried first when it is newer than the root's newest,
and its files come from the nodes only.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from ckptstore.dcp import save_load as dcp  # dcp.load, quiet without a process group
from ckptstore.dcp.reader import CkptReader
from ckptstore.engine.catalog import list_steps
from ckptstore.engine.commit import finish_commit
from ckptstore.engine.committed import (
    Committed,
    committed_from_bytes,
    open_committed,
)
from ckptstore.engine.local_tier import LOCAL_ONLY, local_copy_matches, local_files
from ckptstore.engine.manifest import Marker
from ckptstore.engine.names import step_name
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CkptStoreError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NewerFormatError,
)
from ckptstore.manager.agreement import Agreement
from ckptstore.manager.node_tier import NodeTier, from_peers, where_from
from ckptstore.manager.peer_tier import PeerTier
from ckptstore.manager.state import RNGState
from ckptstore.manager.tier_dir import TierDir

__all__ = ["Opened", "StepLoader"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Opened:
    """What rank 0 read of one step, as broadcast: the marker, manifest and ``.metadata``
    bytes of a committed step, or (``error`` set) why it could not be opened
    (``incomplete``: no marker; ``newer``: a newer ckptstore's format; anything else:
    damaged). ``local``: a local-only step, read by the rank whose local tier holds it."""

    step: int
    marker: Marker | None = None
    manifest_bytes: bytes = b""
    metadata_bytes: bytes = b""
    error: str = ""
    incomplete: bool = False
    local: bool = False
    newer: bool = False

    @classmethod
    def of(cls, step: int, committed: Committed, local: bool = False) -> Opened:
        """The broadcast form of a checkpoint ``open_committed`` opened."""
        return cls(
            step,
            committed.marker,
            committed.manifest_bytes,
            committed.metadata_bytes,
            local=local,
        )

    @classmethod
    def failed(cls, step: int, exc: CkptStoreError) -> Opened:
        """The broadcast form of a step that failed to open with ``exc``."""
        return cls(
            step,
            error=str(exc),
            incomplete=isinstance(exc, IncompleteCheckpointError),
            newer=isinstance(exc, NewerFormatError),
        )

    def committed(self, where: str) -> Committed:
        """The verified checkpoint (re-checked here, no store read), or raise
        ``CorruptCheckpointError`` (``NewerFormatError``) saying why it is not one."""
        if self.error:
            raise (NewerFormatError if self.newer else CorruptCheckpointError)(self.error)
        assert self.marker is not None
        return committed_from_bytes(self.marker, self.manifest_bytes, self.metadata_bytes, where)


class StepLoader:
    """Loads steps of ``root`` (and of this job's staged local copies, ``tier``).

    Call order (every rank, the same steps in the same order; the manager drives it)::

        for s in loader.discover(step):  # a collective generator: the newest local-only
                                         # step of any node first if it is the newest;
                                         # rank 0 lists the root once, then opens steps
                                         # newest first (marker, manifest, .metadata) only
                                         # until one verifies, finishing a commit cut
                                         # short after its marker, and broadcasts it
            error = loader.try_load(s, state)
                                         # collective: the local copy if every rank has
                                         # one matching the committed step, else (or if it
                                         # fails) this node's files and the remote; the
                                         # error that makes the step unloadable, or None
            if error is None:
                break                    # an older step is opened only if this one failed
        loader.forget()                  # the restore is over: drop what discovery kept
    """

    def __init__(
        self,
        root: Store,
        *,
        engine: TransferEngine,
        tier: TierDir,
        allow_pickle: bool,
        process_group: Any,
        agree: Agreement,
        peers: PeerTier | None = None,
    ) -> None:
        self.root = root
        self.peers = peers
        self.engine = engine
        self.tier = tier
        #: The node's local tier directory, for messages (None: no local tier).
        self.local_tier_dir = tier.path
        self.allow_pickle = allow_pickle
        self.process_group = process_group
        self.agree = agree
        #: Every rank: the broadcast of the step discovery just yielded, taken by try_load.
        self._first: Opened | None = None
        #: The last ``try_load``: where it read from (words, for the restore's report line)
        #: and the step's stored bytes (None: a stock checkpoint without a manifest).
        self.source = ""
        self.size: int | None = None
        #: The committed step ``try_load`` last tried (its manifest names who wrote it).
        self.loaded: Committed | None = None
        #: The step ``_shared_open`` last opened is a local-only one.
        self._local_only = False
        #: Every rank: the committed steps discovery passed over, newest first, with why
        #: (damaged, or a newer format); as rank 0 last broadcast them.
        self.refused: list[tuple[int, str]] = []

    @property
    def is_root(self) -> bool:
        """True on the rank that reads and broadcasts (rank 0 of the agreement group)."""
        return self.agree.group is None or dist.get_rank(self.agree.group) == 0

    # -- discovery (rank 0 reads, everyone gets the result) -------------------------------
    def discover(self, step: int | None = None) -> Iterator[int]:
        """The steps to try, newest first (``step`` alone if one is asked for), found
        lazily: a collective generator that every rank advances alike.

        Each advance is one broadcast: rank 0 (which lists the root at the first) opens
        the next older steps until one opens and verifies, finishing its commit if a crash
        cut it short after its marker, and sends it with what it read; that step is
        yielded, and the next advance (only when it failed to load) moves past it. A
        store error on rank 0 (the root unreadable) is raised on every rank. The newest
        local-only step of any node (``_local_candidate``) comes first when it is newer
        than the root's newest (or is the asked-for ``step``, which the root lacks)."""
        listed: list[int] | None = None  # rank 0: steps listed and not yet opened
        self.refused = []
        local = self._local_candidate(step)
        while True:
            opened: Opened | None = None
            failure: CkptStoreError | None = None
            if self.is_root:
                try:
                    if step is not None:  # the asked-for step once, then nothing
                        opened = self._take(step) if listed is None else None
                        listed = []
                    else:
                        if listed is None:
                            entries = list_steps(self.root, with_status=False)
                            listed = [e.step for e in reversed(entries)]
                        opened = self._next_committed(listed)
                except CkptStoreError as exc:  # the root unreadable: every rank raises it
                    failure = exc
            opened, failure, self.refused = self.agree.broadcast((opened, failure, self.refused))
            if failure is not None:
                self.forget()
                raise failure
            if local is not None and (
                opened is None or local.step > opened.step or opened.incomplete
            ):
                self._first, local = local, None
                yield self._first.step
                if opened is not None and opened.incomplete:
                    return  # the asked-for step is not in the root either
            if opened is None:
                return
            self._first = opened
            yield opened.step

    def _local_candidate(self, step: int | None) -> Opened | None:
        """The newest local-only step any rank's local tier holds whole enough to open
        (``step`` alone if given), as the rank holding it opened it, on every rank (a
        collective; None: no rank holds one)."""
        own = self._own_local(step)
        newest = self.agree.max_of([own.step if own else -1])[0]
        if newest < 0:
            return None
        holder = self.agree.max_of([self.agree.rank if own and own.step == newest else -1])[0]
        mine = own if own is not None and self.agree.rank == holder else None
        return self.agree.broadcast(mine, src=holder)

    def _own_local(self, step: int | None) -> Opened | None:
        """The newest local-only step of this job's directory of this rank's local tier
        (``step`` alone if given) that opens and whose manifest names this run; None if
        there is none, or a newer step there was saved to the root (which the root's
        listing covers)."""
        job = self.tier.usable()
        if job is None:
            return None
        try:
            entries = list_steps(job, with_status=False, once=True)
        except (OSError, CkptStoreError):
            return None
        for entry in reversed(entries):
            if step is not None and entry.step != step:
                continue
            try:
                committed = open_committed(job.child(entry.name))
            except (OSError, CkptStoreError):
                continue  # no marker here (another node's), or damaged
            if committed.manifest.extra.get("tier") != LOCAL_ONLY:
                return None
            assert self.tier.job is not None
            run = committed.manifest.extra.get("run")
            if run != self.tier.job.run:  # a step directory moved in from elsewhere
                log.warning(
                    "local-only step %d in %s names run %r, not this job's (%r): not restored",
                    entry.step, job.url, run, self.tier.job.run,
                )  # fmt: skip
                continue
            return Opened.of(entry.step, committed, local=True)
        return None

    def forget(self) -> None:
        """Drop what discovery kept; call once a restore is over."""
        self._first = None

    def _next_committed(self, listed: list[int]) -> Opened | None:
        """Rank 0: the newest step of ``listed`` (newest first) that opens, opened; it and
        every newer one are taken off ``listed``, a committed one that fails to open noted
        in ``refused``. None when none is left."""
        while listed:
            step = listed.pop(0)
            try:
                committed = self._open(step)
            except IncompleteCheckpointError:
                continue  # a save that did not finish (or one in flight): not a checkpoint
            except (CorruptCheckpointError, NewerFormatError) as exc:  # UnsafePathError too
                log.warning("step %d is not a loadable checkpoint: %s", step, exc)
                self.refused.append((step, str(exc)))
                continue
            return Opened.of(step, committed)
        return None

    def _open(self, step: int) -> Committed:
        """Rank 0: ``step`` opened (marker, manifest, ``.metadata``), its commit finished
        if a crash cut it short after its marker; raises Incomplete/CorruptCheckpointError
        as ``open_committed`` does."""
        store = self.root.child(step_name(step))
        committed = open_committed(store)
        if not committed.canonical:
            try:
                finish_commit(store, self.engine, committed)
                log.warning(
                    "step %d was committed by a process that died before writing its "
                    "canonical manifest and .metadata; they are written now",
                    step,
                )
            except CkptStoreError as exc:  # the restore decides what is loadable
                log.warning("could not finish the commit of step %d: %s", step, exc)
        return committed

    def _take(self, step: int) -> Opened:
        """Rank 0: the broadcast form of ``step``, opened now (a failure to open is the
        step's error)."""
        try:
            committed = self._open(step)
        except (IncompleteCheckpointError, CorruptCheckpointError, NewerFormatError) as exc:
            return Opened.failed(step, exc)
        return Opened.of(step, committed)

    def _take_safely(self, step: int) -> Opened:
        """``_take``, any store error (after retries) made the step's error instead of
        raising on rank 0 alone (which would leave the others waiting)."""
        try:
            return self._take(step)
        except CkptStoreError as exc:
            return Opened(step, error=str(exc))

    def _shared_open(self, step: int) -> Committed | CkptStoreError | None:
        """``step`` as rank 0 opened it, on every rank (a collective: the broadcast
        discovery made, or a new one), re-checked here; the error that refuses it; or None
        when rank 0 found no marker (only for a step asked for by number: each rank's
        reader then opens it itself, as a bare reader does: a stock DCP checkpoint loads,
        anything else raises what is wrong with it)."""
        opened, self._first = self._first, None
        if opened is None or opened.step != step:
            opened = self.agree.broadcast(self._take_safely(step) if self.is_root else None)
        assert opened is not None and opened.step == step
        self._local_only = opened.local
        if opened.incomplete:
            return None
        where = (
            f"local-only step {step} in {self.local_tier_dir}"
            if opened.local
            else self.root.describe(step_name(step))
        )
        try:
            return opened.committed(where)
        except (IncompleteCheckpointError, CorruptCheckpointError, NewerFormatError) as exc:
            return exc

    # -- loading ------------------------------------------------------------------------
    def try_load(self, step: int, state: dict[str, Any]) -> CkptStoreError | None:
        """Load ``step`` (its local copy first, if any, then the remote one); the error
        that makes it unloadable, or None. The same on every rank."""
        opened = self._shared_open(step)
        if not self.agree.all(not isinstance(opened, CkptStoreError)):
            if isinstance(opened, CkptStoreError):
                return opened
            return CorruptCheckpointError(f"step {step} failed to verify on another rank")
        assert not isinstance(opened, CkptStoreError)
        committed = self.loaded = opened
        remote = self.root.child(step_name(step))
        self.size = sum(e.size for e in committed.manifest.files.values()) if committed else None
        self.source = f"the remote copy in {self.root.url}"
        if committed is None:
            return self._load_from(remote, step, state, None)
        if self._local_only:  # no remote copy: what no node holds is missing
            return self._load_local_only(step, state, committed)
        local = self._local_tier(step, committed)
        if local is not None:
            log.info("restoring step %d from the local copy in %s", step, self.local_tier_dir)
            self.source = f"the local copy in {self.local_tier_dir}"
            error = self._load_from(local, step, state, committed)
            if error is None:
                return None
            warnings.warn(
                f"the local copy of step {step} in {self.local_tier_dir} could not be restored "
                f"({error}); loading the same step from {self.root.url} instead",
                RuntimeWarning,
                stacklevel=3,
            )
        tier = self._node_tier(step, remote, committed) if local is None else None
        if tier is not None:
            hook = None
            if self.peers is not None and self.peers.active:  # the same on every rank
                hook = functools.partial(
                    from_peers, self.peers, step, committed, tier, self.root.url, self.is_root
                )
            else:
                where_from(step, tier, committed, self.local_tier_dir, self.root.url)
            error = self._load_from(tier, step, state, committed, before_read=hook)
            log.info(
                "step %d: %d bytes read locally, %d from the remote",
                step, tier.bytes_local, tier.bytes_remote,
            )  # fmt: skip
            if tier.local_files:
                self.source = (
                    f"the local copy in {self.local_tier_dir} and the remote copy in "
                    f"{self.root.url} (rank 0: {tier.bytes_local} bytes local, "
                    f"{tier.bytes_remote} remote"
                    + (f"; {tier.bytes_peers} bytes sent between nodes" if tier.bytes_peers else "")
                    + ")"
                )
            if error is None:
                return None
            warnings.warn(
                f"the local files of step {step} in {self.local_tier_dir} could not be restored "
                f"({error}); loading the same step from {self.root.url} instead",
                RuntimeWarning,
                stacklevel=3,
            )
        log.info("restoring step %d from the remote copy in %s", step, self.root.url)
        self.source = f"the remote copy in {self.root.url}"
        # Read once, share (``dcp.shared_read``): an object store serves each range several
        # ranks need once; a volume's reads are local preads, cheaper than the group.
        share = not remote.capabilities.zero_copy_parts
        return self._load_from(remote, step, state, committed, share=share)

    def _load_local_only(
        self, step: int, state: dict[str, Any], committed: Committed
    ) -> CkptStoreError | None:
        """Load the local-only ``step``: this node's files and its peers', nothing from
        the root (a file no node holds fails the load: the restore falls back)."""
        self.source = f"the local tier {self.local_tier_dir} (a local-only step)"
        local = self._local_tier(step, committed)
        if local is not None:
            log.info("restoring local-only step %d from %s", step, self.local_tier_dir)
            return self._load_from(local, step, state, committed)
        tier = self._node_tier(step, None, committed)
        if tier is None:
            return IncompleteCheckpointError(
                f"local-only step {step}: no node holds its files in {self.local_tier_dir}"
            )
        hook = None
        if self.peers is not None and self.peers.active:
            hook = functools.partial(
                from_peers, self.peers, step, committed, tier, tier.remote.url, self.is_root
            )
        error = self._load_from(tier, step, state, committed, before_read=hook)
        if tier.bytes_peers:
            self.source += f"; {tier.bytes_peers} bytes sent between nodes"
        return error

    def _node_tier(self, step: int, remote: Store | None, committed: Committed) -> NodeTier | None:
        """This node's share of ``step`` when no rank-agreed whole local copy exists (on
        several nodes, each local tier directory holds its own ranks' shards), the rest
        read from ``remote`` (None: a local-only step, which only the nodes hold). A
        collective: used only if every rank can use it or none can, so a load that fails
        on one falls back to the remote on all (a rank with none of the files reads them
        all remotely)."""
        peers = self.peers is not None and self.peers.active  # they may send files
        local = self.tier.step(step, create=peers)  # peers' files are received there
        files: list[str] = []
        if local is not None:
            try:
                files = local_files(local, committed.manifest)
            except (OSError, CkptStoreError):
                files = []
        if not self.agree.any(bool(files)) and not peers:
            return None
        if remote is None:  # no remote copy: what this node lacks is missing
            remote = local if local is not None else self.root.child(step_name(step))
        return NodeTier(local, remote, files)  # a rank with no files reads all remotely

    def _local_tier(self, step: int, committed: Committed) -> Store | None:
        """The local staged copy of ``step`` if every rank has one identical to the
        committed remote checkpoint (a collective), else None. Only local files are read:
        the remote marker is the one rank 0 broadcast."""
        local = self.tier.step(step)
        if local is not None:
            try:
                if not local_copy_matches(local, committed):
                    local = None
            except (OSError, CkptStoreError):
                local = None
        return local if self.agree.all(local is not None) else None

    def _load_from(
        self,
        store: Store,
        step: int,
        state: dict[str, Any],
        committed: Committed | None,
        before_read: Callable[[set[str]], None] | None = None,
        share: bool = False,
    ) -> CkptStoreError | None:
        error: CkptStoreError | None = None
        reader = None
        try:
            reader = CkptReader(
                store,
                engine=self.engine,
                config=self.engine.config,
                allow_pickle=self.allow_pickle,
                committed=committed,
                before_read=before_read,
                share_group=self.process_group if share else None,
            )
        except (IncompleteCheckpointError, CorruptCheckpointError, NewerFormatError) as exc:
            error = exc
        if not self.agree.all(error is None):
            return error or CorruptCheckpointError(f"step {step} failed to open on another rank")
        assert reader is not None
        world = reader.manifest.world_size if reader.manifest else None
        for value in state.values():
            if isinstance(value, RNGState):
                value.expect_world_size(world)
        own: Exception | None = None
        try:
            dcp.load(state, storage_reader=reader, process_group=self.process_group)
        except CheckpointException as exc:  # every rank gets it: no agreement needed
            inner = dcp.unwrap_checkpoint_exception(exc)
            if isinstance(
                inner, (CorruptCheckpointError, IncompleteCheckpointError, NewerFormatError)
            ):
                return inner
            raise inner from exc
        except Exception as exc:  # noqa: BLE001 - a Stateful's load_state_dict, this rank alone
            own = exc  # (RNGState refusing a malformed RNG state: CorruptCheckpointError)
        # Every rank learns the worst outcome: 1 makes all fall back; 2 (any other error)
        # is raised where it happened, the others keep what they loaded (as before).
        code = 0 if own is None else 1 if isinstance(own, CorruptCheckpointError) else 2
        worst = self.agree.max_of([code])[0]
        if code == 2 or (code == 1 and worst == 2):
            raise own  # type: ignore[misc]
        if worst == 1:
            if isinstance(own, CorruptCheckpointError):
                return own
            return CorruptCheckpointError(f"step {step} failed to load on another rank")
        return None
