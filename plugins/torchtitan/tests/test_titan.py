"""torchtitan's checkpointer through ckptstore on 2 CPU gloo ranks: a small FSDP2 model,
torchtitan's optimizer and LR scheduler containers, a dataloader and a train state (the
job: titan_job.py). Save, resume bitwise, ``keep_latest_k``, a rank SIGKILLed inside a
save, and ``initial_load_path`` from a bucket."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
import torch
from titan_job import train, train_until_killed

import ckptstore
from harness.dist import run_distributed
from tests.conftest import BUCKET

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def _run(*args: Any, **kwargs: Any) -> list[Any]:
    return run_distributed(*args, timeout=240, daemon=False, **kwargs)


def _same(a: list[dict], b: list[dict]) -> None:
    """Every rank holds the same weights, optimizer moments, LR, data position and step."""
    for ra, rb in zip(a, b, strict=True):
        assert ra["state"].keys() == rb["state"].keys()
        assert [k for k in ra["state"] if ra["state"][k] != rb["state"][k]] == []


def _committed(url: str, options: dict | None = None) -> list[int]:
    return list(ckptstore.committed_steps(ckptstore.open_store(url, options)))


@pytest.mark.parametrize(
    "async_mode",
    [
        "disabled",
        # the kill test saves async too
        pytest.param("async", marks=pytest.mark.slow),
        pytest.param("async_with_pinned_mem", marks=pytest.mark.slow),
    ],
)
def test_resume_is_bitwise_and_keeps_the_latest_k(tmp_path, async_mode: str) -> None:
    folder = str(tmp_path / "ckpt")
    config = dict(
        folder=folder,
        interval=1,
        async_mode=async_mode,
        keep_latest_k=2,
        last_save_model_only=False,
    )
    through = _run(train, 2, 6, config)  # saves 1..5, then 6 (the last step, synchronously)
    assert [r["resumed"] for r in through] == [False, False]
    # keep_latest_k through ckptstore's prune, after each save but the last (as torchtitan
    # purges): k committed steps, and an async save still in flight when it ran
    kept = [[4, 5, 6]] if async_mode == "disabled" else [[4, 5, 6], [3, 4, 5, 6]]
    assert _committed(folder) in kept
    assert len(os.listdir(folder)) == len(_committed(folder))
    resumed = _run(train, 2, 6, config, None, 4)  # --checkpoint.load_step 4, train 5 and 6
    assert [(r["resumed"], r["start"]) for r in resumed] == [(True, 4), (True, 4)]
    _same(through, resumed)
    assert _committed(folder)[-2:] == [5, 6]  # saved again over the steps rolled back


def _flip_a_byte(step_dir: str) -> None:
    """Damage a committed step's data without touching its marker or manifest."""
    shard = sorted(n for n in os.listdir(step_dir) if n.endswith(".distcp"))[-1]
    with open(os.path.join(step_dir, shard), "r+b") as f:
        f.seek(os.path.getsize(f.name) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_rank_killed_in_a_save_resumes_from_the_last_good_commit(tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    config = dict(folder=folder, interval=2, async_mode="async", last_save_model_only=False)
    # rank 0 (the coordinator) is SIGKILLed in the third save (step 6), after every rank's
    # shards are durable and its manifest and .metadata are written, before COMMITTED
    env = {"CKPTSTORE_CRASH_AT": "before_marker:3", "CKPTSTORE_CRASH_RANK": "0"}
    ends = _run(train_until_killed, 2, 6, config, str(tmp_path), env=env, exits=[0])
    assert ends[0] == -9 and ends[1].startswith("save failed")
    assert any(n.endswith(".distcp") for n in os.listdir(os.path.join(folder, "step_000000006")))
    assert _committed(folder) == [2, 4]
    # and step 4's bytes rot on storage: the restart skips the torn step 6, finds step 4's
    # damage when it reads it, and resumes from step 2
    _flip_a_byte(os.path.join(folder, "step_000000004"))
    resumed = _run(train, 2, 6, config)
    assert [(r["resumed"], r["start"]) for r in resumed] == [(True, 2), (True, 2)]
    expected = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    _same([{"state": e} for e in expected], resumed)
    assert _committed(folder) == [2, 4, 6]  # 4 saved again over the damaged one
    assert ckptstore.verify_checkpoint(ckptstore.open_store(folder).child("step_000000004")).ok


@pytest.mark.server
def test_initial_load_path_from_a_bucket(tmp_path, seaweedfs: Any) -> None:
    options = seaweedfs.storage_options
    bucket_run = f"s3://{BUCKET}/titan-{uuid.uuid4().hex[:8]}"
    first = dict(folder=bucket_run, interval=2, storage_options=options)
    through = _run(train, 2, 4, {**first, "last_save_model_only": False})
    assert _committed(bucket_run, options) == [2, 4]
    # a new run, local folder, starting from the bucket's step 2 (everything, not only
    # the model): the same steps 3 and 4
    second = dict(
        folder=str(tmp_path / "ckpt"),
        interval=2,
        storage_options=options,
        initial_load_path=f"{bucket_run}/step_000000002",
        initial_load_model_only=False,
        last_save_model_only=False,
    )
    resumed = _run(train, 2, 4, second)
    assert [(r["resumed"], r["start"]) for r in resumed] == [(True, 2), (True, 2)]
    _same(through, resumed)
    assert _committed(str(tmp_path / "ckpt")) == [4]


def _load_step(rank: int, world: int, folder: str, step: int) -> str:
    from titan_job import build

    manager, _ = build(rank, world, folder=folder)
    try:
        manager.load(step=step)
    except (FileNotFoundError, RuntimeError) as exc:  # Incomplete / NoLoadableCheckpointError
        return f"{type(exc).__name__}: {exc}"
    finally:
        manager.close()
    return "loaded"


def test_a_load_step_that_never_committed_is_refused_naming_the_committed(tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    _run(train, 1, 2, dict(folder=folder, interval=1, last_save_model_only=False))
    (message,) = _run(_load_step, 1, folder, 3)
    assert message.startswith("IncompleteCheckpointError")
    assert "load_step=3" in message and "[1, 2]" in message


def test_every_committed_step_damaged_raises_instead_of_a_fresh_start(tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    _run(train, 1, 2, dict(folder=folder, interval=1, last_save_model_only=False))
    for step in (1, 2):
        _flip_a_byte(os.path.join(folder, f"step_00000000{step}"))
    (message,) = _run(_load_step, 1, folder, -1)
    assert message.startswith("NoLoadableCheckpointError")
    assert "2 committed step(s) and none could be restored: step 2: " in message


def test_the_config_keeps_torchtitans_settings_and_refuses_bad_storage_options() -> None:
    from ckptstore_titan import CkptStoreCheckpointManager
    from torchtitan.components.checkpointer import CheckpointManager

    base = CheckpointManager.Config(interval=7, async_mode="async", keep_latest_k=3)
    ours = CkptStoreCheckpointManager.Config.from_titan(base, enable=True, folder="s3://b/r")
    assert (ours.interval, ours.async_mode, ours.keep_latest_k) == (7, "async", 3)
    assert (ours.enable, ours.folder, ours.enable_plan_caching) == (True, "s3://b/r", True)
    with pytest.raises(ckptstore.ConfigError, match="storage_options must be a dict"):
        CkptStoreCheckpointManager.Config(storage_options="endpoint=x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2 checkpoint"):  # torchtitan's own checks
        CkptStoreCheckpointManager.Config(keep_latest_k=1)


def test_writer_options_given_once_reach_every_save(tmp_path) -> None:
    folder = str(tmp_path / "ckpt")
    writer = ckptstore.WriterOptions(codec="zstd", key_layout="spread")
    config = dict(folder=folder, interval=1, last_save_model_only=False, writer=writer)
    _run(train, 2, 2, config)
    for step in _committed(folder):
        root = ckptstore.open_store(folder).child(ckptstore.step_name(step))
        manifest = ckptstore.open_committed(root).manifest
        shards = [name for name in manifest.files if name.endswith(".distcp")]
        assert manifest.codec == "zstd" and len(shards) == 2
        assert all(name[2] == "/" for name in shards)  # spread: under <hh>/


def test_the_old_codec_field_warns_naming_writer_and_still_works() -> None:
    from ckptstore_titan import CkptStoreCheckpointManager

    with pytest.warns(DeprecationWarning, match=r"codec=.*writer=WriterOptions\(codec=\.\.\.\)"):
        ours = CkptStoreCheckpointManager.Config(codec="zstd")
    assert (ours.writer, ours.codec) == (ckptstore.WriterOptions(codec="zstd"), None)
    kept = CkptStoreCheckpointManager.Config.from_titan(ours, folder="s3://b/r")
    assert kept.writer.codec == "zstd"  # from_titan keeps it, with no second warning
    with pytest.raises(ckptstore.ConfigError, match="checkpoint.writer must be"):
        CkptStoreCheckpointManager.Config(writer={"codec": "zstd"})  # type: ignore[arg-type]


def test_torchtitans_command_line_keeps_the_plugins_config_and_overrides_its_fields() -> None:
    from ckptstore_titan import CkptStoreCheckpointManager
    from torchtitan.config import ConfigManager

    args = ["--module", "titan_cli_config", "--config", "job_ckptstore"]
    args += ["--checkpoint.interval", "3", "--checkpoint.async_mode", "async"]
    checkpoint = ConfigManager().parse_args(args).checkpoint
    assert type(checkpoint) is CkptStoreCheckpointManager.Config
    assert (checkpoint.interval, checkpoint.async_mode) == (3, "async")
    assert (checkpoint.folder, checkpoint.storage_options) == ("s3://bucket/run1", {"anon": False})
