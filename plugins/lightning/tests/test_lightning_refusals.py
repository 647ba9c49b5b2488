"""What the Lightning plugin refuses, and how: strategies, versions, a root another job
writes to, a rank-0-only call among several processes."""

from __future__ import annotations

import threading
import time

import pytest
import torch

pytest.importorskip("lightning")

from lightning import Trainer  # noqa: E402
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy  # noqa: E402

from ckptstore import CheckpointManager, KeepAll, WriterOptions  # noqa: E402
from ckptstore.errors import CommitConflictError, ConfigError, check_version  # noqa: E402
from ckptstore.stores.local import LocalStore  # noqa: E402
from ckptstore.testing.faults import Fault, FaultyStore  # noqa: E402
from ckptstore_lightning import CkptStoreIO, _versions  # noqa: E402
from tests.plugins.util import committed, free_port  # noqa: E402

_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="Lightning's FSDP needs CUDA"),
]


@pytest.mark.parametrize(
    "accelerator, strategy",
    [
        pytest.param(
            "gpu", lambda: FSDPStrategy(state_dict_type="sharded"), id="fsdp-sharded", marks=_GPU
        ),
        pytest.param(
            "gpu", lambda: FSDPStrategy(state_dict_type="full"), id="fsdp-full", marks=_GPU
        ),
        pytest.param("cpu", ModelParallelStrategy, id="model-parallel"),
    ],
)
def test_a_strategy_that_bypasses_checkpoint_io_is_refused_when_the_trainer_is_built(
    tmp_path, accelerator, strategy
) -> None:
    """Their save_checkpoint never calls a CheckpointIO (a silent save elsewhere): refused."""
    io = CkptStoreIO(str(tmp_path))
    with pytest.raises(ConfigError, match=r"cannot serve \w+Strategy.*strategy='ddp'"):
        Trainer(accelerator=accelerator, devices=1, strategy=strategy(), plugins=[io])


def test_spawned_ranks_are_refused_naming_the_launchers_that_work(tmp_path) -> None:
    with pytest.raises(ConfigError, match="start_method='spawn'.*strategy='ddp'.*torchrun"):
        Trainer(
            accelerator="cpu",
            devices=2,
            strategy="ddp_spawn",
            plugins=[CkptStoreIO(str(tmp_path))],
            logger=False,
        )


def test_ddp_and_single_device_are_accepted_and_other_checkpoint_ios_untouched(tmp_path):
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    io = CkptStoreIO(str(tmp_path))
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", plugins=[io], logger=False)
    assert io._strategy is trainer.strategy
    assert "save_checkpoint" in vars(trainer.strategy)  # this instance saves on every rank
    plain = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", plugins=[TorchCheckpointIO()], logger=False
    )
    assert "save_checkpoint" not in vars(plain.strategy)  # Lightning's own behaviour


@pytest.mark.parametrize("version", ["2.1.4", "3.0.0", "not-a-version"])
def test_a_lightning_version_outside_the_range_names_the_range(version) -> None:
    spec = _versions.SUPPORTED["lightning"]
    with pytest.raises(ConfigError) as info:
        check_version("lightning", version, spec, _versions.EXTRA)
    msg = str(info.value)
    assert f"lightning{spec}" in msg and version in msg and "ckptstore[lightning]" in msg


def test_the_installed_lightning_is_in_range() -> None:
    from ckptstore.errors import require_version

    require_version("lightning", _versions.SUPPORTED["lightning"], _versions.EXTRA)  # or raises


def _checkpoint(step: int, value: float) -> dict:
    return {"global_step": step, "state_dict": {"w": torch.full((64, 64), value)}}


def test_a_root_another_job_commits_to_first_fails_this_save_and_tears_nothing(tmp_path):
    """Jobs A and B save step 2 under one root at once; A's marker lands first."""
    root, names = str(tmp_path / "root"), tmp_path / "names"
    job_b = CkptStoreIO(root, background="thread")
    # B's commit marker is held back for a moment, so A commits in between (the race).
    slow_marker = FaultyStore(LocalStore(root), [Fault("put_if_absent", delay=1.5)])
    job_b._managers[root] = CheckpointManager(slow_marker, keep=KeepAll(), background="thread")
    job_b.save_checkpoint(_checkpoint(2, 2.0), names / "b.ckpt")  # in the background

    def job_a() -> None:
        time.sleep(0.5)  # B is writing
        io = CkptStoreIO(root, async_save=False)
        io.save_checkpoint(_checkpoint(2, 1.0), names / "a.ckpt")
        io.teardown()

    thread = threading.Thread(target=job_a)
    thread.start()
    thread.join()
    with pytest.raises(CommitConflictError):
        job_b.wait()  # B's first save failed: raised, not a warning (nothing of B is saved)
    job_b.teardown()  # raised once, by wait()
    assert committed(root) == [2]
    assert sorted(p.name for p in names.iterdir()) == ["a.ckpt"]
    # A's step is whole and A's: B's files are gone, nothing of B's is read.
    loaded = CkptStoreIO(root, background="thread").load_checkpoint(names / "a.ckpt")
    assert torch.equal(loaded["state_dict"]["w"], torch.full((64, 64), 1.0))


def test_lightning_io_passes_key_layout_and_background_to_its_manager(tmp_path) -> None:
    io = CkptStoreIO(str(tmp_path), writer=WriterOptions(key_layout="spread"), background="thread")
    mgr = io.manager()
    assert (mgr.options.writer.key_layout, mgr.options.background) == ("spread", "thread")
    io.teardown()
    with pytest.raises(ConfigError, match="background"):
        CkptStoreIO(str(tmp_path), background="fork").manager()


def _save_from_rank_zero_only(rank: int, init: str, out: str) -> None:
    """One of 2 gloo ranks, calling the IO as a rank-0-only loop (Fabric's DDP) would."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        if rank == 0:
            io = CkptStoreIO(
                f"{out}/root", background="thread"
            )  # never attached to a Lightning Trainer
            try:
                io.save_checkpoint(_checkpoint(2, 2.0), f"{out}/names/a.ckpt")
                result = "saved"
            except ConfigError as exc:
                result = str(exc)
            with open(f"{out}/result", "w") as f:
                f.write(result)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_a_rank_zero_only_call_among_several_processes_is_refused(tmp_path) -> None:
    import torch.multiprocessing as mp

    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(_save_from_rank_zero_only, args=(init, str(tmp_path)), nprocs=2)
    result = (tmp_path / "result").read_text()
    assert "one of 2 processes" in result and "strategy='ddp'" in result, result
    assert not (tmp_path / "root").exists() and not (tmp_path / "names").exists()
