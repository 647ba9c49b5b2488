"""One dataset's global stream G, cached: what the loader and the shard cache read.

:class:`DataOrder` evaluates :func:`ckptstore.data.order.epoch_permutation` lazily, one epoch
at a time (small LRU), and answers the questions the loader and the cache ask about G:
which sample a cursor names, which shard holds it, and when each shard is next needed.
Pure computation: no I/O, no torch. The order contract lives in :mod:`ckptstore.data.order`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from ckptstore.data.order import OrderState, epoch_permutation
from ckptstore.data.order_checks import (
    MAX_CURSOR,
    DataOrderError,
    IntArray,
    check_cursor,
    check_int,
    check_sizes,
    check_str,
)

__all__ = ["DataOrder"]


class DataOrder:
    """The global stream G of one dataset under one (fingerprint, seed, buckets, shuffle).

    Keeps the ``cache_epochs`` most recently used epoch permutations (LRU; 8 bytes a sample
    each). Thread-safe. Returned arrays are read-only. The order's contract is
    :mod:`ckptstore.data.order`'s docstring.

    Call order for a loader on rank ``r``:

    1. ``order = DataOrder(fingerprint, seed, shard_sizes, buckets=C, shuffle=...)`` (the cached
       stream, :mod:`ckptstore.data.stream`).
    2. On resume: ``k0 = check_resume(saved_state, order.state(0)).cursor``; else ``k0 = 0``.
    3. For batch ``s = 0, 1, ...``: ``idx = rank_batch_indices(k0, r, R, B, s)``, built by worker
       ``worker_for_batch(s, W)`` from ``order.sample_ids(idx)``.
    4. When batch ``s`` is handed to the training loop (main process, not a worker), the cursor
       becomes ``cursor_after(k0, R, B, s + 1)``.
    5. On save: ``agreed_cursor(<all ranks' cursors>)`` then ``order.state(cursor).to_dict()``.

    The shard cache calls ``DataOrder.shard_first_use`` (prefetch order) and
    ``DataOrder.next_use_distance`` (evict the shard needed farthest in the future).
    """

    def __init__(
        self,
        fingerprint: str,
        seed: int,
        shard_sizes: Iterable[int],
        *,
        buckets: int,
        shuffle: bool = True,
        cache_epochs: int = 2,
    ) -> None:
        self.fingerprint = check_str("fingerprint", fingerprint)
        self.seed = check_int("seed", seed, minimum=None)
        self.buckets = check_int("buckets", buckets, minimum=1)
        self.shuffle = bool(shuffle)
        self.shard_sizes = check_sizes(shard_sizes)
        self.num_samples = sum(self.shard_sizes)
        self.shard_offsets: IntArray = np.cumsum((0, *self.shard_sizes), dtype=np.int64)
        self._cache_epochs = check_int("cache_epochs", cache_epochs, minimum=1)
        self._cache: OrderedDict[int, IntArray] = OrderedDict()
        self._lock = threading.Lock()
        self._last_use: tuple[tuple[int, int], dict[int, int]] | None = None

    @classmethod
    def from_state(cls, state: OrderState, shard_sizes: Iterable[int], **kwargs: Any) -> DataOrder:
        """The order a saved (or checked, see :func:`check_resume`) state describes."""
        return cls(
            state.fingerprint,
            state.seed,
            shard_sizes,
            buckets=state.buckets,
            shuffle=state.shuffle,
            **kwargs,
        )

    def state(self, cursor: int) -> OrderState:
        """The loader state at ``cursor``."""
        return OrderState(cursor, self.seed, self.buckets, self.fingerprint, self.shuffle)

    def permutation(self, epoch: int) -> IntArray:
        """Epoch ``epoch``'s sample ids in order (cached, read-only)."""
        epoch = check_int("epoch", epoch)
        with self._lock:
            perm = self._cache.get(epoch)
            if perm is None:
                perm = epoch_permutation(
                    self.fingerprint,
                    self.seed,
                    epoch,
                    self.num_samples,
                    self.shard_sizes,
                    self.buckets,
                    self.shuffle,
                )
                perm.flags.writeable = False
                self._cache[epoch] = perm
                while len(self._cache) > self._cache_epochs:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(epoch)
            return perm

    def global_sample(self, k: int) -> tuple[int, int, int]:
        """``(epoch, position_in_epoch, sample_id)`` of cursor ``k``."""
        epoch, pos = divmod(check_cursor("k", k), self.num_samples)
        return epoch, pos, int(self.permutation(epoch)[pos])

    def sample_ids(self, cursors: Iterable[int] | npt.ArrayLike) -> IntArray:
        """Sample ids ``G[k]`` for many cursors at once (vectorised)."""
        try:
            ks = np.asarray(cursors, dtype=np.int64).reshape(-1)
        except OverflowError:
            raise DataOrderError(f"cursors must lie in [0, {MAX_CURSOR}]") from None
        if ks.size and (int(ks.min()) < 0 or int(ks.max()) > MAX_CURSOR):
            raise DataOrderError(f"cursors must lie in [0, {MAX_CURSOR}]")
        epochs, pos = np.divmod(ks, self.num_samples)
        out = np.empty_like(ks)
        for e in sorted(set(epochs.tolist())):  # np.unique imports numpy.ma (0.1 s a worker)
            mask = epochs == e
            out[mask] = self.permutation(e)[pos[mask]]
        return out

    def stream(self, cursor: int, count: int) -> IntArray:
        """Sample ids ``G[cursor : cursor + count]`` (contiguous slices, no fancy indexing)."""
        cursor, count = check_cursor("cursor", cursor), check_int("count", count)
        parts = []
        while count > 0:
            epoch, pos = divmod(cursor, self.num_samples)
            take = min(count, self.num_samples - pos)
            parts.append(self.permutation(epoch)[pos : pos + take])
            cursor, count = cursor + take, count - take
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def shard_of(self, sample_ids: npt.ArrayLike) -> IntArray:
        """The shard holding each sample id (empty shards hold none)."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_samples):
            raise DataOrderError(f"sample ids must lie in [0, {self.num_samples})")
        return np.searchsorted(self.shard_offsets, ids, side="right").astype(np.int64) - 1

    def locate(self, sample_id: int) -> tuple[int, int]:
        """``(shard, index_in_shard)`` of one sample id."""
        shard = int(self.shard_of(np.int64(check_int("sample_id", sample_id))))
        return shard, int(sample_id) - int(self.shard_offsets[shard])

    def _first_use(self, cursor: int, horizon: int) -> tuple[IntArray, IntArray]:
        cursor, horizon = check_cursor("cursor", cursor), check_int("horizon", horizon)
        # Every non-empty shard is used before the end of the next epoch: look no further.
        span = min(horizon, 2 * self.num_samples - cursor % self.num_samples)
        used = self.shard_of(self.stream(cursor, span))
        first = np.full(len(self.shard_sizes), span, dtype=np.int64)
        np.minimum.at(first, used, np.arange(span, dtype=np.int64))
        shards = np.flatnonzero(first < span)
        shards = shards[np.argsort(first[shards], kind="stable")]
        return shards.astype(np.int64), first[shards]

    def shard_first_use(self, cursor: int, horizon: int) -> list[int]:
        """Shards used by ``G[cursor : cursor + horizon]``, in order of first use.

        The cache prefetches in this order (within its byte budget). O(h log S + S log S),
        h = ``min(horizon, ~2N)``, S shards.
        """
        return [int(s) for s in self._first_use(cursor, horizon)[0]]

    def _use_map(self, cursor: int, horizon: int) -> dict[int, int]:
        key = (check_int("cursor", cursor), check_int("horizon", horizon))
        last = self._last_use
        if last is not None and last[0] == key:
            return last[1]
        shards, first = self._first_use(*key)
        result = dict(zip(shards.tolist(), first.tolist()))
        self._last_use = (key, result)
        return result

    def next_use_distances(self, cursor: int, horizon: int) -> dict[int, int]:
        """``{shard: d}``: the shard's next use is ``G[cursor + d]``; unused shards are absent."""
        return dict(self._use_map(cursor, horizon))

    def next_use_distance(self, shard: int, cursor: int, horizon: int) -> int | None:
        """Samples from ``cursor`` until ``shard`` is next used; None if not within ``horizon``.

        The cache evicts the shard with the largest distance (None first). Repeated calls at
        one (cursor, horizon) share one computation.
        """
        shard = check_int("shard", shard)
        if shard >= len(self.shard_sizes):
            raise DataOrderError(
                f"shard {shard} is not below the shard count {len(self.shard_sizes)}"
            )
        return self._use_map(cursor, horizon).get(shard)
