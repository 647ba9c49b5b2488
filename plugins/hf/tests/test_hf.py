"""Hugging Face: Trainer callback and Accelerate hooks, killed / stopped and resumed."""

import os
import shutil
import signal

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


from accelerate_job import run as accelerate_run  # noqa: E402
from hf_job import train  # noqa: E402

from tests.plugins.util import (  # noqa: E402
    assert_equal_tree,
    committed,
    damage_shard,
    flip_tail,
    run_killed,
    statuses,
)

HERE = os.path.dirname(os.path.abspath(__file__))  # the job scripts' folder


@pytest.mark.processes
def test_trainer_killed_mid_upload_resumes_from_the_newest_committed(tmp_path, root_url) -> None:
    out = str(tmp_path / "out")
    # Killed -9 inside the upload of checkpoint-6 (data written, no commit marker): the
    # Trainer's local checkpoint-6 is complete, but only step 4 is committed.
    proc = run_killed(
        os.path.join(HERE, "hf_job.py"),
        ["--out", out, "--root", root_url, "--max-steps", "8"],
        "before_marker:3",
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    st = statuses(root_url)
    assert st[4] == "committed" and st[6] != "committed", st
    assert os.path.isfile(os.path.join(out, "checkpoint-6", "trainer_state.json"))
    flip_tail(os.path.join(out, "checkpoint-4", "model.safetensors"))  # the local copy rots

    _, ref, _ = train(str(tmp_path / "ref"), str(tmp_path / "ref-root"), 8)  # uninterrupted
    trainer, rec, _ = train(out, root_url, 8, resume=True)  # resume_from_checkpoint=True
    assert rec.start_step == 4
    assert_equal_tree(rec.start, ref.by_step[4])  # committed bytes, not the rotten copy
    assert trainer.state.global_step == 8
    assert_equal_tree(rec.by_step[8], ref.by_step[8])
    # Moved aside, not deleted: the rotten 4 and the uncommitted 6 (and 8, if the Trainer
    # wrote it before the kill landed).
    quarantined = set(os.listdir(os.path.join(out, ".ckptstore-uncommitted")))
    assert {"checkpoint-4", "checkpoint-6"} <= quarantined <= {f"checkpoint-{s}" for s in (4, 6, 8)}
    assert committed(root_url) == [4, 6, 8]  # KeepLast(3); the torn 6 was redone


@pytest.mark.processes  # the Trainer's default background: a writer process here
def test_trainer_falls_back_past_a_corrupt_commit_on_a_fresh_machine(tmp_path, root_url):
    out = str(tmp_path / "out")
    train(out, root_url, 4)
    damage_shard(root_url, 4)
    shutil.rmtree(out)  # a new machine: nothing local
    from ckptstore_hf import CkptStoreCallback

    cb = CkptStoreCallback(root_url, background="thread")
    with pytest.warns(RuntimeWarning, match="step 4 could not be restored"):
        path = cb.prepare_resume(out)
    assert path == os.path.join(out, "checkpoint-2")
    assert os.path.isfile(os.path.join(path, "trainer_state.json"))
    cb.close()


@pytest.mark.processes  # the Trainer's default background: a writer process here
def test_resume_with_every_step_damaged_raises_unless_asked_to_start_over(tmp_path, root_url):
    from ckptstore import NoLoadableCheckpointError
    from ckptstore_hf import CkptStoreCallback

    out = str(tmp_path / "out")
    train(out, root_url, 4)
    damage_shard(root_url, 2)
    damage_shard(root_url, 4)
    shutil.rmtree(out)
    cb = CkptStoreCallback(root_url, background="thread")
    with pytest.warns(RuntimeWarning), pytest.raises(NoLoadableCheckpointError) as info:
        cb.prepare_resume(out)  # resume_from None would retrain from scratch, exit code 0
    assert [s for s, _ in info.value.refused] == [4, 2]
    with pytest.warns(RuntimeWarning, match='starting from scratch, as on_unloadable="fresh"'):
        assert cb.prepare_resume(out, on_unloadable="fresh") is None
    cb.close()


@pytest.mark.processes  # the Trainer's default background: a writer process here
def test_accelerate_save_state_commits_and_resume_takes_the_committed_copy(tmp_path, root_url):
    ref = accelerate_run(str(tmp_path / "ref"), str(tmp_path / "ref-root"), 10, resume=False)
    project = str(tmp_path / "proj")
    accelerate_run(project, root_url, 6, resume=False)  # saves iterations 0, 1, 2
    assert committed(root_url) == [0, 1, 2]
    local = os.path.join(project, "checkpoints")
    # The run stops; the machine loses checkpoint_2, and a torn checkpoint_3 is left over.
    shutil.rmtree(os.path.join(local, "checkpoint_2"))
    os.makedirs(os.path.join(local, "checkpoint_3"))
    shutil.copy(os.path.join(local, "checkpoint_1", "model.safetensors"), local + "/checkpoint_3")

    def rot(path: str) -> None:  # the restored copy rots before load_state reads it
        flip_tail(os.path.join(path, "optimizer.bin"))

    res = accelerate_run(project, root_url, 10, resume=True, tamper=rot)
    assert res["path"] == os.path.join(local, "checkpoint_2")
    assert res["start"] == (6, 3)  # the loop's step, and the next automatic folder number
    assert_equal_tree(res["start_state"], ref["by_step"][6])
    assert_equal_tree(res["by_step"][10], ref["by_step"][10])
    # The torn folder and the rotten copy were moved aside, not deleted.
    quarantined = sorted(os.listdir(os.path.join(project, ".ckptstore-uncommitted")))
    assert quarantined == ["checkpoint_2", "checkpoint_3"]
    assert committed(root_url) == [2, 3, 4]  # KeepLast(3)


def test_manager_options_pass_through(tmp_path) -> None:
    from ckptstore import KeepLast, WriterOptions
    from ckptstore_hf import CkptStoreCallback

    cb = CkptStoreCallback(
        str(tmp_path / "root"),
        keep=KeepLast(5),
        writer=WriterOptions(codec="zstd", key_layout="spread"),
        strict=True,
        background="thread",
    )
    mgr = cb.folders.manager  # a real one (test_hf_options.py: every option, through a spy)
    assert (mgr.options.keep, mgr.options.writer.codec, mgr.options.strict) == (
        KeepLast(5),
        "zstd",
        True,
    )
    assert (mgr.options.writer.key_layout, mgr.options.background) == ("spread", "thread")
    cb.close()


@pytest.mark.processes  # the Trainer's default background: a writer process here
def test_one_line_starts_a_fresh_run_and_resumes_it_on_a_new_machine(tmp_path, root_url):
    """The documented ``train(resume_from_checkpoint=ckpt.resume_from)``: None on the first
    run (where ``True`` makes the Trainer raise), the newest committed folder after."""
    trainer, rec, ckpt = train(str(tmp_path / "first"), root_url, 4, resume="auto")
    assert ckpt.resume_from is None and rec.start_step == 0
    assert trainer.state.global_step == 4 and committed(root_url) == [2, 4]
    trainer, rec, ckpt = train(str(tmp_path / "second"), root_url, 6, resume="auto")
    assert ckpt.resume_from == str(tmp_path / "second" / "checkpoint-4")
    assert rec.start_step == 4 and trainer.state.global_step == 6
    assert committed(root_url) == [2, 4, 6]
