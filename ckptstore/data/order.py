"""The data order: which sample is served when, as pure functions (no I/O, no torch).

Contract:

- A dataset is a list of shard sample counts ``n_0, n_1, ...`` (N = their sum). A sample's id
  is its index in the unshuffled concatenation of the shards.
- Epoch ``e``'s order is a pure function of (fingerprint, seed, e, C = ``buckets``), never of
  world size or worker count. The id range ``[0, N)`` is cut into C contiguous buckets
  (bucket b is ``[b*N//C, (b+1)*N//C)``); the bucket order is shuffled, then the ids inside
  each bucket. Each shuffle draws from its own PCG64 stream seeded by a SHA-256 of (fingerprint,
  seed, epoch, stream name), and sorts the raw 64-bit draws with a stable sort, so the order
  is the same on every platform and numpy version. ``shuffle=False`` is the identity order.
  While a bucket is served, reads stay inside N/C consecutive ids (a few consecutive shards):
  pick C so that one bucket's shards fit in the shard cache.
- The global stream ``G`` is the concatenation of epochs 0, 1, 2, ...; cursor ``k`` names
  ``G[k]``: epoch ``k // N``, position ``k % N`` in it.
- With R ranks, micro-batch B, W workers and start cursor k0, ``G[k0 + j]`` goes to rank
  ``(j // B) % R``, that rank's batch ``j // (R*B)``, produced by worker ``batch % W``.
  Batches may span epochs. The loader's whole state is one cursor (:class:`OrderState`).
- Augmentation randomness for a sample is :func:`sample_seed` (seed, epoch, sample id).
- The torch DataLoader under a rank's loader draws its worker base seed from a generator
  seeded with :func:`loader_seed` (seed, epoch, rank), never from the global torch RNG.

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

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ckptstore.errors import CkptStoreError

__all__ = [
    "DataOrderError",
    "OrderState",
    "agreed_cursor",
    "check_resume",
    "cursor_after",
    "epoch_batches",
    "epoch_permutation",
    "loader_seed",
    "next_epoch_boundary",
    "num_batches",
    "rank_batch_indices",
    "sample_seed",
    "worker_for_batch",
]

ORDER_STATE_VERSION = 1
_ORDER_DOMAIN = b"ckptstore.data.order/v1"
_SEED_DOMAIN = "ckptstore.data.sample_seed/v1"
_LOADER_SEED_DOMAIN = "ckptstore.data.loader_seed/v1"
_MASK63 = (1 << 63) - 1

IntArray = npt.NDArray[np.int64]


class DataOrderError(CkptStoreError, ValueError):
    """The data order cannot be computed or resumed as asked; the message says what to change."""


def _int(name: str, value: object, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DataOrderError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise DataOrderError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _sizes(shard_sizes: Iterable[int]) -> tuple[int, ...]:
    sizes = tuple(_int(f"shard_sizes[{i}]", n) for i, n in enumerate(shard_sizes))
    if sum(sizes) < 1:
        raise DataOrderError("the dataset has no samples (shard_sizes sum to 0)")
    return sizes


def _check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise DataOrderError(f"{name} must be a str, got {value!r}")
    return value


def _raw_draws(
    fp_digest: bytes, seed: int, epoch: int, stream: str, size: int
) -> npt.NDArray[np.uint64]:
    """``size`` raw 64-bit PCG64 draws from a stream keyed by (fingerprint, seed, epoch, name).

    Only SeedSequence and PCG64's raw output are used: numpy keeps both stable across versions.
    """
    key = hashlib.sha256(_ORDER_DOMAIN + fp_digest + f"|{seed}|{epoch}|{stream}".encode())
    bitgen = np.random.PCG64(np.random.SeedSequence(int.from_bytes(key.digest(), "little")))
    return bitgen.random_raw(size)


def epoch_permutation(
    fingerprint: str,
    seed: int,
    epoch: int,
    num_samples: int,
    shard_sizes: Sequence[int],
    buckets: int,
    shuffle: bool = True,
) -> IntArray:
    """Sample ids in the order epoch ``epoch`` serves them: a permutation of ``range(N)``.

    Pure function of (fingerprint, seed, epoch, buckets, shuffle) and the dataset size;
    ``shard_sizes`` must sum to ``num_samples`` (checked). Cost O(N log(N/C));
    ``ckptstore.data.stream.DataOrder`` caches it per epoch.
    """
    _check_str("fingerprint", fingerprint)
    seed = _int("seed", seed, minimum=None)
    epoch = _int("epoch", epoch)
    n = _int("num_samples", num_samples, minimum=1)
    buckets = _int("buckets", buckets, minimum=1)
    total = sum(_sizes(shard_sizes))
    if total != n:
        raise DataOrderError(f"num_samples={n} but shard_sizes sum to {total}")
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    fp = hashlib.sha256(fingerprint.encode("utf-8")).digest()
    bounds = [b * n // buckets for b in range(buckets + 1)]
    bucket_order = np.argsort(_raw_draws(fp, seed, epoch, "buckets", buckets), kind="stable")
    out = np.empty(n, dtype=np.int64)
    pos = 0
    for b in bucket_order.tolist():
        lo, hi = bounds[b], bounds[b + 1]
        if hi > lo:
            draws = _raw_draws(fp, seed, epoch, f"bucket-{b}", hi - lo)
            out[pos : pos + hi - lo] = lo + np.argsort(draws, kind="stable")
            pos += hi - lo
    return out


def _hash63(domain: str, *parts: int) -> int:
    text = "|".join([domain, *map(str, parts)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & _MASK63


def sample_seed(seed: int, epoch: int, sample_index: int) -> int:
    """63-bit seed for one sample's augmentation: a stable hash of (seed, epoch, sample id).

    ``sample_index`` is the sample's id (its index in the unshuffled dataset); the same
    sample in the same epoch gets the same seed after any resume, on any world size.
    """
    seed = _int("seed", seed, minimum=None)
    epoch = _int("epoch", epoch)
    sample_index = _int("sample_index", sample_index)
    return _hash63(_SEED_DOMAIN, seed, epoch, sample_index)


def loader_seed(seed: int, epoch: int, rank: int) -> int:
    """63-bit seed of the ``torch.Generator`` behind rank ``rank``'s loader in epoch ``epoch``.

    torch's DataLoader draws each iteration's base seed from that generator; worker ``w``
    then seeds ``torch``, ``random`` and ``numpy.random`` from ``base + w``. So worker seeds
    depend only on (seed, epoch, rank, worker id): an iteration resumed mid-epoch gives its
    workers the seeds the uninterrupted epoch gave them, whatever the global torch RNG holds
    (which the loader never draws from). Ranks get different seeds. A worker's draws still
    depend on how many samples it made before; randomness that must survive any resume
    belongs in ``transform(sample, seed)`` (:func:`sample_seed`).
    """
    seed = _int("seed", seed, minimum=None)
    return _hash63(_LOADER_SEED_DOMAIN, seed, _int("epoch", epoch), _int("rank", rank))


# --- assignment of the global stream to ranks, batches and workers -------------------------


def _check_layout(k0: int, world_size: int, batch_size: int) -> tuple[int, int, int]:
    return (
        _int("k0", k0),
        _int("world_size", world_size, minimum=1),
        _int("batch_size", batch_size, minimum=1),
    )


def rank_batch_indices(
    k0: int, rank: int, world_size: int, batch_size: int, batch_number: int
) -> list[int]:
    """Global cursor indices of batch ``batch_number`` of rank ``rank``, starting at ``k0``.

    ``G[k0 + j]`` goes to rank ``(j // B) % R``, batch ``j // (R*B)``; so this batch is the
    ``B`` consecutive cursors from ``k0 + batch_number*R*B + rank*B``.
    """
    k0, r, b = _check_layout(k0, world_size, batch_size)
    rank = _int("rank", rank)
    if rank >= r:
        raise DataOrderError(f"rank {rank} is not below world_size {r}")
    start = k0 + _int("batch_number", batch_number) * r * b + rank * b
    return list(range(start, start + b))


def worker_for_batch(batch_number: int, num_workers: int) -> int:
    """The worker that produces a rank's batch ``batch_number``: ``batch_number % W``.

    ``num_workers=0`` (loading in the main process) behaves as one worker.
    """
    return _int("batch_number", batch_number) % max(1, _int("num_workers", num_workers))


def cursor_after(
    k0: int,
    world_size: int,
    batch_size: int,
    batches_consumed: int,
    end_cursor: int | None = None,
) -> int:
    """The cursor once every rank consumed ``batches_consumed`` batches from ``k0``.

    ``k0 + batches_consumed*R*B``, capped at ``end_cursor`` when given (the last, short
    global step of an :func:`epoch_batches` view ends exactly at its end cursor).
    """
    k0, r, b = _check_layout(k0, world_size, batch_size)
    cursor = k0 + _int("batches_consumed", batches_consumed) * r * b
    if end_cursor is not None:
        cursor = min(cursor, _int("end_cursor", end_cursor, minimum=k0))
    return cursor


def num_batches(
    k0: int, world_size: int, batch_size: int, epoch_end_cursor: int, drop_last: bool = False
) -> int:
    """How many batches every rank gets in the view ``[k0, epoch_end_cursor)`` (same on all)."""
    k0, r, b = _check_layout(k0, world_size, batch_size)
    span = _int("epoch_end_cursor", epoch_end_cursor, minimum=k0) - k0
    full, tail = divmod(span, r * b)
    return full if drop_last or tail == 0 else full + 1


def epoch_batches(
    k0: int,
    rank: int,
    world_size: int,
    batch_size: int,
    epoch_end_cursor: int,
    drop_last: bool = False,
) -> list[list[int]]:
    """Rank ``rank``'s batches (global cursor index lists) for the view ``[k0, epoch_end_cursor)``.

    Full global steps follow :func:`rank_batch_indices`. A final short global step of ``T <
    R*B`` cursors is split so tail cursor ``j`` goes to rank ``j // B``: low ranks get full
    batches, one rank may get a short one and the rest an empty list. Every rank gets the
    same number of batches, so collectives stay in step; a loader may skip training on an
    empty batch but must still count it. Without ``drop_last`` the union over ranks is
    exactly ``range(k0, epoch_end_cursor)``.

    With ``drop_last`` that short global step is dropped: those ``T`` samples are not
    served this epoch, and the loader moves the cursor to ``epoch_end_cursor`` when the view
    is exhausted, so epochs stay aligned and no sample is ever served twice. (A save taken
    before exhaustion holds the cursor after the last full step; a resume with another
    ``R*B`` re-splits that tail.)
    """
    k0, r, b = _check_layout(k0, world_size, batch_size)
    rank = _int("rank", rank)
    if rank >= r:
        raise DataOrderError(f"rank {rank} is not below world_size {r}")
    end = _int("epoch_end_cursor", epoch_end_cursor, minimum=k0)
    full = (end - k0) // (r * b)
    out = [rank_batch_indices(k0, rank, r, b, s) for s in range(full)]
    if num_batches(k0, r, b, end, drop_last) > full:
        tail_start = k0 + full * r * b
        lo = min(end, tail_start + rank * b)
        out.append(list(range(lo, min(end, lo + b))))
    return out


def next_epoch_boundary(cursor: int, num_samples: int) -> int:
    """The first cursor of the next epoch: end of the epoch ``cursor`` lies in."""
    n = _int("num_samples", num_samples, minimum=1)
    return (_int("cursor", cursor) // n + 1) * n


def agreed_cursor(cursors: Iterable[int]) -> int:
    """The one cursor all ranks hold (pass every rank's cursor, e.g. from all_gather)."""
    values = [_int(f"cursors[{i}]", c) for i, c in enumerate(cursors)]
    if not values:
        raise DataOrderError("no cursors given")
    if len(set(values)) != 1:
        by_rank = ", ".join(f"rank {i}: {c}" for i, c in enumerate(values))
        raise DataOrderError(
            f"ranks disagree on the data cursor ({by_rank}); every rank must count the same "
            "batches handed to training before a save"
        )
    return values[0]


# --- loader state --------------------------------------------------------------------------


@dataclass(frozen=True)
class OrderState:
    """A loader's whole resumable state: the cursor plus what fixes the order (~100 bytes)."""

    cursor: int
    seed: int
    buckets: int
    fingerprint: str
    shuffle: bool = True

    def __post_init__(self) -> None:
        _int("cursor", self.cursor)
        _int("seed", self.seed, minimum=None)
        _int("buckets", self.buckets, minimum=1)
        _check_str("fingerprint", self.fingerprint)
        if not isinstance(self.shuffle, bool):
            raise DataOrderError(f"shuffle must be a bool, got {self.shuffle!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (with a format version) for a checkpoint."""
        return {
            "version": ORDER_STATE_VERSION,
            "cursor": int(self.cursor),
            "seed": int(self.seed),
            "buckets": int(self.buckets),
            "fingerprint": self.fingerprint,
            "shuffle": self.shuffle,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OrderState:
        """Inverse of :meth:`to_dict`; refuses unknown versions and missing fields."""
        version = data.get("version")
        if version != ORDER_STATE_VERSION:
            raise DataOrderError(
                f"data order state version {version!r} is not supported (this ckptstore "
                f"reads version {ORDER_STATE_VERSION}); load it with the ckptstore that wrote it"
            )
        missing = [
            k for k in ("cursor", "seed", "buckets", "fingerprint", "shuffle") if k not in data
        ]
        if missing:
            raise DataOrderError(f"data order state lacks {', '.join(missing)}")
        return cls(
            cursor=data["cursor"],
            seed=data["seed"],
            buckets=data["buckets"],
            fingerprint=data["fingerprint"],
            shuffle=data["shuffle"],
        )


def check_resume(
    saved: OrderState,
    current: OrderState,
    *,
    allow_seed_change: bool = False,
    allow_dataset_change: bool = False,
) -> OrderState:
    """The state to resume from: ``current``'s order settings at ``saved.cursor``.

    Raises :class:`DataOrderError` naming every difference that would change the order
    (``current.cursor`` is ignored). A changed seed or dataset is accepted only with the
    matching ``allow_*`` option: the stream then continues at the saved cursor in the new
    order, so samples may repeat or be missed. A changed ``buckets`` or ``shuffle`` has no
    override: configure the saved value.
    """
    problems = []
    if saved.fingerprint != current.fingerprint and not allow_dataset_change:
        problems.append(
            f"the dataset fingerprint differs (saved {saved.fingerprint!r}, now "
            f"{current.fingerprint!r}); restore the saved dataset, or pass "
            "allow_dataset_change=True to continue at the saved cursor on this one"
        )
    if saved.seed != current.seed and not allow_seed_change:
        problems.append(
            f"the seed differs (saved {saved.seed}, now {current.seed}); set seed={saved.seed}, "
            "or pass allow_seed_change=True to continue at the saved cursor in the new order"
        )
    if saved.buckets != current.buckets:
        problems.append(
            f"the bucket count differs (saved {saved.buckets}, now {current.buckets}); "
            f"set buckets={saved.buckets}"
        )
    if saved.shuffle != current.shuffle:
        problems.append(
            f"shuffle differs (saved {saved.shuffle}, now {current.shuffle}); "
            f"set shuffle={saved.shuffle}"
        )
    if problems:
        raise DataOrderError("cannot resume the data order exactly: " + "; ".join(problems))
    return OrderState(
        cursor=saved.cursor,
        seed=current.seed,
        buckets=current.buckets,
        fingerprint=current.fingerprint,
        shuffle=current.shuffle,
    )
