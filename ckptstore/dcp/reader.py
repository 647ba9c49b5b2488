"""``CkptReader``: the DCP ``StorageReader`` over any store; refuses uncommitted checkpoints.

``open()`` finds the checkpoint through its marker (``engine.committed``) and checks its
``.metadata``; the manifest's codec is looked up in ``engine.codec_registry``: one this
ckptstore does not know is ``CorruptCheckpointError`` (never a guess), a known one whose
library is missing ``MissingDependencyError``. A stock DCP checkpoint (``.metadata``, no
manifest, no marker) loads with a warning and without verification. ``read_data`` plans
and schedules the reads (``engine.readplan``); ``dcp.delivery`` checks every range
against its manifest CRC32C before decoding it (items written with DCP's ``ZStandard``
extension are decompressed) and ``dcp.safe_objects`` refuses unsafe pickles
(``UnsafePickleError``) unless ``allow_pickle=True``. Readers pickle (``dcp.storebound``).
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader

from ckptstore._stack import user_stacklevel
from ckptstore.config import TransferConfig
from ckptstore.dcp.delivery import Direct, RangeDelivery, item_codec
from ckptstore.dcp.metadata import load_metadata
from ckptstore.dcp.metadata_bounds import check_metadata, item_limits
from ckptstore.dcp.shared_read import read_shared
from ckptstore.dcp.storebound import StoreBound
from ckptstore.engine.bounded import MAX_METADATA_SIZE, get_capped
from ckptstore.engine.codec_registry import get_codec, stored_codec
from ckptstore.engine.codecs import Codec
from ckptstore.engine.committed import (
    METADATA_NAME,
    Committed,
    committed_from_bytes,
    open_committed,
)
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Manifest, RangeEntry
from ckptstore.engine.read_owners import Key
from ckptstore.engine.readplan import (
    FIRST_RANGE,
    MIN_RANGE,
    READ_RANGE,
    Window,
    coalesce,
    range_size,
)
from ckptstore.engine.retry import retrying
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import CorruptCheckpointError, IncompleteCheckpointError, StoreNotFoundError

__all__ = ["CkptReader", "StockCheckpointWarning"]


class StockCheckpointWarning(UserWarning):
    """Loading a checkpoint written by stock DCP: no manifest, so nothing is verified."""


class CkptReader(StoreBound, StorageReader):
    """Reads a DCP checkpoint from any ckptstore store. Build it with ``ckptstore.reader``.

    Call order (driven by ``torch.distributed.checkpoint.load``)::

        open()                          at construction: marker, manifest and .metadata
                                        read and checked (a missing or torn checkpoint
                                        raises IncompleteCheckpointError before DCP runs).
                                        Given ``committed=`` (one rank read those three
                                        objects for all: ``manager.restore``), it reads
                                        none and re-checks the handed-over bytes
                                        (``engine.committed.committed_from_bytes``),
                                        refusing them (CorruptCheckpointError) if they
                                        do not verify
        reset(checkpoint_id)            every rank (re-opens if the URL changes)
        read_metadata()                 every rank: the already-verified DCP Metadata
        set_up_storage_reader(md, ...)  every rank
        prepare_local_plan / prepare_global_plan: unchanged plans
        read_data(plan, planner)        every rank: ``before_read(files)`` if given; with
                                        ``share_group``, the ranges several ranks need
                                        read once and shared (``dcp.shared_read``: a
                                        collective); then parallel ranged reads planned
                                        from the rest of the plan (``engine.readplan``:
                                        small adjacent items share a GET on object
                                        stores)
    """

    def __init__(
        self,
        url: str | Store,
        *,
        storage_options: dict[str, Any] | None = None,
        config: TransferConfig | None = None,
        verify: bool = True,
        allow_pickle: bool = False,
        engine: TransferEngine | None = None,
        committed: Committed | None = None,
        before_read: Callable[[set[str]], None] | None = None,
        share_group: Any = None,
    ) -> None:
        super().__init__()
        #: The process group of the load (None: none): a range several of its ranks need
        #: is read by one and sent to the others (``dcp.shared_read``), when verifying.
        #: Never pickled (a reader sent to another process reads alone).
        self.share_group = share_group
        #: Called at the start of ``read_data`` with the files this rank's plan reads
        #: (every rank calls it once per load, so it may be a collective: the manager's
        #: peer tier fetches what the node lacks there).
        self.before_read = before_read
        self._bind(url, storage_options, config, engine)
        #: A committed checkpoint opened by another rank for this URL (see open()).
        self._handed: Committed | None = committed
        self.verify = verify
        self.allow_pickle = allow_pickle
        self.committed: Committed | None = None
        self._codec: Codec = get_codec("none")  # the manifest's (set by open)
        self._metadata_bytes = b""
        self.storage_data: dict[Any, Any] = {}
        self.metadata: Metadata | None = None
        #: The most bytes each stored tensor item may decode to (``item_limits``).
        self._limits: dict[tuple[str, tuple[int, ...]], int] = {}
        self.open()

    @property
    def manifest(self) -> Manifest | None:
        """The verified manifest, or None for a stock DCP checkpoint."""
        return self.committed.manifest if self.committed else None

    @property
    def manifest_codec(self) -> Codec:
        """The codec the manifest records (``none/1`` for a stock checkpoint); items whose
        ``.metadata`` entry names a DCP transform use that one (``item_codec``)."""
        return self._codec

    def open(self) -> None:
        """Read and check the marker, manifest and metadata (see the module docstring)."""
        # Control reads (marker, manifest, .metadata, listings) retried per RetryConfig.
        self.store = retrying(self.store, self.config.retry, self.engine.stats)
        try:
            if self._handed is not None:
                c = self._handed
                self.committed = committed_from_bytes(
                    c.marker, c.manifest_bytes, c.metadata_bytes, self.url
                )
            else:
                self.committed = open_committed(self.store)
            m = self.committed.manifest
            self._codec = stored_codec(m.codec_descriptor, self.store.describe(MANIFEST_NAME))
            self._metadata_bytes = self.committed.metadata_bytes
            files = {n: e.size for n, e in self.committed.manifest.files.items()}
            check_metadata(
                self._parse_metadata(),
                files,
                self.store.describe(METADATA_NAME),
                self._codec.max_ratio,
            )
            return
        except IncompleteCheckpointError:
            if self.store.exists(MANIFEST_NAME) or not self.store.exists(METADATA_NAME):
                if not self.store.find():
                    raise IncompleteCheckpointError(
                        f"no checkpoint at {self.url}: the location is empty or does not "
                        "exist. Check the URL (and storage_options)."
                    ) from None
                raise
        self.committed = None
        self._codec = get_codec("none")
        warnings.warn(
            f"{self.url} is a stock DCP checkpoint (no {MANIFEST_NAME} / {MARKER_NAME}): "
            "loading it without integrity verification.",
            StockCheckpointWarning,
            stacklevel=user_stacklevel(),
        )
        self._metadata_bytes = get_capped(self.store, METADATA_NAME, MAX_METADATA_SIZE)
        metadata = self._parse_metadata()
        check_metadata(metadata, self._stock_sizes(metadata), self.store.describe(METADATA_NAME))

    def _parse_metadata(self) -> Metadata:
        """The checked DCP Metadata of the opened checkpoint (a fresh object each call)."""
        written_by = self.committed.manifest.torch_version if self.committed else ""
        return load_metadata(self._metadata_bytes, self.store.describe(METADATA_NAME), written_by)

    def _stock_sizes(self, metadata: Metadata) -> dict[str, int]:
        """The size of every file a stock checkpoint's metadata names (names already
        checked to be inside the checkpoint); a missing one is left out."""
        sizes = {}
        for path in {info.relative_path for info in (metadata.storage_data or {}).values()}:
            try:
                sizes[path] = self.store.size(path)
            except StoreNotFoundError:
                continue
        return sizes

    # -- StorageReader -----------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Re-open (and re-check) the checkpoint if ``checkpoint_id`` names another URL."""
        if self._rebind(checkpoint_id):
            self._handed = None  # it was opened for the old URL
            self.open()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checked DCP Metadata (a fresh object; ``storage_meta`` filled in if absent).

        Raises ``IncompleteCheckpointError`` when asked for a rank's own metadata
        (``rank=``): ckptstore checkpoints have one ``.metadata`` for all ranks.
        """
        if kwargs.get("rank") is not None:
            raise IncompleteCheckpointError(f"{self.url} has no rank-local metadata")
        metadata = self._parse_metadata()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Keep ``metadata`` (and its storage data) for planning the reads."""
        self.metadata = metadata
        self.storage_data = metadata.storage_data or {}
        self._limits = item_limits(metadata)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Return ``plan`` unchanged."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Return ``plans`` unchanged."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        """Read every item of ``plan`` and hand it to ``planner``; returns a done future.

        Each distinct stored range is read once, at most ``memory_budget`` bytes in flight,
        checked against its manifest CRC32C (when verifying), decoded and delivered.
        Raises ``CorruptCheckpointError`` for a missing, truncated, unlisted or changed
        range and ``UnsafePickleError`` for an object item weights_only loading refuses
        (unless ``allow_pickle``); reads in flight finish before the error propagates.
        """
        if self.before_read is not None:
            self.before_read({self.storage_data[r.storage_index].relative_path for r in plan.items})
        # One read per distinct stored range, however many requests share it.
        by_range: dict[tuple[str, int, int], list[ReadItem]] = {}
        codecs: dict[tuple[str, int, int], Codec] = {}
        limits: dict[tuple[str, int, int], int | None] = {}
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            key = (info.relative_path, info.offset, info.length)
            by_range.setdefault(key, []).append(req)
            codecs[key] = item_codec(
                self._codec,
                getattr(info, "transform_descriptors", None),
                req.storage_index.fqn,
                self.url,
            )
            index = req.storage_index
            tensor = req.type != LoadItemType.BYTE_IO
            limit = self._limits.get((index.fqn, tuple(index.offset or ()))) if tensor else None
            if key in limits and (limit is None or (limits[key] or limit) < limit):
                limit = limits[key]  # a range two requests share: the tighter bound
            limits[key] = limit
        ranges = self.committed.manifest.range_index() if self.committed else {}
        verify = self.committed is not None and self.verify
        got = RangeDelivery(self.store, self.url, verify, self.allow_pickle, self.metadata)
        shared: set[tuple[str, int, int]] = set()
        if self.share_group is not None and verify:  # never unverified bytes to another rank
            order = list(
                dict.fromkeys(_key(self.storage_data[r.storage_index]) for r in plan.items)
            )
            shared = read_shared(
                self.share_group,
                order,
                self.config.memory_budget,
                lambda keys, buf, first: self._read_checked_into(keys, buf, first, ranges, got),
                lambda key, data: got.consume(
                    key, data, by_range[key], ranges.get(key), codecs[key], planner, limits[key]
                ),
            )

        # On an object store the reads are planned from the whole plan (``engine.readplan``):
        # small adjacent ranges of a file merge into one GET (a window); the rest are read
        # as GETs of one range size, chosen so the load keeps every connection busy (on a
        # volume, whose reads are preads, every range is read alone). A sliding window of
        # reads in flight, bounded by the memory budget. A tensor whose raw bytes the
        # manifest locates (``RangeEntry.span``) and whose target is the matching contiguous
        # CPU tensor is read straight into the target (a window of its own) or copied there
        # from its window: no decode. Everything else is checked, decoded and copied.
        keys = sorted(k for k in by_range if k not in shared)
        if self.store.capabilities.zero_copy_parts:
            # A volume: a request is a pread and costs nothing extra; plan nothing.
            get_size = self.config.part_size
            windows = [Window(p, o, n, (i,)) for i, (p, o, n) in enumerate(keys)]
        else:
            total = sum(k[2] for k in keys)
            largest = min(self.config.part_size, READ_RANGE)
            get_size = range_size(total, largest, self.engine.read_streams)
            windows = coalesce(keys, max_window=get_size)
        # In the plan's order (the state's, module by module): the items needed first land
        # first, and each is handed to DCP as it lands; the first window is read as smaller
        # GETs, so that it lands before the GETs of the rest (all in flight at once, on a
        # link that caps each connection's rate, would end together).
        first = {key: i for i, key in enumerate(by_range)}  # by_range: in the plan's order
        pending = deque(sorted(windows, key=lambda w: min(first[keys[m]] for m in w.members)))
        volume, streams = self.store.capabilities.zero_copy_parts, self.engine.read_streams
        first_window = pending[0] if pending and not volume else None
        inflight: deque[tuple[Window, Future, Direct | None]] = deque()
        inflight_bytes = 0
        try:
            while pending or inflight:
                while pending and (
                    not inflight or inflight_bytes + pending[0].length <= self.config.memory_budget
                ):
                    win = pending.popleft()
                    direct = None
                    if len(win.members) == 1:
                        key = keys[win.members[0]]
                        direct = got.direct(by_range[key], ranges.get(key), codecs[key], planner)
                    size = get_size
                    if win is first_window:  # the first item: spread over more GETs
                        size = range_size(win.length, get_size, streams, FIRST_RANGE)
                    if direct is None:
                        fut = self.engine.read_async(
                            self.store, win.path, win.offset, win.length, part_size=size
                        )
                    else:
                        at = win.offset + direct.span.offset
                        fut = self.engine.read_into_async(
                            self.store, win.path, at, direct.buf, part_size=size
                        )
                    inflight.append((win, fut, direct))
                    inflight_bytes += win.length
                win, fut, direct = inflight.popleft()
                inflight_bytes -= win.length
                if direct is not None:
                    key = keys[win.members[0]]
                    got.check_direct(key, fut, direct)
                    planner.commit_tensor(direct.req, direct.target)
                    continue
                data = got.window_bytes(win, fut)
                for i in win.members:
                    key = keys[i]
                    part = data[key[1] - win.offset : key[1] - win.offset + key[2]]
                    got.consume(
                        key, part, by_range[key], ranges.get(key), codecs[key], planner, limits[key]
                    )
        except BaseException:
            # Reads still in flight may be filling targets: let them finish before the
            # caller (e.g. a restore falling back to an older step) reuses those tensors.
            for _, fut, _ in inflight:
                try:
                    fut.exception()
                except BaseException:  # noqa: BLE001 - already failing with the first error
                    pass
            raise
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    def _read_checked_into(
        self,
        keys: list[Key],
        buf: memoryview,
        first: bool,
        ranges: dict[Key, RangeEntry],
        got: RangeDelivery,
    ) -> None:
        """Fill ``buf`` with the bytes of ``keys``, one after another, read in parallel
        straight into it (no copy) and each checked against the manifest's CRC32C (a range
        that does not check is read once more before it fails). Each range is read as GETs
        of the range size the plain reads use (down to ``FIRST_RANGE`` for the ``first``
        batch, which should land soon), so that an owner of a few large ranges keeps every
        connection busy too."""
        largest = min(self.config.part_size, READ_RANGE)
        smallest = FIRST_RANGE if first else MIN_RANGE
        size = range_size(sum(k[2] for k in keys), largest, self.engine.read_streams, smallest)
        views: dict[Key, memoryview] = {}
        at = 0
        for key in keys:
            views[key] = buf[at : at + key[2]]
            at += key[2]
        futs = {
            k: self.engine.read_into_async(self.store, k[0], k[1], views[k], part_size=size)
            for k in keys
        }
        try:
            for key, fut in futs.items():
                window = Window(key[0], key[1], key[2], ())
                try:
                    got.check(key, got.window_bytes(window, fut), ranges.get(key))
                except CorruptCheckpointError:  # read again: a bad read, or bad bytes stored
                    again = self.engine.read_into_async(
                        self.store, key[0], key[1], views[key], part_size=size
                    )
                    got.check(key, got.window_bytes(window, again), ranges.get(key))
        except BaseException:
            for fut in futs.values():  # none may still be writing into ``buf``
                fut.exception()
            raise

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["share_group"] = None
        return state


def _key(info: Any) -> Key:
    """The stored range of an item's storage info."""
    return (info.relative_path, info.offset, info.length)
