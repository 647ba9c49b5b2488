"""Handing a worker's batch to the training loop: small tensors travel inline, in the pipe.

torch's DataLoader sends every tensor of a batch from a worker process as shared memory:
the worker moves the tensor's storage into a shared-memory segment, and the loop, unpickling
the batch, asks the worker's resource-sharer thread for the segment's file descriptor over
a Unix socket, once per tensor. That thread needs the worker's GIL, which the worker holds
while it decodes and collates the next batch; so the loop waits, per tensor, for the
worker's next GIL switch (``sys.getswitchinterval()``, 5 ms by default). For a tensor of
up to about 1 MiB copying the bytes through the pipe is cheaper and never waits on the
worker; beyond that the copies (the pickle's, the pipe's, the loop's read) cost more than
the wait (batches of 8 x 256 KiB files on 2 loaded cores: a warm epoch of 512 files took
0.36 s through shared memory, 0.59 s through the pipe; ``benchmarks/peers/air_bench.py``).

:func:`inline` wraps a batch in a worker so that, when torch pickles it onto the worker's
queue, every dense CPU tensor of up to ``INLINE_BYTES`` is written into the pickle itself;
larger ones, and everything that is not a tensor, go as torch sends them. The loop
unpickles the batch itself (no wrapper remains): the same structure, equal tensors (each
contiguous, in fresh process-local memory), so ``pin_memory`` and the user's code see a
normal batch.

The pipe itself holds 64 KiB by default, so a batch of a few hundred KiB crosses in several
writes, each waiting for the loop to read the last one: :func:`widen_result_pipe` lets the
worker's queue write a whole batch while the loop is still in its step (on 2 cores,
``benchmarks/data/handoff.py``: 256 KiB batches wait 0.85 instead of 1.37 ms a batch).

Call order: in a worker, ``queue_item = inline(batch)``; in the loop, once per ``iter()`` of
torch's DataLoader, ``widen_result_pipe(it)``; the batch arrives as it was.
"""

from __future__ import annotations

import fcntl
import io
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

__all__ = ["INLINE_BYTES", "PIPE_BYTES", "Inline", "inline", "widen_result_pipe"]

#: Tensors up to this size are copied through the worker's pipe instead of shared memory
#: (the widened pipe's size: such a batch crosses in one write).
INLINE_BYTES = 1 << 20

#: What the workers' result pipe is widened to: Linux's default limit for an unprivileged
#: process (``/proc/sys/fs/pipe-max-size``).
PIPE_BYTES = 1 << 20


def _rebuild(raw: bytes | bytearray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if not raw:
        return torch.empty(shape, dtype=dtype)
    # A bytearray (what the worker sends) unpickles writable: the tensor takes it as it is
    flat = torch.frombuffer(
        raw if isinstance(raw, bytearray) else bytearray(raw), dtype=torch.uint8
    )
    return flat.view(dtype).view(shape)


def _reduce_tensor(t: torch.Tensor) -> Any:
    """Inline a small dense CPU tensor; anything else as torch's multiprocessing sends it."""
    if (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.requires_grad
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
        and t.nbytes <= INLINE_BYTES
    ):
        flat = t.detach().contiguous().view(-1)
        raw = bytearray(flat.view(torch.uint8).numpy()) if flat.numel() else b""
        return _rebuild, (raw, t.dtype, tuple(t.shape))
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(t)


class _Pickler(ForkingPickler):
    """torch's multiprocessing pickler with small tensors inlined."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch_table = dict(self.dispatch_table)  # an instance's own copy
        self.dispatch_table[torch.Tensor] = _reduce_tensor


def _loads(data: bytes) -> Any:
    return ForkingPickler.loads(data)


class Inline:
    """A batch that pickles with its small tensors inlined; unpickles as the batch itself."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __reduce__(self) -> Any:
        buf = io.BytesIO()
        _Pickler(buf, 5).dump(self.batch)
        return _loads, (buf.getvalue(),)


def inline(batch: Any) -> Inline:
    """``batch`` wrapped for a worker's queue (see the module docstring)."""
    return Inline(batch)


def widen_result_pipe(it: Any, nbytes: int = PIPE_BYTES) -> None:
    """Let the pipe of a torch DataLoader iterator's result queue hold ``nbytes``.

    Best effort: nothing happens without worker processes, off Linux, where torch names
    the queue otherwise (it is not public), or where the kernel refuses the size (its
    per-user pipe limit); batches then cross as before, only in more pieces.
    """
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    reader = getattr(getattr(it, "_worker_result_queue", None), "_reader", None)
    if setsize is None or reader is None:
        return
    try:
        fcntl.fcntl(reader.fileno(), setsize, nbytes)
    except (OSError, ValueError):
        pass
