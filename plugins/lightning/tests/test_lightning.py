"""Lightning ``CkptStoreIO``: real Trainer runs, kill -9 mid-save, resume from the newest commit."""

import json
import os
import shutil
import signal

import pytest
import torch

pytest.importorskip("lightning")

from lightning_job import fit  # noqa: E402

from ckptstore.errors import (  # noqa: E402
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NoLoadableCheckpointError,
)
from ckptstore.manager.retention import KeepEvery  # noqa: E402
from ckptstore_lightning import POINTER_FORMAT, CkptStoreIO  # noqa: E402
from tests.plugins.util import (  # noqa: E402
    assert_equal_tree,
    committed,
    damage_shard,
    run_killed,
    statuses,
)

HERE = os.path.dirname(os.path.abspath(__file__))  # the job scripts' folder


def pointer(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    assert data["format"] == POINTER_FORMAT
    return data


def checkpoint(step: int, value: float) -> dict:
    """A minimal Lightning checkpoint dict, for driving the CheckpointIO directly."""
    return {
        "epoch": 0,
        "global_step": step,
        "pytorch-lightning_version": "2.6.0",
        "state_dict": {"layer.weight": torch.full((2, 3), value)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(float(step))}}, "groups": []}],
        "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 0}}}},
    }


@pytest.mark.processes
def test_kill_mid_save_then_resume_from_last_is_exact(tmp_path, root_url) -> None:
    ckdir = str(tmp_path / "ckpts")
    # Run 1 is killed -9 inside the third background save (step 6), after its data is
    # written and before its commit marker: step 4 is the newest committed checkpoint.
    proc = run_killed(
        os.path.join(HERE, "lightning_job.py"),
        ["--dir", ckdir, "--root", root_url, "--max-steps", "8"],
        "before_marker:3",
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    st = statuses(root_url)
    assert st[4] == "committed" and st[6] != "committed", st
    assert pointer(os.path.join(ckdir, "last.ckpt"))["follow"] == "newest"

    _, ref = fit(str(tmp_path / "ref"), str(tmp_path / "ref-root"), 8)  # never interrupted
    trainer, rec = fit(ckdir, root_url, 8, ckpt_path="last")
    assert rec.start_step == 4
    assert_equal_tree(rec.start, ref.by_step[4])  # weights, Adam moments, scheduled lr
    assert trainer.global_step == 8
    assert_equal_tree(rec.by_step[8], ref.by_step[8])
    # The torn step 6 was rewritten and committed; ModelCheckpoint's top-1 keeps only 8.
    assert committed(root_url) == [8]
    assert sorted(n for n in os.listdir(ckdir) if n.endswith(".ckpt")) == [
        "epoch=1-step=8.ckpt",
        "last.ckpt",
    ]
    assert pointer(os.path.join(ckdir, "epoch=1-step=8.ckpt"))["step"] == 8


def test_names_retention_and_what_load_accepts(tmp_path) -> None:
    ckdir = str(tmp_path / "ckpts")
    trainer, rec = fit(
        ckdir, None, 6, io=CkptStoreIO(keep=KeepEvery(4), background="thread")
    )  # root = dirpath
    # Lightning's top-1 dropped the names of steps 2 and 4; KeepEvery(4) still keeps the
    # first step of each 4-step window: 2 (of [0, 4)) and 4 (of [4, 8)).
    assert sorted(os.listdir(ckdir)) == [
        "epoch=1-step=6.ckpt",
        "last.ckpt",
        "step_000000002",
        "step_000000004",
        "step_000000006",
    ]
    best = trainer.checkpoint_callback.best_model_path
    assert pointer(best) == {
        "format": POINTER_FORMAT,
        "version": 1,
        "root": ".",
        "step": 6,
        "follow": "step",
    }
    io = CkptStoreIO(background="thread")
    ckpt = io.load_checkpoint(best)
    assert {"state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks"} <= set(ckpt)
    assert_equal_tree(dict(ckpt["state_dict"]), rec.by_step[6]["model"])
    assert ckpt["optimizer_states"][0]["state"][0]["exp_avg"].shape == (2, 4)
    assert io.load_checkpoint(ckdir)["global_step"] == 6  # a root: the newest commit
    assert io.load_checkpoint(os.path.join(ckdir, "step_000000004"))["global_step"] == 4
    # Names say "." for their own directory, so the whole directory can move.
    moved = str(tmp_path / "moved")
    shutil.move(ckdir, moved)
    assert io.load_checkpoint(os.path.join(moved, "last.ckpt"))["global_step"] == 6
    io.teardown()


def test_two_names_one_step_and_removal_keeps_the_newest(tmp_path, root_url) -> None:
    names = tmp_path / "names"
    io = CkptStoreIO(root_url, background="thread")
    io.save_checkpoint(checkpoint(2, 2.0), names / "a-step=2.ckpt")
    io.save_checkpoint(checkpoint(2, 2.0), names / "last.ckpt")  # same step: stored once
    io.wait()
    assert committed(root_url) == [2]
    assert pointer(str(names / "a-step=2.ckpt"))["root"] == root_url
    io.save_checkpoint(checkpoint(4, 4.0), names / "a-step=4.ckpt")
    io.remove_checkpoint(names / "a-step=2.ckpt")  # while 4 may still be uploading
    io.wait()
    assert committed(root_url) == [4]  # 2 went once 4 had committed
    io.remove_checkpoint(names / "a-step=4.ckpt")
    assert committed(root_url) == [4]  # the newest commit is never deleted
    assert sorted(os.listdir(names)) == ["last.ckpt"]
    assert torch.equal(
        io.load_checkpoint(names / "last.ckpt")["state_dict"]["layer.weight"],
        torch.full((2, 3), 4.0),
    )
    io.teardown()


def test_corrupt_newest_falls_back_for_last_and_fails_for_its_own_name(tmp_path, root_url):
    names = tmp_path / "names"
    io = CkptStoreIO(root_url, async_save=False)
    io.save_checkpoint(checkpoint(2, 2.0), names / "s2.ckpt")
    io.save_checkpoint(checkpoint(4, 4.0), names / "s4.ckpt")
    io.save_checkpoint(checkpoint(4, 4.0), names / "last.ckpt")
    io.teardown()
    damage_shard(root_url, 4)
    io = CkptStoreIO(root_url, background="thread")
    with pytest.warns(RuntimeWarning, match="step 4 could not be restored"):
        assert io.load_checkpoint(names / "last.ckpt")["global_step"] == 2
    with pytest.raises(CorruptCheckpointError):
        io.load_checkpoint(names / "s4.ckpt")
    with pytest.raises(IncompleteCheckpointError):
        io.load_checkpoint(tmp_path / "nothing-here")
    io.teardown()


def test_last_with_every_step_damaged_raises_with_each_reason(tmp_path, root_url):
    names = tmp_path / "names"
    io = CkptStoreIO(root_url, async_save=False)
    io.save_checkpoint(checkpoint(2, 2.0), names / "s2.ckpt")
    io.save_checkpoint(checkpoint(4, 4.0), names / "last.ckpt")
    io.teardown()
    damage_shard(root_url, 2)
    damage_shard(root_url, 4)
    io = CkptStoreIO(root_url, background="thread")
    with pytest.warns(RuntimeWarning), pytest.raises(NoLoadableCheckpointError) as info:
        io.load_checkpoint(names / "last.ckpt")  # never a fresh start without a word
    assert [s for s, _ in info.value.refused] == [4, 2]
    io.teardown()


def test_last_with_only_a_newer_ckptstores_steps_raises_naming_them(tmp_path) -> None:
    from pathlib import Path

    from tests.manager.test_unloadable import newer_ckptstore

    root, names = str(tmp_path / "root"), tmp_path / "names"
    io = CkptStoreIO(root, async_save=False)
    io.save_checkpoint(checkpoint(2, 2.0), names / "last.ckpt")
    io.teardown()
    newer_ckptstore(Path(root) / "step_000000002")  # committed_steps() no longer lists it
    io = CkptStoreIO(root, background="thread")
    with pytest.raises(NoLoadableCheckpointError, match="step 2: .*newer than this ckptstore"):
        io.load_checkpoint(names / "last.ckpt")
    io.teardown()


def test_failed_save_writes_no_name_and_teardown_raises(tmp_path, monkeypatch) -> None:
    import ckptstore.stores.local as local
    from ckptstore.errors import StorageFullError

    root, names = str(tmp_path / "root"), tmp_path / "names"
    io = CkptStoreIO(root, background="thread")  # the patched os calls reach no writer process
    io.save_checkpoint(checkpoint(2, 2.0), names / "s2.ckpt")
    io.wait()

    def full_disk(*args: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local.os, "write", full_disk)
    monkeypatch.setattr(local.os, "pwrite", full_disk)
    io.save_checkpoint(checkpoint(4, 4.0), names / "s4.ckpt")
    with pytest.warns(RuntimeWarning, match="s4.ckpt was not written"):
        io.wait()
    monkeypatch.undo()
    assert sorted(os.listdir(names)) == ["s2.ckpt"]
    with pytest.raises(StorageFullError):
        io.teardown()
    assert committed(root) == [2]


def test_stock_lightning_files_still_load_and_remove(tmp_path) -> None:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    path = str(tmp_path / "old.ckpt")
    TorchCheckpointIO().save_checkpoint(checkpoint(3, 3.0), path)
    io = CkptStoreIO(str(tmp_path / "root"))
    assert io.load_checkpoint(path, weights_only=False)["global_step"] == 3
    io.remove_checkpoint(path)
    assert not os.path.exists(path)
