"""The data order: which sample is served when, as pure functions (no I/O, no torch).

Contract: a sample's id is its index in the unshuffled concatenation of the shards (N in
all). Epoch ``e``'s order is a pure function of (fingerprint, seed, e, C = ``buckets``),
never of world size or worker count: ``[0, N)`` is cut into C contiguous buckets, the
bucket order is shuffled, then the ids inside each (:func:`epoch_permutation`), so a
bucket's reads stay within a few consecutive shards. The global stream ``G`` is epochs
0, 1, 2, ... end to end; cursor ``k`` names ``G[k]``. With R ranks, micro-batch B and W
workers from cursor k0, ``G[k0 + j]`` goes to rank ``(j // B) % R``, that rank's batch
``j // (R*B)``, made by worker ``batch % W``; batches may span epochs, and the loader's
whole state is one cursor (:class:`OrderState`). A sample's augmentation seed is
:func:`sample_seed`, a DataLoader's worker seed :func:`loader_seed`, never the global torch
RNG. The call order of a loader is :class:`~ckptstore.data.stream.DataOrder`'s docstring.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ckptstore.data.batching import (
    agreed_cursor,
    cursor_after,
    epoch_batch,
    epoch_batches,
    next_epoch_boundary,
    num_batches,
    rank_batch_indices,
    worker_for_batch,
)
from ckptstore.data.order_checks import DataOrderError, IntArray, check_int, check_sizes, check_str
from ckptstore.data.resume import ORDER_STATE_VERSION, OrderState, check_resume

__all__ = [
    "ORDER_STATE_VERSION",
    "DataOrderError",
    "IntArray",
    "OrderState",
    "agreed_cursor",
    "check_resume",
    "cursor_after",
    "epoch_batch",
    "epoch_batches",
    "epoch_permutation",
    "loader_seed",
    "next_epoch_boundary",
    "num_batches",
    "rank_batch_indices",
    "sample_seed",
    "worker_for_batch",
]

_ORDER_DOMAIN = b"ckptstore.data.order/v1"
_SEED_DOMAIN = "ckptstore.data.sample_seed/v1"
_LOADER_SEED_DOMAIN = "ckptstore.data.loader_seed/v1"
_MASK63 = (1 << 63) - 1


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

    Bucket b is ids ``[b*N//C, (b+1)*N//C)``. Each shuffle draws from its own PCG64 stream
    seeded by a SHA-256 of (fingerprint, seed, epoch, stream name), and sorts the raw 64-bit
    draws with a stable sort, so the order is the same on every platform and numpy version.
    ``shuffle=False`` is the identity order. While a bucket is served, reads stay inside
    N/C consecutive ids: pick C so that one bucket's shards fit in the shard cache.
    """
    check_str("fingerprint", fingerprint)
    seed = check_int("seed", seed, minimum=None)
    epoch = check_int("epoch", epoch)
    n = check_int("num_samples", num_samples, minimum=1)
    buckets = check_int("buckets", buckets, minimum=1)
    total = sum(check_sizes(shard_sizes))
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
    seed = check_int("seed", seed, minimum=None)
    epoch = check_int("epoch", epoch)
    sample_index = check_int("sample_index", sample_index)
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
    seed = check_int("seed", seed, minimum=None)
    return _hash63(_LOADER_SEED_DOMAIN, seed, check_int("epoch", epoch), check_int("rank", rank))
