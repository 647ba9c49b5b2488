"""Loading one committed step for ``CheckpointManager.restore``: local tier first, then root.

Only rank 0 reads a step's small objects (and lists the root), once per restore and only
for the steps the restore gets to: the newest that opens, then older ones one at a time
as fallbacks need them. The other ranks get the bytes it read and verified in one
broadcast per step and hand them to their ``CkptReader`` (its ``committed=`` seam), which
re-checks them without a store read. So a restore's request count on a step's prefix
grows neither with the world size (bar each rank's shard reads) nor with the number of
steps the root keeps. A step rank 0 cannot open is never a candidate, on any rank. The
local tier is reached through the ``LocalTier`` alone (``ckptstore.tier``): which tier
copies a restore trusts is ``tier.rules``'s rule, and only this job's directory of each
node's tier is looked into (its stamp names this root and run); another job's copies in
the same tier are never read. A step saved to the local tier alone (``LOCAL_ONLY``) is
found on the nodes instead: each rank opens the newest in its job's directory whose
manifest names this run (``LocalTier.newest_local_only``), and the rank holding the
newest of all broadcasts it; it is tried first when it is newer than the root's newest,
and its files come from the nodes only.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from ckptstore.dcp import save_load as dcp  # dcp.load, quiet without a process group
from ckptstore.dcp.reader import CkptReader
from ckptstore.engine.catalog import list_steps
from ckptstore.engine.commit import finish_commit
from ckptstore.engine.committed import (
    Committed,
    open_committed,
)
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
from ckptstore.manager.opened import Opened
from ckptstore.manager.state import RNGState
from ckptstore.tier.local_tier import LocalTier
from ckptstore.tier.view import TierView, from_peers, where_from

__all__ = ["StepLoader"]

log = logging.getLogger(__name__)


class StepLoader:
    """Loads steps of ``root`` (and of this job's tier copies, ``tier``).

    Call order (every rank, the same steps in the same order; the manager drives it)::

        for s in loader.discover(step):  # a collective generator: the newest local-only
                                         # step of any node first if it is the newest;
                                         # rank 0 lists the root once, then opens steps
                                         # newest first (marker, manifest, .metadata) only
                                         # until one verifies, finishing a commit cut
                                         # short after its marker, and broadcasts it
            error = loader.try_load(s, state)
                                         # collective: the tier copy if every rank has
                                         # one matching the committed step, else (or if it
                                         # fails) this node's files and the root; the
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
        tier: LocalTier,
        allow_pickle: bool,
        process_group: Any,
        agree: Agreement,
    ) -> None:
        self.root, self.engine, self.tier = root, engine, tier
        self.peers = tier.peers
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
        found = self.tier.newest_local_only(step)
        own = Opened.of(*found, local=True) if found is not None else None
        newest = self.agree.max_of([own.step if own else -1])[0]
        if newest < 0:
            return None
        holder = self.agree.max_of([self.agree.rank if own and own.step == newest else -1])[0]
        mine = own if own is not None and self.agree.rank == holder else None
        return self.agree.broadcast(mine, src=holder)

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
            f"local-only step {step} in {self.tier}"
            if opened.local
            else self.root.describe(step_name(step))
        )
        try:
            return opened.committed(where)
        except (IncompleteCheckpointError, CorruptCheckpointError, NewerFormatError) as exc:
            return exc

    # -- loading ------------------------------------------------------------------------
    def try_load(self, step: int, state: dict[str, Any]) -> CkptStoreError | None:
        """Load ``step`` (its tier copy first, if any, then the root's); the error
        that makes it unloadable, or None. The same on every rank."""
        opened = self._shared_open(step)
        if not self.agree.all(not isinstance(opened, CkptStoreError)):
            if isinstance(opened, CkptStoreError):
                return opened
            return CorruptCheckpointError(f"step {step} failed to verify on another rank")
        assert not isinstance(opened, CkptStoreError)
        committed = self.loaded = opened
        in_root = self.root.child(step_name(step))
        self.size = sum(e.size for e in committed.manifest.files.values()) if committed else None
        self.source = f"the root {self.root.url}"
        if committed is None:
            return self._load_from(in_root, step, state, None)
        if self._local_only:  # not in the root: what no node holds is missing
            return self._load_local_only(step, state, committed)
        local = self._whole_copy(step, committed)
        if local is not None:
            log.info("restoring step %d from the tier copy in %s", step, self.tier.path)
            self.source = f"the tier copy in {self.tier.path}"
            error = self._load_from(local, step, state, committed)
            if error is None:
                return None
            warnings.warn(
                f"the tier copy of step {step} in {self.tier.path} could not be restored "
                f"({error}); loading the same step from {self.root.url} instead",
                RuntimeWarning,
                stacklevel=3,
            )
        tier = self._tier_view(step, in_root, committed) if local is None else None
        if tier is not None:
            hook = None
            if self.peers.active:  # the same on every rank
                hook = functools.partial(
                    from_peers, self.peers, step, committed, tier, self.root.url, self.is_root
                )
            else:
                where_from(step, tier, committed, self.tier.path, self.root.url)
            error = self._load_from(tier, step, state, committed, before_read=hook)
            log.info(
                "step %d: %d bytes read from the tier copy, %d from the root",
                step, tier.bytes_local, tier.bytes_root,
            )  # fmt: skip
            if tier.local_files:
                self.source = (
                    f"the tier copy in {self.tier.path} and the root {self.root.url} "
                    f"(rank 0: {tier.bytes_local} bytes from the tier copy, "
                    f"{tier.bytes_root} from the root"
                    + (f"; {tier.bytes_peers} bytes sent between nodes" if tier.bytes_peers else "")
                    + ")"
                )
            if error is None:
                return None
            warnings.warn(
                f"the tier files of step {step} in {self.tier.path} could not be restored "
                f"({error}); loading the same step from {self.root.url} instead",
                RuntimeWarning,
                stacklevel=3,
            )
        log.info("restoring step %d from the root %s", step, self.root.url)
        self.source = f"the root {self.root.url}"
        # Read once, share (``dcp.shared_read``): an object store serves each range several
        # ranks need once; a volume's reads are local preads, cheaper than the group.
        share = not in_root.capabilities.zero_copy_parts
        return self._load_from(in_root, step, state, committed, share=share)

    def _load_local_only(
        self, step: int, state: dict[str, Any], committed: Committed
    ) -> CkptStoreError | None:
        """Load the local-only ``step``: this node's files and its peers', nothing from
        the root (a file no node holds fails the load: the restore falls back)."""
        self.source = f"{self.tier} (a local-only step)"
        local = self._whole_copy(step, committed)
        if local is not None:
            log.info("restoring local-only step %d from %s", step, self.tier.path)
            return self._load_from(local, step, state, committed)
        tier = self._tier_view(step, None, committed)
        if tier is None:
            return IncompleteCheckpointError(
                f"local-only step {step}: no node holds its files in {self.tier}"
            )
        hook = None
        if self.peers.active:
            hook = functools.partial(
                from_peers, self.peers, step, committed, tier, tier.root.url, self.is_root
            )
        error = self._load_from(tier, step, state, committed, before_read=hook)
        if tier.bytes_peers:
            self.source += f"; {tier.bytes_peers} bytes sent between nodes"
        return error

    def _tier_view(self, step: int, root: Store | None, committed: Committed) -> TierView | None:
        """This node's share of ``step`` when no rank-agreed whole tier copy exists (on
        several nodes, each node's tier holds its own ranks' shards), the rest read from
        ``root`` (None: a local-only step, which only the nodes hold). A collective: used
        only if every rank can use it or none can, so a load that fails on one falls back
        to the root on all (a rank with none of the files reads them all from the root)."""
        peers = self.peers.active  # they may send files: received in the step's directory
        local, files = self.tier.files_of(step, committed, create=peers)
        if not self.agree.any(bool(files)) and not peers:
            return None
        if root is None:  # not in the root: what this node lacks is missing
            root = local if local is not None else self.root.child(step_name(step))
        return TierView(local, root, files)  # a rank with no files reads all from the root

    def _whole_copy(self, step: int, committed: Committed) -> Store | None:
        """This node's tier copy of ``step`` if every rank has one identical to the
        committed step (a collective), else None. Only local files are read: the root's
        marker is the one rank 0 broadcast."""
        local = self.tier.whole_copy(step, committed)
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
