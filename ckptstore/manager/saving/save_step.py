"""``save_step``: serialise, write (or stage locally and upload) and commit one step.

The one save path of ``CheckpointManager``: its thread backend calls it on a thread of
the training process, its process backend in each writer process (``writer_main``);
both with the state already staged. It builds the DCP writer (``CkptWriter``, or
``TierWriter`` with a local tier) with the schedule the save needs (``schedule``),
runs ``dcp.save`` over ``process_group`` and turns DCP's ``CheckpointException`` into
the first rank's ckptstore error. It returns the problems the commit met after its
marker was written (each also logged): the step is committed all the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from ckptstore.dcp import save_load as dcp  # dcp.save, quiet without a process group
from ckptstore.dcp.schedule import WriteSchedule
from ckptstore.dcp.writer import CkptWriter
from ckptstore.engine.commit import collect_warnings
from ckptstore.engine.names import step_name
from ckptstore.engine.retry import retrying
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import CkptStoreError
from ckptstore.manager.options import SaveOptions
from ckptstore.manager.saving.write_order import InRounds, LiveFirst, Refusing, Rounds
from ckptstore.tier.rules import LOCAL_ONLY
from ckptstore.tier.tier_writer import TierWriter

__all__ = ["CachedPlanner", "save_step"]


class CachedPlanner(DefaultSavePlanner):
    """DCP's default planner with its plan caching on (``enable_plan_caching``): while the
    state's layout stays the same, the ranks exchange empty plans instead of pickling
    every item's plan to the coordinator and back at each save (profiled: a sixth of a
    1-rank save of the demo's 228 items).

    DCP keeps one cache per process and key (the planner's class name by default) and
    trusts it whenever this rank's local plan is unchanged: the cached global plan says
    which rank writes which replicated item, and the cached final plans carry the shard
    prefixes. So the key names what those depend on beyond the local plan, the process
    group and the writer's ``key_layout``: neither a user's own planner nor a manager
    with another group or layout gets these plans."""

    def __init__(self, key_layout: str, process_group: Any) -> None:
        super().__init__(enable_plan_caching=True)
        group = "local"
        pg = process_group or (
            dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
        )
        if pg is not None:
            group = f"{pg.group_name}:{dist.get_rank(pg)}/{dist.get_world_size(pg)}"
        self._cached_plans_key = f"{type(self).__name__}/{key_layout}/{group}"


def save_step(
    state: dict[str, Any],
    root: Store,
    step: int,
    options: SaveOptions,
    *,
    engine: TransferEngine,
    timings: dict[str, float],
    process_group: Any = None,
    overwrite: bool = False,
    local: bool = False,
    is_live: Callable[[torch.Tensor], bool] | None = None,
    release: Callable[[], float] | None = None,
    rounds: Rounds | None = None,
    refusal: BaseException | None = None,
) -> list[str]:
    """Save ``state`` (already staged: nobody changes it meanwhile) as ``step`` of ``root``
    on every rank of ``process_group``; the post-commit warnings.

    ``options`` say how (the writer's options, run id, and the local tier: ``options.tier``,
    ``LocalTier.spec``, which becomes a ``TierWriter`` here);
    ``overwrite`` replaces a committed ``step`` (one found damaged) atomically; ``local``
    saves ``step`` to the local tier alone: each rank writes its files into its own node's
    tier copy, ``local_tier_dir/<job>/<step>/`` (``tier.jobs``: a job directory that is not
    provably this job's refuses the save on every rank), the coordinator commits there
    (its manifest says ``LOCAL_ONLY``; a step saved again replaces it) and the root is not
    touched. The
    schedule: with ``is_live`` (part of ``state`` is training's own memory, not a copy)
    ``LiveFirst``, calling ``release`` once those tensors are durable; with ``rounds`` (a
    state staged in shared memory one round at a time) ``InRounds``; with ``refusal``
    (this rank could not get its state ready) ``Refusing``, which fails the save on every
    rank at once in DCP's planning step. ``timings`` go into the manifest
    (``extra["timings"]``), the run id into ``extra["run"]`` and the step lease.
    Raises the first rank's ckptstore error; nothing is committed then.
    """
    url: Store = retrying(root, engine.config.retry, engine.stats).child(step_name(step))
    if local:
        assert options.tier is not None, "a local-only save needs a local tier"
        try:  # this job's directory of the tier, its stamp checked (made if absent)
            job_dir = options.tier.open(create=True)
        except (OSError, CkptStoreError) as exc:  # refused on every rank, in DCP's planning
            refusal = refusal or exc
        else:
            assert job_dir is not None
            url, overwrite = job_dir.child(step_name(step)), True
    manifest_timings = dict(timings)
    schedule: WriteSchedule | None = None
    if refusal is not None:
        state, schedule = {}, Refusing(refusal)
    elif is_live is not None:
        assert release is not None, "is_live needs release"
        schedule = LiveFirst(is_live, release, manifest_timings)
    elif rounds is not None:
        schedule = InRounds(rounds, manifest_timings)
    common: dict[str, Any] = dict(
        options=options.writer,  # its transfer settings are the engine's
        step=step,
        engine=engine,
        overwrite=overwrite,
        schedule=schedule,
    )
    writer = (
        CkptWriter(url, check_files=False, **common)  # the coordinator's node's files
        if local
        # the manager trims every node's local tier itself (``save_flow``)
        else TierWriter(url, tier=options.tier, keep_local=None, **common)
        if options.tier is not None
        else CkptWriter(url, **common)
    )
    if local:
        writer.manifest_extra["tier"] = LOCAL_ONLY
    writer.manifest_extra["timings"] = manifest_timings
    if options.run_id:
        writer.manifest_extra["run"] = options.run_id
    with collect_warnings() as notes:
        try:
            dcp.save(
                state,
                storage_writer=writer,
                process_group=process_group,
                planner=CachedPlanner(options.writer.key_layout, process_group),
            )
        except CheckpointException as exc:
            raise dcp.unwrap_checkpoint_exception(exc) from exc
        finally:
            writer.release_lease()  # a save that failed before its commit holds it still
    return notes
