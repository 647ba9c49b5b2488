"""``save_step``: serialise, write (or stage locally and upload) and commit one step.

The one save path of ``CheckpointManager``: its thread backend calls it on a thread of
the training process, its process backend in each writer process
(``ckptstore.manager.saving.writer_main``); both with the state already staged. Under it::

    save_step(state, root, step, ...)
      CkptWriter / StagedWriter(root/step_<n>)     the DCP StorageWriter (dcp/writer.py,
                                                   dcp/staged.py), its manifest's extra
                                                   holding the save's timings
      dcp.save(state, storage_writer, group)       DCP's plan / write_data / finish on
                                                   every rank of ``process_group``
      -> CheckpointException unwrapped into the first rank's ckptstore error

It returns the problems the commit met after its marker was written (each also logged):
the step is committed all the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from ckptstore.dcp import calls as dcp  # dcp.save, quiet without a process group
from ckptstore.dcp.staged import StagedWriter
from ckptstore.dcp.writer import CkptWriter
from ckptstore.engine.commit import collect_warnings
from ckptstore.engine.layout import step_name
from ckptstore.engine.retry import retrying
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.manager.saving.live_first import live_first_writer
from ckptstore.manager.saving.piecewise import Pieces, piecewise_writer

__all__ = ["save_step"]


def save_step(
    state: dict[str, Any],
    root: Store,
    step: int,
    *,
    local_tier_dir: str | None,
    codec: str,
    key_layout: str = "flat",
    engine: TransferEngine,
    timings: dict[str, float],
    process_group: Any = None,
    overwrite: bool = False,
    is_live: Callable[[torch.Tensor], bool] | None = None,
    release: Callable[[], float] | None = None,
    pieces: Pieces | None = None,
    refusal: BaseException | None = None,
    run_id: str | None = None,
) -> list[str]:
    """Save ``state`` (already staged: nobody changes it meanwhile) as ``step`` of ``root``
    on every rank of ``process_group``; the post-commit warnings.

    ``local_tier_dir`` stages the shards on local disk first (``StagedWriter``); ``overwrite``
    replaces a committed ``step`` (one found damaged) atomically. With ``is_live`` (part
    of ``state`` is training's own memory, not a copy: a staging budget was exceeded) the
    live tensors are written first and ``release`` is called once they are durable
    (``ckptstore.manager.saving.live_first``). With ``pieces`` (a writer process's state staged
    in shared memory one piece at a time: a staging budget) the files are written piece
    by piece, each fetched first (``ckptstore.manager.saving.piecewise``). ``refusal``: this
    rank could not get its state ready (a writer process that cannot rebuild it); it is
    raised inside DCP's planning step, which every rank enters, so that every rank fails
    with it at once instead of the others waiting for this one in DCP's collectives.
    ``run_id``: the manager's run identity, recorded in the manifest (``extra["run"]``)
    and in the save's step lease.
    Raises the first rank's ckptstore error; nothing is committed then.
    """
    url = retrying(root, engine.config.retry, engine.stats).child(step_name(step))
    common: dict[str, Any] = dict(
        codec=codec,
        key_layout=key_layout,
        step=step,
        engine=engine,
        config=engine.config,
        overwrite=overwrite,
    )
    if local_tier_dir:
        common["local_tier_dir"] = local_tier_dir
    writer: CkptWriter
    if refusal is not None:
        state, writer = {}, _Refusing(url, refusal, **common)
    elif is_live is not None:
        assert release is not None, "is_live needs release"
        writer = live_first_writer(
            bool(local_tier_dir), url, is_live=is_live, release=release, **common
        )
    elif pieces is not None:
        writer = piecewise_writer(bool(local_tier_dir), url, pieces=pieces, **common)
    else:
        writer = StagedWriter(url, **common) if local_tier_dir else CkptWriter(url, **common)
    writer.manifest_extra["timings"] = dict(timings)
    if run_id:
        writer.manifest_extra["run"] = run_id
    with collect_warnings() as notes:
        try:
            dcp.save(state, storage_writer=writer, process_group=process_group)
        except CheckpointException as exc:
            raise dcp.unwrap_checkpoint_exception(exc) from exc
        finally:
            writer.release_lease()  # a save that failed before its commit holds it still
    return notes


class _Refusing(CkptWriter):
    """A writer whose rank cannot take part: raises ``refusal`` in DCP's planning step
    (each rank's errors there reach every rank) before anything is written."""

    def __init__(self, url: Store, refusal: BaseException, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.refusal = refusal

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Raise the refusal."""
        raise self.refusal
