"""The manager's one save path: backends, save_step, SaveStatus, finalize's grace period."""

import json
import os
from dataclasses import asdict

import pytest
import torch

import ckptstore
from ckptstore.engine.catalog import list_steps, step_name
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import ConfigError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.options import SaveOptions
from ckptstore.manager.records import SaveRecord, SaveStatus
from ckptstore.manager.saving.save_step import save_step
from ckptstore.manager.saving.thread_backend import ThreadBackend
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore
from ckptstore.tier.jobs import TierJob, TierSpec
from tests.tier_dirs import step_dir


def test_save_status_compares_and_serialises_as_the_plain_names() -> None:
    record = SaveRecord(3, status=SaveStatus.COMMITTED)
    assert record.status == "committed" and f"{record.status}" == "committed"
    assert json.loads(json.dumps(asdict(record)))["status"] == "committed"
    assert [s.value for s in SaveStatus] == ["staging", "writing", "committed", "failed", "skipped"]


def test_save_step_saves_staged_and_direct_and_returns_no_warnings(tmp_path) -> None:
    root = LocalStore(str(tmp_path / "root"))
    staging = str(tmp_path / "nvme")
    engine = TransferEngine()
    try:
        for step, local_tier_dir in ((1, None), (2, staging)):
            tier = local_tier_dir and TierSpec(local_tier_dir, TierJob(root.url, "r"))
            notes = save_step(
                {"w": torch.arange(10.0) + step},
                root,
                step,
                SaveOptions(tier=tier),
                engine=engine,
                timings={"blocking_s": 0.5},
            )
            assert notes == []
    finally:
        engine.close()
    assert [e.step for e in list_steps(root) if e.status == "committed"] == [1, 2]
    # the save through the tier left a committed tier copy beside the root's step
    local = step_dir(staging, 2)
    assert "COMMITTED" in os.listdir(local)
    for step in (1, 2):
        out = {"w": torch.zeros(10)}
        ckptstore.load(out, str(tmp_path / "root" / step_name(step)))
        assert torch.equal(out["w"], torch.arange(10.0) + step)


@pytest.mark.parametrize("local_tier", [False, True], ids=["direct", "local_tier_dir"])
def test_save_step_refusal_fails_in_dcp_planning_and_writes_nothing(tmp_path, local_tier) -> None:
    """The Refusing schedule raises the carried error from DCP's planning step (with a
    local tier too: the writer is a TierWriter then), and nothing is written."""
    root = LocalStore(str(tmp_path / "root"))
    tier = TierSpec(str(tmp_path / "nvme"), TierJob(root.url, "r")) if local_tier else None
    options = SaveOptions(tier=tier)
    engine = TransferEngine()
    try:
        with pytest.raises(ConfigError, match="cannot rebuild"):
            save_step(
                {"w": torch.ones(4)},
                root,
                1,
                options,
                engine=engine,
                timings={},
                refusal=ConfigError("cannot rebuild the state"),
            )
    finally:
        engine.close()
    assert list_steps(root) == []


def test_the_thread_backend_is_picked_once_and_records_each_status(tmp_path) -> None:
    with CheckpointManager(str(tmp_path), on_busy="skip", background="thread") as mgr:
        assert isinstance(mgr._backend, ThreadBackend) and mgr._bg is None
        assert mgr.save(1, {"w": torch.ones(4)})
        mgr.wait()
        assert not mgr.save(1, {"w": torch.ones(4)})  # committed already
    assert [r.status for r in mgr.records] == [SaveStatus.COMMITTED, SaveStatus.SKIPPED]


def test_finalize_gives_up_at_the_end_of_the_grace_period(tmp_path) -> None:
    slow = FaultyStore(LocalStore(str(tmp_path)), [Fault("put", calls={1}, delay=1.5)])
    mgr = CheckpointManager(slow, grace_period_s=0.05)
    try:
        mgr.save(1, {"w": torch.ones(4)})
        assert mgr.finalize() is False  # the save is still in flight: no exception
    finally:
        mgr.close()  # waits for it
    assert mgr.records[-1].status == SaveStatus.COMMITTED
