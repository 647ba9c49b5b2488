"""Transient faults on control calls (marker/manifest GET, HEAD, LIST, delete) are retried.

Faults are injected for real: a FaultyStore wrapping a LocalStore fails the Nth call of a
method, and a TCP fault proxy in front of SeaweedFS answers 503 or cuts a body short.
One transient failure never fails a restore, a reader or a save; a cleanup failure after
the marker is a warning in the save's record, never a failed committed save.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ckptstore
from ckptstore import WriterOptions
from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.engine.retry import RetryingStore, retrying
from ckptstore.errors import TransientStoreError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import KeepLast
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore
from harness.proxy import FaultProxy, Rule
from tests.conftest import BUCKET

FAST = TransferConfig(retry=RetryConfig(attempts=4, base_backoff_s=0.01, max_backoff_s=0.05))
ONE_503 = TransientStoreError("injected 503 Slow Down")


def state(v: float) -> dict[str, Any]:
    return {"w": torch.full((256,), v), "n": int(v)}


def _saved(root: str, steps: tuple[int, ...] = (1, 2)) -> None:
    with CheckpointManager(root, writer=WriterOptions(transfer=FAST), background="thread") as mgr:
        for s in steps:
            mgr.save(s, state(float(s)))


@pytest.mark.parametrize("method", ["get", "listdir"])
def test_restore_survives_one_transient_failure_of_each_control_call(
    tmp_path: Any, method: str
) -> None:
    root = str(tmp_path)
    _saved(root)
    faulty = FaultyStore(LocalStore(root), [Fault(method, calls={1}, error=ONE_503)])
    out = state(0.0)
    with CheckpointManager(faulty, writer=WriterOptions(transfer=FAST), background="thread") as mgr:
        assert mgr.restore(out) == 2
        assert mgr.engine.stats.retries >= 1
    assert out["n"] == 2 and torch.equal(out["w"], state(2.0)["w"])


def test_reader_survives_a_transient_marker_get(tmp_path: Any) -> None:
    root = str(tmp_path)
    _saved(root, (3,))
    step = LocalStore(root).child("step_000000003")
    faulty = FaultyStore(step, [Fault("get", calls={1}, error=ONE_503)])
    out = state(0.0)
    ckptstore.load(out, ckptstore.reader(faulty, transfer=FAST))
    assert out["n"] == 3
    assert faulty.calls["get"] >= 2  # the failed marker GET and its retry


def test_transient_head_of_the_marker_in_save_does_not_reach_training(tmp_path: Any) -> None:
    faulty = FaultyStore(LocalStore(str(tmp_path)), [Fault("size", calls={1}, error=ONE_503)])
    with CheckpointManager(faulty, writer=WriterOptions(transfer=FAST), async_save=False) as mgr:
        assert mgr.save(1, state(1.0))  # its "already committed?" HEAD failed once
        assert mgr.records[-1].status == "committed"


def test_cleanup_failing_after_the_marker_is_a_warning_not_a_failed_save(tmp_path: Any) -> None:
    # Every LIST fails for good: post-marker cleanup (step 5) cannot run at all.
    faulty = FaultyStore(LocalStore(str(tmp_path)), [Fault("find", error=ONE_503)])
    mgr = CheckpointManager(
        faulty, writer=WriterOptions(transfer=FAST), keep=KeepLast(3), background="thread"
    )
    mgr.save(1, state(1.0))
    mgr.close()  # does not raise: the save is committed
    (record,) = mgr.records
    assert record.status == "committed" and not record.error
    assert record.warnings and "committed" in record.warnings[0]
    out = state(0.0)
    with CheckpointManager(str(tmp_path), background="thread") as mgr2:
        assert mgr2.restore(out) == 1
    assert out["n"] == 1


def test_one_failed_list_in_cleanup_is_retried_without_a_warning(tmp_path: Any) -> None:
    faulty = FaultyStore(LocalStore(str(tmp_path)), [Fault("find", calls={1}, error=ONE_503)])
    with CheckpointManager(faulty, writer=WriterOptions(transfer=FAST)) as mgr:
        mgr.save(1, state(1.0))
    (record,) = mgr.records
    assert record.status == "committed" and record.warnings == []


def test_retention_failing_after_a_commit_is_a_warning(tmp_path: Any) -> None:
    root = str(tmp_path)
    _saved(root, (1,))
    # Deletes fail for good: retention cannot remove step 1 after step 2 commits.
    faulty = FaultyStore(LocalStore(root), [Fault("delete", error=ONE_503)])
    mgr = CheckpointManager(
        faulty, writer=WriterOptions(transfer=FAST), keep=KeepLast(1), background="thread"
    )
    mgr.save(2, state(2.0))
    mgr.close()
    record = mgr.records[-1]
    assert record.status == "committed" and record.warnings
    assert any("retention" in w or "committed" in w for w in record.warnings)


def test_retrying_view_is_idempotent_and_keeps_children_retrying(tmp_path: Any) -> None:
    view = retrying(LocalStore(str(tmp_path)), FAST.retry)
    assert retrying(view) is view
    assert isinstance(view.child("a"), RetryingStore)


# -- on the wire: SeaweedFS behind a fault proxy --------------------------------------------
@pytest.fixture
def s3_root(seaweedfs: Any) -> str:
    import uuid

    root = f"s3://{BUCKET}/retries-{uuid.uuid4().hex[:10]}"
    with CheckpointManager(
        root, storage_options=seaweedfs.storage_options, writer=WriterOptions(transfer=FAST)
    ) as m:
        for s in (1, 2):
            m.save(s, state(float(s)))
    return root


def _via(seaweedfs: Any, proxy: FaultProxy) -> dict[str, Any]:
    return dict(seaweedfs.storage_options, endpoint_url=proxy.endpoint)


@pytest.mark.server
@pytest.mark.parametrize(
    ("op", "action"),
    [("GetObject", "status"), ("GetObject", "truncate"), ("ListObjects", "status")],
    ids=["503-get-committed", "truncated-committed", "503-list"],
)
def test_restore_over_s3_survives_one_fault(
    seaweedfs: Any, proxy: FaultProxy, s3_root: str, op: str, action: str
) -> None:
    # The marker's GET is the one faulted (the manifest and .metadata are read beside it).
    rule = proxy.add(
        Rule(op, action, times=1, key_suffix="/COMMITTED" if op == "GetObject" else "")
    )
    out = state(0.0)
    with CheckpointManager(
        s3_root, storage_options=_via(seaweedfs, proxy), writer=WriterOptions(transfer=FAST)
    ) as mgr:
        assert mgr.restore(out) == 2
        assert mgr.engine.stats.retries >= 1  # the faulted call was made again
    assert out["n"] == 2 and torch.equal(out["w"], state(2.0)["w"])
    assert rule.hits == 1


@pytest.mark.server
def test_reader_over_s3_survives_a_503_on_the_marker(
    seaweedfs: Any, proxy: FaultProxy, s3_root: str
) -> None:
    rule = proxy.add(Rule("GetObject", "status", times=1, key_suffix="/COMMITTED"))
    out = state(0.0)
    url = f"{s3_root}/step_000000002"
    ckptstore.load(
        out, ckptstore.reader(url, storage_options=_via(seaweedfs, proxy), transfer=FAST)
    )
    assert out["n"] == 2
    assert rule.hits == 1


@pytest.mark.server
def test_save_over_s3_survives_a_503_on_the_marker_head_and_cleanup_list(
    seaweedfs: Any, proxy: FaultProxy, s3_root: str
) -> None:
    proxy.add(Rule("HeadObject", "status", times=1))
    proxy.add(Rule("ListObjects", "status", times=1))
    opts = _via(seaweedfs, proxy)
    with CheckpointManager(
        s3_root, storage_options=opts, writer=WriterOptions(transfer=FAST), async_save=False
    ) as mgr:
        assert mgr.save(3, state(3.0))
        record = mgr.records[-1]
        assert mgr.engine.stats.retries >= 2
    assert record.status == "committed" and not record.error and not record.warnings
    assert proxy.ops("HeadObject") and proxy.ops("ListObjects")
