"""DataLoader: torch DataLoader semantics, an exact resumable order, and DCP-Stateful state.

Call order (every rank; the state calls are collective when torch.distributed is up)::

    loader = DataLoader(ds, batch_size=32, num_workers=4)
    ckptstore.load({"data": loader}, url)      # optional: resume (load_state_dict, before iter)
    for batch in loader: ...                   # the rest of the current epoch, then stops
    for batch in loader: ...                   # the next epoch
    ckptstore.save({"data": loader, ...}, url) # state_dict(): every rank must agree on k
    loader.metrics                             # fetch_seconds p50/p99/total, downloads, hits
    loader.close()

How batches are made and seeded (the contract of ``ckptstore.data.order``) is
:class:`DataLoader`'s docstring.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset, default_collate, get_worker_info

from ckptstore.data.dataset import ShardedDataset
from ckptstore.data.handoff import inline, widen_result_pipe
from ckptstore.data.metrics import LoaderMetrics, MetricsSink
from ckptstore.data.order import (
    DataOrderError,
    OrderState,
    agreed_cursor,
    check_resume,
    cursor_after,
    epoch_batch,
    loader_seed,
    next_epoch_boundary,
    num_batches,
)
from ckptstore.data.prefetch import Prefetcher
from ckptstore.errors import ConfigError

__all__ = ["DataLoader"]


def _identity(item: Any) -> Any:
    return item


class _EpochPlan(IterableDataset):
    """One rank's batches of the view ``[k0, end)``; worker w makes batches w, w+W, ..."""

    def __init__(
        self,
        dataset: ShardedDataset,
        k0: int,
        end: int,
        rank: int,
        world_size: int,
        batch_size: int,
        count: int,
        collate_fn: Callable[[list[Any]], Any],
    ) -> None:
        self.dataset = dataset
        self.k0, self.end, self.rank = k0, end, rank
        self.world_size, self.batch_size, self.count = world_size, batch_size, count
        self.collate_fn = collate_fn

    def cursors(self, s: int) -> list[int]:
        """Global cursors of this rank's batch ``s`` (:func:`~ckptstore.data.order.epoch_batch`)."""
        return epoch_batch(self.k0, self.rank, self.world_size, self.batch_size, self.end, s)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        w, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for s in range(w, self.count, workers):
            samples = self.dataset.samples_at(self.cursors(s))
            batch = self.collate_fn(samples) if samples else []
            item = (
                s,
                len(samples),
                batch,
                self.dataset.cache_stats(),
                self.dataset.verified.take_new(),
            )
            # In a worker: small tensors cross in the pipe, not as shared memory (handoff).
            yield inline(item) if info is not None else item


class DataLoader:
    """Batches of a :class:`ShardedDataset` for one rank (the call order: module docstring).

    ``rank`` / ``world_size`` default to torch.distributed's (else 0 / 1). ``num_workers``,
    ``collate_fn`` (default ``default_collate``), ``pin_memory``, ``prefetch_factor``,
    ``timeout``, ``worker_init_fn`` and ``multiprocessing_context`` mean what they mean in
    torch's DataLoader. ``prefetch`` runs a background thread in this process that fetches
    upcoming shards, ``prefetch_concurrency`` at a time (default None: about 32 MiB of
    shards in flight, less on a nearly full cache, 4 to 32 shards;
    :func:`~ckptstore.data.prefetch.prefetch_depth`).
    ``metrics_sink`` receives ``loader.metrics`` every ``log_every`` batches and at each
    epoch's end, on ``sink_ranks``.
    ``allow_seed_change`` / ``allow_dataset_change`` let a resume continue at the saved cursor
    under a new seed / listing (samples may then repeat or be missed).

    How batches are made (the contract of ``ckptstore.data.order``): an ``iter()`` starting at
    cursor k0 serves ``G[k0 : end of k0's epoch]``; ``G[k0 + j]`` goes to rank ``(j // B) % R``,
    that rank's batch ``j // (R*B)``, made by worker ``batch % W``. Underneath is a torch DataLoader
    over an IterableDataset in which worker w yields exactly its batches w, w+W, ... and torch's
    round-robin with ``in_order=True`` hands them back in batch order (checked on arrival); a
    batch's tensors of up to 1 MiB cross from the worker in the pipe, not as shared memory
    (:mod:`ckptstore.data.handoff`: the loop never waits on a busy worker's GIL for them). The
    cursor advances in the main process when a batch is handed to the training loop, so the state is
    one integer plus what fixes the order; a resume on any (R, B, W) restarts exactly there. The
    epoch's last global step may be short: low ranks get full batches, one rank a short one, the
    others an empty list ``[]`` (skip the step, but keep collectives in step).

    Seeds: torch draws the workers' base seed from a generator seeded with
    ``order.loader_seed(seed, epoch, rank)``, never from the global torch RNG, which iterating
    leaves untouched. Worker w seeds ``torch`` / ``random`` / ``numpy.random`` with base + w
    (``get_worker_info().seed``), so a resume mid-epoch gives each worker the seed it had in the
    uninterrupted epoch, whatever happened to the global RNG in between. What a worker draws
    still depends on the samples it made before; augmentation that must be the same after any
    resume uses the ``seed`` that ``transform(sample, seed)`` receives (``order.sample_seed``).
    """

    def __init__(
        self,
        dataset: ShardedDataset,
        batch_size: int = 1,
        num_workers: int = 0,
        *,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        timeout: float = 0.0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        prefetch: bool = True,
        prefetch_concurrency: int | None = None,
        metrics_sink: MetricsSink | None = None,
        log_every: int = 100,
        sink_ranks: Sequence[int] = (0,),
        allow_seed_change: bool = False,
        allow_dataset_change: bool = False,
    ) -> None:
        if not isinstance(dataset, ShardedDataset):
            raise ConfigError(f"DataLoader needs a ShardedDataset, got {type(dataset).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
        self._dist = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if self._dist else 0)
        self.world_size = (
            world_size if world_size is not None else (dist.get_world_size() if self._dist else 1)
        )
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        if self.world_size > dataset.num_samples:
            raise ConfigError(
                f"world_size {self.world_size} is larger than the dataset's "
                f"{dataset.num_samples} samples: some ranks would never get a sample. Use "
                "fewer ranks for this dataset, or a larger dataset"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.collate_fn = collate_fn or default_collate
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.prefetch = prefetch
        self.prefetch_concurrency = prefetch_concurrency
        self.metrics_sink = metrics_sink
        self.log_every = max(1, log_every)
        self.sink_ranks = tuple(sink_ranks)
        self.allow_seed_change = allow_seed_change
        self.allow_dataset_change = allow_dataset_change
        self._cursor = 0
        self._metrics = LoaderMetrics()
        self._prefetcher: Prefetcher | None = None
        self._generation = 0
        self._active: int | None = None  # the generation of the iteration in progress

    # -- position ------------------------------------------------------------------------
    @property
    def cursor(self) -> int:
        """k: the global index of the first sample not yet handed to training."""
        return self._cursor

    @property
    def epoch(self) -> int:
        """The epoch the cursor is in."""
        return self._cursor // self.dataset.num_samples

    def _view(self) -> tuple[int, int, int]:
        k0 = self._cursor
        end = next_epoch_boundary(k0, self.dataset.num_samples)
        return k0, end, num_batches(k0, self.world_size, self.batch_size, end, self.drop_last)

    def __len__(self) -> int:
        """Batches the next ``iter()`` yields (the rest of the current epoch)."""
        return self._view()[2]

    # -- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self._generation += 1
        return self._epoch(self._generation)

    def _epoch(self, generation: int) -> Iterator[Any]:
        k0, end, count = self._view()
        r, b = self.world_size, self.batch_size
        if self.prefetch:
            if self._prefetcher is None:
                self._prefetcher = Prefetcher(self.dataset, self.prefetch_concurrency)
            self._prefetcher.start(k0)
        plan = _EpochPlan(self.dataset, k0, end, self.rank, r, b, count, self.collate_fn)
        # The rank's own checks (its prefetcher's) are known here already: dropped, so the
        # list stays one epoch long and the workers forked next do not ship them back.
        self.dataset.verified.take_new()
        it: Iterator[Any] = iter(()) if not count else iter(self._torch_loader(plan))
        widen_result_pipe(it)  # a batch crosses from its worker in one write (handoff)
        self._active = generation
        try:
            for s in range(count):
                t0 = time.perf_counter()
                try:
                    got, n, batch, counts, verified = next(it)
                except StopIteration:
                    raise DataOrderError(
                        f"internal error: the workers stopped after {s} of {count} batches"
                    ) from None
                waited = time.perf_counter() - t0
                if got != s:
                    raise DataOrderError(
                        f"internal error: batch {got} arrived where batch {s} was due (torch "
                        "DataLoader did not return worker batches round-robin in order)"
                    )
                if generation != self._generation:
                    return  # a newer iter() took over; this one stops without counting
                self._cursor = cursor_after(k0, r, b, s + 1, end_cursor=end)
                self._metrics.record(waited, n, counts)
                self.dataset.verified.adopt(verified)  # the next epoch's workers trust it
                if self._prefetcher is not None:
                    self._prefetcher.advance(self._cursor)
                if (s + 1) % self.log_every == 0:
                    self._report()
                yield batch
            if generation == self._generation:
                self._cursor = max(self._cursor, end)  # drop_last skips the short tail
                self._report()
        finally:
            if self._active == generation:
                self._active = None
            del it  # shuts torch's workers down now, not at garbage collection

    def _torch_loader(self, plan: _EpochPlan) -> TorchDataLoader:
        extra: dict[str, Any] = {}
        if self.num_workers and self.prefetch_factor is not None:
            extra["prefetch_factor"] = self.prefetch_factor
        # torch draws the workers' base seed from this generator, not the global torch RNG:
        # worker seeds follow the data position, and iterating leaves the global RNG alone.
        epoch = plan.k0 // self.dataset.num_samples
        generator = torch.Generator().manual_seed(loader_seed(self.dataset.seed, epoch, self.rank))
        return TorchDataLoader(
            plan,
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_identity,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            worker_init_fn=self.worker_init_fn,
            multiprocessing_context=self.multiprocessing_context if self.num_workers else None,
            generator=generator,
            in_order=True,
            **extra,
        )

    # -- metrics -------------------------------------------------------------------------
    @property
    def metrics(self) -> LoaderMetrics:
        """This rank's fetch times and cache counters (prefetcher and workers together)."""
        if self._prefetcher is not None:
            self._metrics.set_prefetch(self._prefetcher.stats)
        return self._metrics

    def _report(self) -> None:
        if self.metrics_sink is None or self.rank not in self.sink_ranks:
            return
        if not self._metrics.window_batches:
            return  # nothing new since the last report
        self.metrics_sink.log(self.metrics.window_summary(), self._cursor)

    # -- DCP Stateful --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{cursor, seed, buckets, fingerprint, shuffle, ...}`` (a few hundred bytes).

        With torch.distributed initialised this is collective: it gathers every rank's
        cursor and raises ``DataOrderError`` unless all agree.
        """
        k = self._cursor
        if self._dist and dist.is_initialized() and dist.get_world_size() == self.world_size > 1:
            cursors: list[Any] = [None] * self.world_size
            dist.all_gather_object(cursors, k)
            k = agreed_cursor(cursors)
        state = self.dataset.order.state(k).to_dict()
        state["num_samples"] = self.dataset.num_samples
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the saved cursor; refuses a different seed, dataset, C or shuffle.

        Call before iterating. A dataset built without an explicit ``buckets`` adopts the
        saved C. The error names every difference and the option that overrides it.
        """
        if self._active is not None:
            raise DataOrderError("load_state_dict() called while iterating; call it before iter()")
        saved = OrderState.from_dict({k: _plain(v) for k, v in state.items()})
        ds = self.dataset
        if saved.buckets != ds.buckets and not ds.buckets_explicit:
            ds.set_buckets(saved.buckets)
            if self._prefetcher is not None:  # it holds an order with the old C
                self._prefetcher.stop()
                self._prefetcher = None
        resumed = check_resume(
            saved,
            ds.order.state(0),
            allow_seed_change=self.allow_seed_change,
            allow_dataset_change=self.allow_dataset_change,
        )
        self._cursor = resumed.cursor
        if self._prefetcher is not None:
            self._prefetcher.advance(self._cursor)

    def close(self) -> None:
        """Stop the prefetcher and release this process's cache pins and clients."""
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None
        self.dataset.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(value: Any) -> Any:
    """A DCP-loaded scalar back as a Python value (0-d tensors become numbers)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value
