"""CheckpointManager in one process: async saves, failures, fallback, retention."""

import os

import pytest
import torch

import ckptstore
from ckptstore.config import WriterOptions
from ckptstore.engine.catalog import list_steps, step_name
from ckptstore.errors import StorageFullError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import KeepEvery, KeepLast, select_deletions
from ckptstore.manager.state import RNGState
from ckptstore.stores.local import LocalStore
from tests.tier_dirs import step_dir, steps_in


def state(v: float) -> dict:
    return {"w": torch.full((1000,), v), "extra": {"v": v}}


def shard(root: str, step: int) -> str:
    d = os.path.join(root, step_name(step))
    return os.path.join(d, next(n for n in os.listdir(d) if n.endswith(".distcp")))


def test_save_restore_retention_and_timings(tmp_path) -> None:
    root = str(tmp_path / "root")
    with CheckpointManager(root, keep=KeepLast(2), background="thread") as mgr:
        for step in range(5):
            assert mgr.save(step, state(float(step)))
        mgr.wait()
        assert mgr.steps() == [3, 4]
        assert mgr.latest_step() == 4
        assert [r.status for r in mgr.records] == ["committed"] * 5
        assert all(r.blocking_s <= r.total_s and r.bytes == 4000 for r in mgr.records)
        assert not mgr.save(4, state(9.0))  # already committed: not saved twice
    out = state(0.0)
    with CheckpointManager(root, background="thread") as mgr:
        assert mgr.restore(out) == 4
    assert torch.equal(out["w"], state(4.0)["w"]) and out["extra"] == {"v": 4.0}


def test_restore_falls_back_past_a_corrupt_checkpoint(tmp_path) -> None:
    root = str(tmp_path)
    with CheckpointManager(root, keep=KeepLast(3), background="thread") as mgr:
        for step in (1, 2):
            mgr.save(step, state(float(step)))
    with open(shard(root, 2), "r+b") as f:
        f.seek(-10, 2)
        f.write(b"xxxxxxxxxx")
    out = state(0.0)
    with (
        CheckpointManager(root, background="thread") as mgr,
        pytest.warns(RuntimeWarning, match="step 2 could not"),
    ):
        assert mgr.restore(out) == 1
    assert torch.equal(out["w"], state(1.0)["w"])


def test_fresh_run_restores_nothing(tmp_path) -> None:
    with CheckpointManager(str(tmp_path), background="thread") as mgr:
        assert mgr.restore(state(0.0)) is None


def test_background_failure_is_reported_not_fatal(tmp_path, monkeypatch) -> None:
    root, staging = str(tmp_path / "root"), str(tmp_path / "nvme")
    # the thread: the patched os calls reach no writer process
    mgr = CheckpointManager(root, local_tier_dir=staging, background="thread")
    mgr.save(1, state(1.0))
    mgr.wait()
    import ckptstore.stores.local as local

    real = local.os.write

    def full_disk(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local.os, "write", full_disk)
    monkeypatch.setattr(local.os, "pwrite", lambda *a: full_disk(0, None))
    mgr.save(2, state(2.0))
    with pytest.warns(RuntimeWarning, match="No space left|no space left"):
        mgr.wait()
    monkeypatch.setattr(local.os, "write", real)
    monkeypatch.undo()
    assert mgr.records[-1].status == "failed"
    assert not os.path.exists(step_dir(staging, 2))  # partial files removed
    mgr.save(3, state(3.0))  # training goes on; the next save works
    mgr.close()
    assert CheckpointManager(root, background="thread").steps() == [1, 3]


def test_strict_mode_raises_the_background_error(tmp_path, monkeypatch) -> None:
    import ckptstore.stores.local as local

    def full_disk(*a: object) -> int:
        raise OSError(28, "No space left on device")

    # the thread: the patched os calls reach no writer process
    mgr = CheckpointManager(str(tmp_path), strict=True, background="thread")
    monkeypatch.setattr(local.os, "pwrite", full_disk)
    monkeypatch.setattr(local.os, "write", full_disk)
    mgr.save(1, state(1.0))
    with pytest.raises(StorageFullError):
        mgr.wait()
    monkeypatch.undo()
    mgr.close()  # raised once, by wait(): close does not raise it again


def test_local_tier_is_used_when_it_matches(tmp_path, caplog) -> None:
    root, staging = str(tmp_path / "root"), str(tmp_path / "nvme")
    with CheckpointManager(root, local_tier_dir=staging, background="thread") as mgr:
        mgr.save(5, state(5.0))
    out = state(0.0)
    caplog.set_level("INFO", logger="ckptstore.manager")
    with CheckpointManager(root, local_tier_dir=staging, background="thread") as mgr:
        assert mgr.restore(out) == 5
    assert "from the tier copy" in caplog.text
    assert torch.equal(out["w"], state(5.0)["w"])


def test_torn_leftovers_are_cleaned_after_a_newer_commit(tmp_path) -> None:
    root = str(tmp_path)
    torn = LocalStore(os.path.join(root, step_name(1)))
    torn.put("__0_0.dead.distcp", b"partial")
    with CheckpointManager(root, background="thread") as mgr:
        mgr.save(2, state(2.0))
    assert [e.step for e in list_steps(LocalStore(root))] == [2]


def test_restore_finishes_a_commit_cut_short_after_its_marker(tmp_path) -> None:
    """A kill between COMMITTED and the canonical copies (FAULTS row 3): the step is valid
    and restored; the next start writes its canonical manifest and .metadata, so stock DCP
    readers and verification see it whole, and removes a torn attempt's leftovers."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load

    from ckptstore.engine.verify import verify_checkpoint

    root = str(tmp_path)
    with CheckpointManager(root, keep=KeepLast(3), background="thread") as mgr:
        for step in (1, 2):
            mgr.save(step, state(float(step)))
    d = os.path.join(root, step_name(2))
    for name in ("ckptstore.manifest.json", ".metadata"):
        os.remove(os.path.join(d, name))
    with open(os.path.join(d, "__1_0.0badbeef.distcp"), "wb") as f:
        f.write(b"torn")
    ckpt = LocalStore(d)
    assert not verify_checkpoint(ckpt).ok
    out = state(0.0)
    with CheckpointManager(root, background="thread") as mgr:
        assert mgr.restore(out) == 2
    assert torch.equal(out["w"], state(2.0)["w"])
    assert verify_checkpoint(ckpt).ok
    assert "__1_0.0badbeef.distcp" not in os.listdir(d)
    stock = {"w": torch.zeros(1000)}
    dcp_load(stock, storage_reader=FileSystemReader(d), no_dist=True)
    assert torch.equal(stock["w"], state(2.0)["w"])


def test_two_managers_on_one_root_commit_each_step_once(tmp_path) -> None:
    root = str(tmp_path)
    a, b = (
        CheckpointManager(root, background="thread"),
        CheckpointManager(root, background="thread"),
    )
    a.save(1, state(1.0))
    b.save(1, state(2.0))
    outcomes = []
    for m in (a, b):
        try:
            m.close()
            outcomes.append("ok")
        except FileExistsError as exc:  # CommitConflictError or CheckpointExistsError
            assert isinstance(exc, ckptstore.CkptStoreError)
            outcomes.append("conflict")
    # Either the second save saw the first commit and skipped, or they raced and one lost
    # (at the commit marker, or at the writer's check that the step is not committed yet).
    assert outcomes in (["ok", "ok"], ["ok", "conflict"], ["conflict", "ok"])
    out = state(0.0)
    with CheckpointManager(root, background="thread") as mgr:
        assert mgr.restore(out) == 1
    assert out["w"][0].item() in (1.0, 2.0)


def test_rng_state_round_trip() -> None:
    rng = RNGState()
    saved = rng.state_dict()
    a = torch.rand(3)
    rng.load_state_dict(saved)
    assert torch.equal(torch.rand(3), a)


def test_retention_policies() -> None:
    assert select_deletions([1, 2, 3, 4], KeepLast(2)) == [1, 2]
    assert select_deletions([10, 15, 20, 25], KeepLast(1) | KeepEvery(10)) == [15]
    assert select_deletions([1, 2, 3], KeepLast(1), protected={1}) == [2]
    with pytest.raises(ValueError):
        KeepLast(0)


def test_unreachable_remote_fails_clearly_and_keeps_the_local_copy(tmp_path) -> None:
    from ckptstore.config import RetryConfig, TransferConfig
    from ckptstore.errors import TransientStoreError
    from ckptstore.testing.faults import Fault, FaultyStore

    remote = FaultyStore(
        LocalStore(str(tmp_path / "remote")),
        [Fault(m, error=TransientStoreError("connection refused")) for m in ("put", "put_part")],
    )
    fast = TransferConfig(retry=RetryConfig(attempts=3, base_backoff_s=0.01, deadline_s=5))
    staging = str(tmp_path / "nvme")
    mgr = CheckpointManager(remote, local_tier_dir=staging, writer=WriterOptions(transfer=fast))
    mgr.save(7, state(7.0))
    with pytest.raises(ckptstore.TransferError, match="after 3 attempts.*tier copy is kept"):
        mgr.wait()  # the manager's first save: nothing of the run is protected, it raises
    assert mgr.records[-1].status == "failed"
    kept = os.listdir(step_dir(staging, 7))
    assert any(n.endswith(".distcp") for n in kept)
    assert mgr.steps() == []  # nothing committed remotely
    mgr.close()  # the failure was raised by wait(), not again


def test_rng_state_on_another_world_size_reseeds_with_a_warning() -> None:
    rng = RNGState(seed=3)
    saved = {"world_size": 4, "rank2": rng.state_dict()["rank0"]}
    rng.expect_world_size(4)
    assert "rank0" not in rng.state_dict()  # nothing to load for this rank
    with pytest.warns(UserWarning, match="re-seeded deterministically"):
        rng.load_state_dict(saved)
    a = torch.rand(2)
    with pytest.warns(UserWarning):
        rng.load_state_dict(saved)
    assert torch.equal(torch.rand(2), a)


def test_rng_state_saves_its_streams_again_after_a_resize_restore() -> None:
    """After a restore from 4 ranks onto 1, the next checkpoint must carry this rank's
    streams: a restart on the new world size loads them (it failed with a missing key)."""
    rng = RNGState(seed=3)
    rng.expect_world_size(4)
    with pytest.warns(UserWarning, match="re-seeded"):
        rng.load_state_dict({"world_size": 4})
    saved = rng.state_dict()
    assert "rank0" in saved
    a = torch.rand(2)
    rng.expect_world_size(1)
    rng.load_state_dict(saved)
    assert torch.equal(torch.rand(2), a)


@pytest.mark.processes
def test_full_staging_disk_is_a_clean_error_and_training_goes_on(tmp_path, tiny_disk) -> None:
    root = str(tmp_path / "root")
    big = {"w": torch.ones(1024 * 1024)}  # 4 MiB: does not fit on the 1 MiB staging disk
    mgr = CheckpointManager(root, local_tier_dir=str(tiny_disk))
    mgr.save(1, big)
    with pytest.raises(StorageFullError, match="no space left"):
        mgr.wait()  # the manager's first save: raised, not a warning
    assert mgr.records[-1].status == "failed"
    assert steps_in(str(tiny_disk)) == []  # partial files removed (the job's stamp stays)
    mgr.save(2, state(2.0))  # a small one still fits: training went on
    mgr.close()
    assert CheckpointManager(root).steps() == [2]


def test_manifest_holds_the_timings_known_before_the_marker(tmp_path) -> None:
    import json

    from ckptstore.manager.manager import MANIFEST_TIMINGS

    with CheckpointManager(str(tmp_path), background="thread") as mgr:
        mgr.save(1, state(1.0))
        mgr.wait()
        record = mgr.records[-1]
    with open(tmp_path / step_name(1) / "ckptstore.manifest.json") as f:
        timings = json.load(f)["extra"]["timings"]
    assert tuple(timings) == MANIFEST_TIMINGS  # no field that is only known after the marker
    assert timings == {k: getattr(record, k) for k in MANIFEST_TIMINGS}
    assert timings["blocking_s"] > 0 and timings["bytes"] == 4000
    assert record.background_s > 0 and record.total_s >= record.blocking_s  # in the record only
