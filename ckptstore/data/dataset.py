"""ShardedDataset: a directory of shards on any store, listed once, read through the cache.

Call order::

    ds = ShardedDataset("s3://bucket/tokens/", format="parquet", cache_dir="/nvme/cache",
                        cache_limit="200GB", shuffle=True, seed=17)   # lists the shards
    ds.fingerprint, ds.num_samples, ds.order        # fixed for the life of the object
    samples = ds.samples_at(cursors)                # G[k] for global cursors, transformed
    ds[sample_id]                                   # one untransformed sample (map-style)
    ds.close()

Listing happens once, in the constructor: every shard's path, size and index (rows per row
group / record batch, read from the footer only) and a SHA-256 of its footer. The
fingerprint hashes all of it; it is stored in the loader state and checked on resume. With
torch.distributed initialised, rank 0 lists and broadcasts, so every rank holds the same
listing (the constructor is then collective: call it on every rank).

Each process (rank or DataLoader worker) opens its own store client, transfer engine and
cache view on first use, so the object may be forked or pickled into workers freely.
Everything a background thread uses (numpy.random, pyarrow's readers) is imported on the
main thread first: a module a thread is still importing when DataLoader workers are forked
stays locked forever in the children.
``transform(sample, seed)`` receives :func:`~ckptstore.data.order.sample_seed` (seed,
epoch, sample id): the same sample gets the same augmentation after any resume.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

import numpy as np
import numpy.random  # noqa: F401 - fork safety: see the module docstring

from ckptstore.config import MiB, TransferConfig
from ckptstore.data.cache import (
    CacheEntry,
    ShardCache,
    cache_paths,
    check_limit,
    probe_cache_dir,
)
from ckptstore.data.cachefiles import VerifiedFiles, make_key
from ckptstore.data.formats import EXTENSIONS, FORMATS, check_schemas, inspect, preload
from ckptstore.data.order import DataOrderError, sample_seed
from ckptstore.data.pack import PACK_PENDING
from ckptstore.data.runtime import ProcessRuntime
from ckptstore.data.stream import DataOrder
from ckptstore.engine.paths import is_safe_name
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import ConfigError, EmptyDatasetError, ShardFormatError

__all__ = ["Shard", "ShardedDataset", "parse_size", "list_shards", "default_buckets"]

log = logging.getLogger(__name__)

_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNITS.update({"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40})
_TMP_MARKS = (".ckptstore-tmp-",)
#: The data cache's default transfer settings: smaller parts than checkpoints use, so a
#: shard of a few tens of MiB is already fetched as parallel ranged GETs.
DATA_TRANSFER = TransferConfig(part_size=8 * MiB, concurrency=16, memory_budget=256 * MiB)


def parse_size(value: int | str | None) -> int | None:
    """Bytes in ``"200GB"``, ``"1.5GiB"``, ``"512MiB"`` or an int; None stays None."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?)?b?\s*", str(value).lower())
    if not m:
        raise ConfigError(f"cannot read a size from {value!r}; write e.g. '200GB' or '512MiB'")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def default_buckets(num_shards: int) -> int:
    """C when not given: about four shards' worth of samples per bucket."""
    return max(1, num_shards // 4)


@dataclass(frozen=True)
class Shard:
    """One listed shard: path below the dataset URL, size, rows per group, footer digest.

    ``schema`` is ``((column, type), ...)`` (``()`` for raw files); it is checked to agree
    across shards at listing and is not part of the fingerprint (the digest covers it).
    """

    path: str
    size: int
    rows: tuple[int, ...]
    digest: str = ""
    schema: tuple[tuple[str, str], ...] = ()

    @property
    def num_samples(self) -> int:
        """Samples in the shard (the sum of its row groups' rows)."""
        return sum(self.rows)


def usable_paths(store: Store, paths: Sequence[str], fmt: str, include: str | None) -> list[str]:
    """The listed ``paths`` a dataset of ``fmt`` reads, in the order given.

    A name a store cannot be asked for (``x//y.bin``, ``a/../b``, a control character:
    ``engine.paths``) is skipped here, with one warning naming how many and the first,
    never refused mid-epoch by the store. A folder a pack is still writing (or one that
    crashed) holds :data:`~ckptstore.data.pack.PACK_PENDING`: it is no dataset yet.
    """
    bad = [p for p in paths if not is_safe_name(p)]
    if bad:
        log.warning(
            "skipping %d object(s) under %s whose names cannot be read safely (e.g. %s: "
            "empty, '.' or '..' segments, or control characters); rename them to include them",
            len(bad),
            store.describe(),
            ascii(bad[0]),
        )
    pending = [p for p in paths if p.rsplit("/", 1)[-1] == PACK_PENDING]
    if pending:
        where = store.describe(pending[0].rpartition("/")[0])
        raise EmptyDatasetError(
            f"{where} is being packed, or a pack into it failed ({PACK_PENDING} is there): "
            "it is not a complete dataset. Wait for the pack, or run it again"
        )
    return [p for p in paths if is_safe_name(p) and _included(p, fmt, include)]


def _included(path: str, fmt: str, include: str | None) -> bool:
    if any(mark in path for mark in _TMP_MARKS):
        return False
    if include is not None:
        return fnmatch(path, include)
    if fmt == "raw":
        return not any(part.startswith(".") for part in path.split("/"))
    return path.lower().endswith(EXTENSIONS[fmt])


def _detect_format(paths: Sequence[str]) -> str:
    for fmt in ("parquet", "arrow"):
        if any(p.lower().endswith(EXTENSIONS[fmt]) for p in paths):
            return fmt
    raise ConfigError(
        "no .parquet or .arrow/.feather files found to detect the format; pass "
        "format='parquet', 'arrow' or 'raw'"
    )


def list_shards(
    store: Store,
    fmt: str | None,
    include: str | None = None,
    engine: TransferEngine | None = None,
    threads: int = 16,
) -> tuple[str, list[Shard]]:
    """``(format, shards)`` under the store's root, sorted by path; footers read in parallel."""
    engine = engine or TransferEngine(DATA_TRANSFER)
    listed = store.find_sizes("")  # sizes with the listing where the store has them
    paths = list(listed) if listed is not None else store.find("")
    fmt = fmt or _detect_format(paths)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    paths = usable_paths(store, paths, fmt, include)

    def one(path: str) -> Shard:
        what = f"listing of {store.describe(path)}"
        size = listed[path] if listed is not None else engine.retry(lambda: store.size(path), what)

        def read(off: int, n: int) -> bytes:
            return engine.retry(lambda: store.get(path, off, off + n), what)

        try:
            rows, digest, schema = inspect(fmt, size, read)
        except ShardFormatError as exc:
            raise ShardFormatError(f"{store.describe(path)}: {exc}") from exc
        return Shard(path, size, rows, digest, schema)

    if len(paths) <= 1:
        return fmt, [one(p) for p in paths]
    with ThreadPoolExecutor(min(threads, len(paths)), "ckptstore-list") as pool:
        return fmt, list(pool.map(one, paths))


def _fingerprint(fmt: str, shards: Sequence[Shard]) -> str:
    doc = [fmt, [[s.path, s.size, list(s.rows), s.digest] for s in shards]]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()[:32]


def _dist_rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a core dependency
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardedDataset:
    """A sharded dataset under ``url`` (see the module docstring for the call order).

    ``format``: ``"parquet"``, ``"arrow"`` (IPC file / Feather v2) or ``"raw"`` (a sample is
    a file); None detects Parquet or Arrow from the file names. ``include`` is a glob on
    paths below ``url`` (default: the format's extensions; raw: every non-hidden file).
    ``cache_dir`` (default ``$CKPTSTORE_CACHE_DIR`` or ``~/.cache/ckptstore/data``) is
    shared by every process of the node; ``cache_limit`` (bytes or ``"200GB"``) caps it and
    must hold the largest shard. ``buckets`` is C of the data order (default: about four
    shards per bucket; a bucket's shards should fit the cache). ``columns`` selects columns.
    """

    def __init__(
        self,
        url: str | Store,
        *,
        storage_options: dict[str, Any] | None = None,
        format: str | None = None,
        cache_dir: str | None = None,
        cache_limit: int | str | None = None,
        shuffle: bool = True,
        seed: int = 0,
        buckets: int | None = None,
        transform: Callable[[Any, int], Any] | None = None,
        columns: Sequence[str] | None = None,
        include: str | None = None,
        transfer_config: TransferConfig | None = None,
        verify_cached: bool = True,
        decode_cache: int | str = "256MiB",
        max_open_shards: int = 8,
        cache_wait_timeout: float = 600.0,
    ) -> None:
        self.url = url if isinstance(url, str) else url.url
        self._store_arg = url if isinstance(url, Store) else None
        self.storage_options = dict(storage_options or {})
        self.cache_dir = os.path.abspath(
            os.path.expanduser(
                cache_dir
                or os.environ.get("CKPTSTORE_CACHE_DIR")
                or os.path.join("~", ".cache", "ckptstore", "data")
            )
        )
        self.cache_limit = parse_size(cache_limit)
        self.shuffle = bool(shuffle)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ConfigError(f"seed must be an int, got {seed!r}")
        self.seed = int(seed)
        self.transform = transform
        self.columns = list(columns) if columns is not None else None
        self.transfer_config = transfer_config or DATA_TRANSFER
        self.verify_cached = verify_cached
        self.decode_cache = parse_size(decode_cache) or 0
        self.max_open_shards = max(1, max_open_shards)
        self.cache_wait_timeout = cache_wait_timeout
        self._runtime: ProcessRuntime | None = None
        self.verified = VerifiedFiles()  # this rank's checked cache files (workers: a copy)
        self.runtime()  # store client and engine made on the main thread, on every rank
        self.format, self.shards = self._list(format, include)
        preload(self.format)
        if not self.shards:
            raise EmptyDatasetError(
                f"no {self.format} shards under {self.url}"
                + (f" matching {include!r}" if include else "")
                + "; check the URL, the format and the include pattern"
            )
        sizes = [s.num_samples for s in self.shards]
        if sum(sizes) == 0:
            raise EmptyDatasetError(
                f"the {len(sizes)} shards under {self.url} hold no samples (every file is empty)"
            )
        check_schemas([(s.path, s.schema) for s in self.shards], self.columns)
        self.shard_sizes = tuple(sizes)
        self.num_samples = sum(sizes)
        self.fingerprint = _fingerprint(self.format, self.shards)
        self.buckets_explicit = buckets is not None
        self.buckets = int(buckets) if buckets is not None else default_buckets(len(self.shards))
        if self.buckets < 1:
            raise ConfigError(f"buckets must be >= 1, got {buckets}")
        self.entries = [self._entry(s) for s in self.shards]
        check_limit(self.cache_limit, self.entries)
        probe_cache_dir(cache_paths(self.cache_dir))

    # -- listing -------------------------------------------------------------------------
    def _list(self, fmt: str | None, include: str | None) -> tuple[str, list[Shard]]:
        rank, world = _dist_rank_world()
        result: list[Any] = [None]
        if rank == 0:
            try:
                result[0] = list_shards(self.store, fmt, include, self.runtime().engine)
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                result[0] = exc
        if world > 1:
            import torch.distributed as dist

            if rank != 0 and fmt != "raw":
                preload("parquet")  # pyarrow: imported while rank 0 lists, not after
            dist.broadcast_object_list(result, src=0)
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def _entry(self, s: Shard) -> CacheEntry:
        key = make_key(f"{self.url}|{s.path}|{s.size}|{s.digest}".encode(), s.path)
        return CacheEntry(key, s.path, s.size, self.format, s.digest, s.rows)

    # -- per-process state ---------------------------------------------------------------
    @property
    def store(self) -> Store:
        """This process's store of the dataset's URL."""
        return self.runtime().store

    def runtime(self) -> ProcessRuntime:
        """This process's store, engine, cache and open readers (re-made after a fork)."""
        rt = self._runtime
        if rt is None or rt.pid != os.getpid():
            rt = self._runtime = ProcessRuntime(self)
        return rt

    def set_buckets(self, buckets: int) -> None:
        """Change C (a loader adopts a checkpoint's C when none was given explicitly)."""
        if buckets < 1:
            raise DataOrderError(f"buckets must be >= 1, got {buckets}")
        self.buckets = int(buckets)
        if self._runtime is not None:
            self._runtime.order_cache = None

    def make_order(self) -> DataOrder:
        """A new :class:`DataOrder` for this dataset (one per thread that computes a lot)."""
        return DataOrder(
            self.fingerprint,
            self.seed,
            self.shard_sizes,
            buckets=self.buckets,
            shuffle=self.shuffle,
        )

    @property
    def order(self) -> DataOrder:
        """This process's data order (the global stream G)."""
        return self.runtime().order()

    def make_cache(
        self, order: DataOrder | None = None, verified: VerifiedFiles | None = None
    ) -> ShardCache:
        """A new view of the node-local cache (the loader's prefetcher keeps its own);
        ``verified``: what it trusts as checked (default: nothing, as a new process)."""
        rt = self.runtime()
        return ShardCache(
            self.cache_dir,
            self.cache_limit,
            rt.store,
            rt.engine,
            self.entries,
            order or self.make_order(),
            verify=self.verify_cached,
            wait_timeout=self.cache_wait_timeout,
            on_pressure=rt.release_idle,
            verified=verified,
        )

    # -- samples -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, sample_id: int) -> Any:
        """One sample by id (its index in the unshuffled shard concatenation), untransformed."""
        if not 0 <= int(sample_id) < self.num_samples:
            raise IndexError(f"sample id {sample_id} is not in [0, {self.num_samples})")
        return self.fetch([int(sample_id)])[0]

    def fetch(self, sample_ids: Sequence[int] | np.ndarray, cursor: int = 0) -> list[Any]:
        """Samples by id, untransformed; ``cursor`` tells the cache where the stream is."""
        return self.runtime().fetch(np.asarray(sample_ids, dtype=np.int64), cursor)

    def samples_at(self, cursors: Sequence[int]) -> list[Any]:
        """Samples ``G[k]`` for global cursors ``k``, with ``transform(sample, seed)`` applied."""
        ks = np.asarray(cursors, dtype=np.int64)
        if not ks.size:
            return []
        ids = self.order.sample_ids(ks)
        samples = self.fetch(ids, int(ks[0]))
        if self.transform is None:
            return samples
        epochs = (ks // self.num_samples).tolist()
        return [
            self.transform(s, sample_seed(self.seed, e, i))
            for s, e, i in zip(samples, epochs, ids.tolist())
        ]

    def cache_stats(self) -> dict[str, float]:
        """This process's cache counters since the last call (what workers report)."""
        return self.runtime().cache.stats.take_delta()

    def close(self) -> None:
        """Release this process's readers, pins, engine threads and store client."""
        rt, self._runtime = self._runtime, None
        if rt is not None and rt.pid == os.getpid():
            rt.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_runtime"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"ShardedDataset({self.url!r}, format={self.format!r}, shards={len(self.shards)}, "
            f"samples={self.num_samples}, fingerprint={self.fingerprint[:12]})"
        )
