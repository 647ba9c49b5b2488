"""The contenders of the step-rate benchmark, as a registry: name -> a class with four calls.

    c = CONTENDERS[name](job)      # job: the rank's Job (model, optimizer, AppState, dirs, pg)
    c.save(step)                   # at a checkpoint step, after the optimizer's step
    with c.guard(): optim.step()   # what must wait for the staging copy before the update
    c.wait(); c.close()            # durable (untimed, between segments); release

Each contender is used the way its documentation says a training loop should: the stock
async savers wait for the previous save before the next, and for their staging before the
optimizer changes the tensors (``staging_completion`` for ``dcp.async_save``,
``manager.lock()`` for torch_checkpointing). The other writers overwrite three slots
(``slot<step mod 3>``; torch_checkpointing's newest three directories), as ckptstore's
``KeepLast(3)`` keeps three, so that the disk holds at most three checkpoints.
``skip_reason(name)`` says why a contender cannot run here (an optional module missing, an
option this checkout lacks), or None.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import fsync_path

__all__ = ["CONTENDERS", "Contender", "Job", "skip_reason"]


@dataclass
class Job:
    """What a contender saves and where: one rank's training state."""

    rank: int
    world: int
    root: str  # this contender's directory, shared by the ranks
    model: torch.nn.Module  # the DDP-wrapped model
    optim: torch.optim.Optimizer
    pg: Any  # a gloo group of its own: a save's collectives never meet DDP's
    device: str = "cpu"  # where the state lives: "cpu" or "cuda"

    def app(self) -> Any:
        from ckptstore import AppState

        return AppState(self.model, self.optim)

    def slot(self, step: int) -> str:
        return os.path.join(self.root, f"slot{step % 3}")


class Contender:
    """No checkpoint: the baseline (and what every call does by default)."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def save(self, step: int) -> None:
        pass

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def wait(self) -> None:
        pass

    def close(self) -> None:
        self.wait()


class CopyFloor(Contender):
    """No checkpoint, only its least work: a thread ``copy_``s every tensor of the model and
    optimizer into buffers kept across saves (what any asynchronous save must do at least
    once), and the optimizer's step waits for it. Nothing is written."""

    def __init__(self, job: Job) -> None:
        super().__init__(job)
        self.buffers: dict[int, torch.Tensor] = {}
        self.thread: threading.Thread | None = None

    def _tensors(self) -> list[torch.Tensor]:
        found = list(self.job.model.state_dict().values())
        for state in self.job.optim.state.values():
            found += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return found

    def _copy(self, tensors: list[torch.Tensor]) -> None:
        for n, t in enumerate(tensors):
            buf = self.buffers.get(n)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = self.buffers[n] = torch.empty_like(t, device="cpu")
            buf.copy_(t)

    def save(self, step: int) -> None:
        self.wait()
        self.thread = threading.Thread(target=self._copy, args=(self._tensors(),))
        self.thread.start()

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        self.wait()
        return contextlib.nullcontext()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


class Ckptstore(Contender):
    """ckptstore's ``CheckpointManager`` saving ``{"app": AppState(model, optim)}``."""

    keywords: dict[str, Any] = {}

    def __init__(self, job: Job) -> None:
        from ckptstore import CheckpointManager

        super().__init__(job)
        self.state = {"app": job.app()}
        self.mgr = CheckpointManager(job.root, strict=True, **self.keywords)

    def save(self, step: int) -> None:
        self.mgr.save(step, self.state)

    def wait(self) -> None:
        self.mgr.wait()

    def close(self) -> None:
        self.mgr.close()


class CkptstoreThread(Ckptstore):
    keywords = {"background": "thread"}


class CkptstoreProcess(Ckptstore):
    keywords = {"background": "process"}


class CkptstoreNoDefer(Ckptstore):
    keywords = {"defer_staging": False}


class DcpAsync(Contender):
    """``dcp.async_save`` + ``DefaultStager`` (asynchronous staging on CPU), plan caching on."""

    process = False

    def __init__(self, job: Job) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        super().__init__(job)
        # Pinned memory and non-blocking copies need an accelerator; shared memory is what
        # hands the staged tensors to the checkpoint process without a copy.
        accel = job.device != "cpu"
        self.stager = DefaultStager(StagingOptions(accel, self.process, True, accel))
        self.resp: Any = None

    def writer(self, path: str) -> Any:
        import torch.distributed.checkpoint as dcp

        return dcp.FileSystemWriter(path)

    def save(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.wait()  # one save at a time
        kind = AsyncCheckpointerType.PROCESS if self.process else AsyncCheckpointerType.THREAD
        self.resp = dcp.async_save(
            {"app": self.job.app()},
            storage_writer=self.writer(self.job.slot(step)),
            planner=DefaultSavePlanner(enable_plan_caching=True),
            process_group=self.job.pg,
            async_checkpointer_type=kind,
            async_stager=self.stager,
        )

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        staging = getattr(self.resp, "staging_completion", None)
        if staging is not None:
            staging.result()
        return contextlib.nullcontext()

    def wait(self) -> None:
        if self.resp is not None:
            (getattr(self.resp, "upload_completion", None) or self.resp).result()
            self.resp = None

    def close(self) -> None:
        self.wait()
        self.stager.close()


class DcpAsyncProcess(DcpAsync):
    process = True


class Air(DcpAsync):
    """The seed's writer (``benchmarks.peers.air``) under ``dcp.async_save`` + DefaultStager."""

    def writer(self, path: str) -> Any:
        from benchmarks.peers.air import air_writer  # type: ignore[import-not-found]

        return air_writer(path)


class DcpSave(Contender):
    """Blocking ``dcp.save`` (plan caching on)."""

    def save(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        dcp.save(
            {"app": self.job.app()},
            storage_writer=dcp.FileSystemWriter(self.job.slot(step)),
            planner=DefaultSavePlanner(enable_plan_caching=True),
            process_group=self.job.pg,
        )


class TorchSave(Contender):
    """Rank 0 ``torch.save``s model + optimizer (+ fsync); the others wait at a barrier.

    DDP replicates the state, so rank 0 already holds all of it: the gather a sharded
    state would need is nothing here."""

    def save(self, step: int) -> None:
        job = self.job
        if job.rank == 0:
            os.makedirs(job.root, exist_ok=True)
            path = os.path.join(job.root, f"slot{step % 3}.pt")
            torch.save({"model": job.model.state_dict(), "optim": job.optim.state_dict()}, path)
            fsync_path(path)
            fsync_path(job.root)
        dist.barrier(job.pg)


class TorchCheckpointing(Contender):
    """torch_checkpointing's ``CheckpointManager`` (its async saver process, local files),
    with ``manager.lock()`` around the optimizer's step, as its documentation says."""

    def __init__(self, job: Job) -> None:
        from torch_checkpointing.checkpoint_manager import CheckpointManager
        from torch_checkpointing.config import AsyncCheckpointSaverConfig
        from torch_checkpointing.staging import CheckpointStagerConfig
        from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig

        super().__init__(job)
        accel = job.device != "cpu"  # pinned, non-blocking copies need an accelerator
        staging = CheckpointStagerConfig(use_pinned_memory=accel, use_non_blocking_copy=accel)
        save = AsyncCheckpointSaverConfig(staging_config=staging)
        # Its default O_DIRECT fails with EINVAL at close on this machine's disk.
        storage = LocalFileSystemStorageConfig(use_direct_io=False)
        self.mgr = CheckpointManager.Config(save=save, storage_config=storage).build()
        self.future: Any = None
        self.saved: list[str] = []

    def save(self, step: int) -> None:
        self.wait()
        job = self.job
        if job.rank == 0:  # it renames a new directory into place: keep the newest three
            for old in self.saved[:-3]:
                shutil.rmtree(old, ignore_errors=True)
            del self.saved[:-3]
        path = os.path.join(job.root, f"step{step}")
        self.saved.append(path)
        state = {"model": job.model.state_dict(), "optim": job.optim.state_dict()}
        self.future = self.mgr.save(path, state)

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        return self.mgr.lock()

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None

    def close(self) -> None:
        self.wait()
        self.mgr.close()


#: name -> contender; "none" is the baseline every run also measures.
CONTENDERS: dict[str, Callable[[Job], Contender]] = {
    "none": Contender,
    "copy_ floor": CopyFloor,
    "ckptstore": Ckptstore,
    "ckptstore-thread": CkptstoreThread,
    "ckptstore-process": CkptstoreProcess,
    "ckptstore-no-defer": CkptstoreNoDefer,
    "dcp.async_save + DefaultStager": DcpAsync,
    "dcp.async_save + DefaultStager (process)": DcpAsyncProcess,
    "dcp.save (blocking)": DcpSave,
    "rank-0 torch.save": TorchSave,
    "torch_checkpointing": TorchCheckpointing,
    "air": Air,
}


def skip_reason(name: str) -> str | None:
    """Why ``name`` cannot run in this checkout and venv, or None."""
    import importlib.util

    if name == "ckptstore-no-defer":
        from ckptstore import ManagerOptions

        if "defer_staging" not in {f.name for f in dataclasses.fields(ManagerOptions)}:
            return "ManagerOptions has no defer_staging in this checkout"
    needs = {
        "air": ("benchmarks.peers.air", "databricks.air"),
        "torch_checkpointing": ("torch_checkpointing",),
    }
    for module in needs.get(name, ()):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            return f"{module} is not installed / not in this checkout"
    return None
