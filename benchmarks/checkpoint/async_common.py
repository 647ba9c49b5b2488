"""What the async-save benchmarks share: the state, the timing, stock DCP's async save.

``make_state`` is a rank's state of ``tensors`` float32 tensors; ``timed_max`` times a call on
every rank after a barrier and returns the max over ranks; ``stock_async_save`` /
``stock_wait`` are ``dcp.async_save`` into a ``FileSystemWriter``, split where training may
go on (staging done) and where the checkpoint is durable.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import markdown_table

__all__ = [
    "STAGER",
    "TENSORS_PER_RANK",
    "fresh_dir",
    "make_state",
    "markdown",
    "stock_async_save",
    "stock_wait",
    "timed_max",
]

TENSORS_PER_RANK = 8
#: The reference "until committed" is measured against (issue: <= 1.0x, <= 1.2x staged).
STAGER = "dcp.async_save + DefaultStager"


def make_state(
    rank: int, mib_per_rank: int, tensors: int = TENSORS_PER_RANK
) -> dict[str, torch.Tensor]:
    numel = mib_per_rank * 1024 * 1024 // 4 // tensors
    g = torch.Generator().manual_seed(rank)
    return {f"r{rank}.t{i}": torch.randn(numel, generator=g) for i in range(tensors)}


def fresh_dir(parent: str, name: str, rank: int) -> str:
    """``parent/name``, emptied and made by rank 0, once every rank may use it."""
    path = os.path.join(parent, name)
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
    dist.barrier()
    return path


def timed_max(fn: Any) -> float:
    dist.barrier()
    t = time.perf_counter()
    fn()
    dt = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt.item())


def stock_async_save(state: dict, path: str, pg: Any, stager: Any) -> Any:
    """``dcp.async_save`` into a ``FileSystemWriter`` at ``path``; returns its future once
    staging is done (what training waits for). ``stock_wait`` waits for the rest."""
    import torch.distributed.checkpoint as dcp

    fut = dcp.async_save(
        state, storage_writer=dcp.FileSystemWriter(path), process_group=pg, async_stager=stager
    )
    staging = getattr(fut, "staging_completion", None)
    if staging is not None:
        staging.result()
    return fut


def stock_wait(fut: Any) -> None:
    """Wait until a ``stock_async_save`` is durable (its upload future, else the future)."""
    (getattr(fut, "upload_completion", None) or fut).result()


def markdown(header: str, rows: list[list[str]]) -> str:
    """A markdown table: ``header`` is the column names joined by "|"."""
    names = header.split("|")
    return markdown_table(names, "l" * len(names), rows)
