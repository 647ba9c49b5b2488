"""Staging copies of CPU tensors on the rank's share of the cores.

torchrun sets ``OMP_NUM_THREADS=1`` in every rank when it starts more than one per node,
so a rank's ``copy_`` runs on one core even on a node with many more cores than ranks; a
copy of hundreds of MiB is then bound by what one core moves. torch releases the GIL
inside ``copy_``, so copying disjoint slices from a few threads uses the idle cores.
Written here because torch has no per-call thread count (``torch.set_num_threads`` is
process-wide and would change training's own ops while a save stages). ``split_bytes``
is the pure part: the even split of the bytes over the threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from ckptstore.engine.cores import rank_cores

__all__ = ["MAX_THREADS", "MIN_PARALLEL_BYTES", "HostCopier", "split_bytes"]

#: The most threads one rank copies with (memory bandwidth, not cores, bounds beyond).
MAX_THREADS = 8
#: A state with fewer CPU bytes is copied on the calling thread (the hand-off to the
#: threads costs tens of microseconds; 4 MiB copies in about 0.3-0.6 ms).
MIN_PARALLEL_BYTES = 4 << 20
#: A cut inside a tensor falls on a multiple of this many bytes from its start, a whole
#: number of elements of every dtype.
CUT_ALIGN = 64

#: What one copy lane copies of one tensor: (pair index, first byte, end byte).
Cut = tuple[int, int, int]


def split_bytes(sizes: Sequence[int], lanes: int) -> list[list[Cut]]:
    """Split tensors of ``sizes`` bytes, in order, into at most ``lanes`` runs of about
    equal bytes; a tensor may be cut (at a multiple of ``CUT_ALIGN`` bytes from its
    start). Every byte is in exactly one cut; empty tensors are in none."""
    total = sum(sizes)
    if lanes <= 1 or total == 0:
        return [[(i, 0, s) for i, s in enumerate(sizes) if s]] if total else []
    share = -(-total // lanes)
    out: list[list[Cut]] = [[]]
    room = share
    for i, size in enumerate(sizes):
        start = 0
        while start < size:
            last = len(out) == lanes
            stop = size if last else min(size, start + room)
            if stop < size:
                stop = min(size, -(-stop // CUT_ALIGN) * CUT_ALIGN)
            out[-1].append((i, start, stop))
            room -= stop - start
            start = stop
            if room <= 0 and not last:
                out.append([])
                room = share
    return [lane for lane in out if lane]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)


class HostCopier:
    """Copies CPU tensors into staging buffers on ``threads`` threads.

    Call order::

        copier = HostCopier()       # threads: the rank's cores (its CPU affinity divided
                                    # by LOCAL_WORLD_SIZE), at most 8; 1 when torch's own
                                    # intra-op threads are already as many
        after = copier.mark()       # optional, the thread whose stream wrote the
                                    # sources (training's): where a later copy starts
        copier.copy(pairs, pin, after, behind=False)
                                    # [(dst, src), ...]: returns once every byte is
                                    # copied; a copy's error is raised here. ``behind``:
                                    # training runs meanwhile (a deferred copy), so the
                                    # copy leaves it its core (``behind_threads``)
        copier.close()              # stops the threads (the next copy starts them again)

    CUDA sources into pinned memory (``pin``) are copied non-blocking on the copy engine,
    issued first, while the threads copy the CPU ones; one synchronize at the end. With
    ``after`` (a copy behind training's next step, from another thread) they go on a side
    stream of their own that waits for ``after``'s event only, not for the kernels
    training queued since, and the copy waits for that stream alone.
    """

    def __init__(self, threads: int | None = None) -> None:
        if threads is None:
            threads = min(MAX_THREADS, rank_cores())
            if threads <= torch.get_num_threads():
                threads = 1  # copy_ already runs torch's intra-op threads
        self.threads = max(1, threads)
        #: Threads a copy made while training runs may keep busy: the rank's cores less
        #: the one training runs on (1 rank on 2 cores, the 256 MiB model: one thread
        #: instead of two cut a save at every step from 18.8 to 15.9 % of the step rate).
        self.behind_threads = max(1, min(self.threads, rank_cores() - 1))
        self._pool: ThreadPoolExecutor | None = None
        self._streams: dict[torch.device, Any] = {}

    @staticmethod
    def mark() -> Any:
        """An event recorded on the calling thread's current CUDA stream (None without
        CUDA): ``copy(..., after=)`` reads the sources once it has passed."""
        if not torch.cuda.is_available():
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def copy(
        self,
        pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
        pin: bool = False,
        after: Any = None,
        behind: bool = False,
    ) -> None:
        """``dst.copy_(src)`` for every pair (each ``dst`` a host tensor of the same dtype
        and shape as its ``src``; with ``pin``, pinned); returns when all are done.
        ``after``: an event from ``mark`` (see the class docstring); ``behind``: training
        runs meanwhile, so at most ``behind_threads`` threads copy."""
        threads = self.behind_threads if behind else self.threads
        cuda = [(d, s) for d, s in pairs if s.device.type == "cuda" and pin]
        stream = None  # the side stream, with ``after`` and the sources on one device
        if cuda and after is not None and len({s.device for _, s in cuda}) == 1:
            stream = self._side_stream(cuda[0][1].device)
            stream.wait_event(after)
        if cuda:
            with torch.cuda.stream(stream):  # None: the current stream
                for dst, src in cuda:
                    dst.copy_(src, non_blocking=True)
        flat: list[tuple[torch.Tensor, torch.Tensor]] = []
        for dst, src in pairs:
            if src.device.type == "cuda" and pin:
                continue  # issued above
            if src.device.type != "cpu":
                dst.copy_(src)
            elif threads > 1 and src.is_contiguous() and dst.is_contiguous():
                flat.append((dst, src))
            else:  # one thread, or a strided source that cannot be cut into flat slices
                dst.copy_(src)
        self._copy_flat(flat, threads)
        if stream is not None:
            stream.synchronize()
        elif cuda:
            torch.cuda.synchronize()

    def _side_stream(self, device: torch.device) -> Any:
        """This copier's side stream on ``device`` (made once)."""
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def _copy_flat(self, flat: list[tuple[torch.Tensor, torch.Tensor]], threads: int) -> None:
        sizes = [src.numel() * src.element_size() for _, src in flat]
        if sum(sizes) < MIN_PARALLEL_BYTES:  # too little to split
            for dst, src in flat:
                dst.copy_(src)
            return
        views = [(_bytes(dst), _bytes(src)) for dst, src in flat]

        def run(lane: list[Cut]) -> None:
            for i, start, stop in lane:
                dst, src = views[i]
                dst[start:stop].copy_(src[start:stop])

        lanes = split_bytes(sizes, threads)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="ckpt-copy")
        futures: list[Future[None]] = [self._pool.submit(run, lane) for lane in lanes[1:]]
        try:
            run(lanes[0])
        finally:
            for f in futures:  # every thread is done with the buffers before we return
                f.exception()
        for f in futures:
            f.result()

    def close(self) -> None:
        """Stop the threads (after their current copy)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
