"""Which Lightning strategies ``CkptStoreIO`` serves, and how every rank takes part.

Lightning's ``Strategy.save_checkpoint`` calls its ``CheckpointIO`` on global rank 0 only,
while a ckptstore save is a collective: every rank writes its share of one DCP save (DDP's
replicated model and optimizer state is deduplicated across ranks, so ranks share the
writes) and the step commits once, after all of them are durable. Lightning builds the
checkpoint dict on every rank (``Trainer.save_checkpoint`` is called on every rank), so
the only missing piece is the rank-0 gate.

Lightning introduces a ``CheckpointIO`` to its strategy in one place, on every rank, while
the ``Trainer`` is built: ``strategy.checkpoint_io = io``. ``install`` wraps that property
setter (once per process; every other ``CheckpointIO`` passes through untouched) so that a
``CkptStoreIO`` is told its strategy at once. ``attach`` then

- refuses, with a ``ConfigError`` naming what to use instead, a strategy whose checkpoints
  bypass ``CheckpointIO`` (FSDP, ModelParallel, DeepSpeed, XLA: they override
  ``save_checkpoint``) or that runs ranks in spawned / forked children (``ddp_spawn``,
  ``ddp_notebook``: Lightning ships rank 0's results back through ``CheckpointIO``);
- for the other parallel strategies (``DDPStrategy`` under Lightning's own launcher or
  ``torchrun``), replaces *that instance's* ``save_checkpoint`` with one that broadcasts
  rank 0's file name and calls the IO on every rank.

Call order (Lightning drives it)::

    install(CkptStoreIO)            # at import of ckptstore_lightning
    Trainer(..., plugins=[io])      # every rank: strategy.checkpoint_io = io -> attach
    trainer.save_checkpoint(path)   # every rank: io.save_checkpoint(ckpt, rank 0's path),
                                    # which calls check_ranks(strategy) first: several
                                    # processes without attach -> ConfigError
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from lightning.pytorch.strategies import ParallelStrategy, Strategy

from ckptstore.errors import ConfigError

from ._packing import TENSOR_PREFIX

__all__ = ["REPLICATED", "install", "attach", "is_served_on_every_rank", "check_ranks"]

#: What every rank saves under DDP (identical on every rank); rank 0 saves all the rest.
REPLICATED = (TENSOR_PREFIX + "state_dict/", TENSOR_PREFIX + "optimizer_states/")

_MARK = "_ckptstore_attach"
_ALTERNATIVE = (
    "use strategy='ddp' (Lightning's launcher or torchrun) with CkptStoreIO, or save this "
    "strategy's own checkpoints with ckptstore.CheckpointManager from a Callback on every rank"
)


def install(io_type: type) -> None:
    """Wrap ``Strategy.checkpoint_io``'s setter to call ``attach`` for ``io_type`` (idempotent)."""
    prop = Strategy.__dict__.get("checkpoint_io")
    if not isinstance(prop, property) or prop.fset is None:
        raise ConfigError(
            "this lightning has no settable Strategy.checkpoint_io property, which CkptStoreIO "
            "needs to reach every rank; run: pip install 'lightning>=2.2,<3'"
        )
    if getattr(prop.fset, _MARK, False):
        return
    base_set = prop.fset

    def set_checkpoint_io(self: Strategy, io: Any) -> None:
        base_set(self, io)
        if isinstance(io, io_type):
            attach(self, io)

    setattr(set_checkpoint_io, _MARK, True)
    Strategy.checkpoint_io = property(prop.fget, set_checkpoint_io, prop.fdel, prop.__doc__)  # type: ignore[method-assign,assignment]


def attach(strategy: Strategy, io: Any) -> None:
    """Check that ``io`` can serve ``strategy`` and make every rank call it on save."""
    name = type(strategy).__name__
    if type(strategy).save_checkpoint is not Strategy.save_checkpoint:
        raise ConfigError(
            f"CkptStoreIO cannot serve {name}: it writes its own checkpoints and never calls "
            f"a CheckpointIO, so nothing would reach ckptstore; {_ALTERNATIVE}"
        )
    start = getattr(strategy, "_start_method", "popen")
    if start != "popen":
        raise ConfigError(
            f"CkptStoreIO cannot serve {name} with start_method={start!r} (ddp_spawn, "
            "ddp_fork, ddp_notebook): Lightning hands rank 0's results back to the main "
            "process through the CheckpointIO; use strategy='ddp' under Lightning's own "
            "launcher or torchrun"
        )
    io._strategy = strategy
    if not isinstance(strategy, ParallelStrategy) or is_served_on_every_rank(strategy):
        return

    def save_checkpoint(
        checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        # One name on every rank: ModelCheckpoint formats it per rank from metrics that
        # need not agree; rank 0's is the one Lightning would write.
        filepath = strategy.broadcast(filepath, src=0)
        strategy.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options)

    setattr(save_checkpoint, _MARK, True)
    strategy.save_checkpoint = save_checkpoint  # type: ignore[method-assign,assignment]


def is_served_on_every_rank(strategy: Strategy | None) -> bool:
    """Whether ``strategy.save_checkpoint`` calls the IO on every rank (``attach`` did it)."""
    return strategy is not None and getattr(strategy.__dict__.get("save_checkpoint"), _MARK, False)


def check_ranks(strategy: Strategy | None) -> tuple[int, int]:
    """(rank, world size); raise if several processes run but only rank 0 calls the IO."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    rank, world = dist.get_rank(), dist.get_world_size()
    if world > 1 and not is_served_on_every_rank(strategy):
        raise ConfigError(
            f"CkptStoreIO is one of {world} processes, but its strategy "
            f"({type(strategy).__name__ if strategy else 'not a Lightning Trainer'}) calls it "
            "on rank 0 only, and a ckptstore save needs every rank; use Trainer(strategy="
            "'ddp', plugins=[CkptStoreIO(...)]) under Lightning's launcher or torchrun, or "
            "ckptstore.CheckpointManager on every rank"
        )
    return rank, world
