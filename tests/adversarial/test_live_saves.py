"""A save in flight is never deleted from under, and a marker never vouches for a file that
is not there (trust rule 2; FAULTS rows 14 and 21).

* ``ckptstore-tool gc`` (a real process) and another manager's retention run while a save
  of a step older than the newest commit (a re-save after a fallback) is between its
  last file and its marker: its step lease keeps every file, it commits whole, verifies
  and loads;
* files deleted from under a save in flight (by anyone): the commit finds them missing,
  writes no marker, and the save fails (the manager reports it at the next wait);
* a fresh lease makes ``delete_step`` refuse and commit step 5 of another attempt leave
  the step's other files alone; a stale one protects nothing.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore.engine.committed import checkpoint_status
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.lease import STALE_AFTER_S, is_lease_name, lease_name
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.store import Buffer, Store
from ckptstore.errors import IncompleteCheckpointError, InUseError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.records import SaveStatus
from ckptstore.manager.retention import KeepLast
from ckptstore.testing.faults import FaultyStore
from tests.adversarial.test_deletion import loads
from tests.cli.conftest import Backend, run_script, sample_state, save_ckpt, step


def _wait_for(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _attempt_manifest(store: Store) -> bool:
    return any(n.startswith("ckptstore.manifest.") and n.count(".") == 3 for n in store.find())


class _Stalled:
    """A save of ``url`` in a thread whose marker write waits until ``go`` is set."""

    def __init__(self, backend: Backend, url: str, state: dict[str, Any]) -> None:
        self.go = threading.Event()
        self.error: BaseException | None = None
        inner = backend.open(url)
        go = self.go

        class Held(FaultyStore):
            def put_if_absent(self, path: str, data: Buffer) -> None:
                if path == MARKER_NAME:
                    go.wait(120)
                super().put_if_absent(path, data)

            def child(self, prefix: str) -> Held:
                return Held(self.inner.child(prefix))

        self.store = Held(inner)

        def run() -> None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ckptstore.save(state, ckptstore.writer(self.store))
            except BaseException as exc:  # noqa: BLE001 - checked by the test
                self.error = exc

        self.thread = threading.Thread(target=run)
        self.thread.start()
        _wait_for(lambda: _attempt_manifest(inner))  # every file written; marker next

    def finish(self) -> None:
        self.go.set()
        self.thread.join(120)
        assert not self.thread.is_alive()


@pytest.mark.processes  # ckptstore-tool gc and ls as real processes
def test_gc_and_retention_spare_a_save_in_flight(backend: Backend, root_url: str) -> None:
    for n in (1, 3, 4):
        save_ckpt(backend, step(root_url, n), sample_state(step=n))
    # A re-save of step 2 (after a fallback): incomplete and older than the newest commit,
    # which is what a torn leftover looks like to gc and to retention.
    stalled = _Stalled(backend, step(root_url, 2), sample_state(step=2))
    try:
        r = run_script("gc", root_url, "--keep-last", "1", "--json", *backend.opts)
        assert r.rc == 0, r.err
        doc = json.loads(r.out)
        assert 2 not in doc["deleted_steps"]
        why = {s["step"]: s["reason"] for s in doc["steps"]}
        assert why[2].startswith("save in flight"), why
        r = run_script("ls", root_url, "--json", *backend.opts)
        rows = {row["step"]: row for row in json.loads(r.out)["checkpoints"]}
        assert rows[2]["status"] == "incomplete" and "heartbeat" in rows[2]["in_flight"]
        with CheckpointManager(
            root_url, storage_options=backend.options or None, keep=KeepLast(1), run_id="other"
        ) as mgr:
            assert mgr.save(5, sample_state(step=5))
            mgr.wait()
            assert mgr.records[-1].status == SaveStatus.COMMITTED
        files = backend.open(step(root_url, 2)).find()
        assert any(n.endswith(".distcp") for n in files), files
    finally:
        stalled.finish()
    assert stalled.error is None, stalled.error
    assert checkpoint_status(backend.open(step(root_url, 2))) == "committed"
    assert loads(backend, step(root_url, 2), 2)
    assert not any(is_lease_name(n) for n in backend.open(step(root_url, 2)).find())
    r = run_script("verify", step(root_url, 2), *backend.opts)
    assert r.rc == 0, r.out + r.err


class _Deleting(FaultyStore):
    """Deletes the attempt's shard files (as a stray gc or ``rm`` would) when the commit
    writes its own manifest copy: the files the manifest lists are gone before the marker."""

    armed = [True]  # class-wide switch: a test may let a first save through

    def put_many(self, items: Any) -> None:
        if self.armed[0] and any(str(p).startswith("ckptstore.manifest.") for p, _ in items):
            for name in self.inner.find():
                if name.endswith(".distcp"):
                    self.inner.delete(name)
        self.inner.put_many(items)

    def child(self, prefix: str) -> _Deleting:
        return _Deleting(self.inner.child(prefix))


def test_files_deleted_under_a_save_leave_no_marker(backend: Backend, root_url: str) -> None:
    url = step(root_url, 1)
    with pytest.raises(IncompleteCheckpointError, match="was not committed") as info:
        ckptstore.save(sample_state(), ckptstore.writer(_Deleting(backend.open(url))))
    assert "is missing" in str(info.value)
    store = backend.open(url)
    assert not store.exists(MARKER_NAME)
    assert checkpoint_status(store) == "incomplete"
    assert not any(is_lease_name(n) for n in store.find())  # released on failure too


def test_manager_reports_such_a_save_failed(backend: Backend, root_url: str) -> None:
    _Deleting.armed[0] = False  # the first save commits
    try:
        mgr = CheckpointManager(_Deleting(backend.open(root_url)))
        assert mgr.save(1, {"w": torch.ones(8)})
        mgr.wait()
        _Deleting.armed[0] = True  # the second one has its files deleted from under it
        assert mgr.save(2, {"w": torch.ones(8)})
        with pytest.warns(RuntimeWarning, match="is missing"):
            mgr.wait()
        assert mgr.records[-1].status == SaveStatus.FAILED
        assert mgr.steps() == [1]
        with pytest.raises(IncompleteCheckpointError, match="was not committed"):
            mgr.close()
    finally:
        _Deleting.armed[0] = True
    assert not backend.open(step(root_url, 2)).exists(MARKER_NAME)


def test_a_fresh_lease_stops_delete_step_and_a_stale_one_does_not(
    backend: Backend, root_url: str
) -> None:
    url = save_ckpt(backend, step(root_url, 1), sample_state())
    save_ckpt(backend, step(root_url, 2), sample_state())
    store = backend.open(url)
    now = time.time()
    doc = {
        "ckptstore_lease": 1,
        "run": "job-a",
        "host": "elsewhere",
        "pid": 1,
        "node": "another-node",
        "token": "t1",
        "time": now,
        "attempt": "abc123",
    }
    store.put(lease_name("abc123"), json.dumps(doc).encode())
    root = backend.open(root_url)
    with pytest.raises(InUseError, match="job-a"):
        delete_step(root, "step_000000001")
    assert store.exists(MARKER_NAME)
    doc["time"] = now - STALE_AFTER_S - 5
    store.put(lease_name("abc123"), json.dumps(doc).encode())
    delete_step(root, "step_000000001")
    assert store.find() == []


def test_a_commit_leaves_another_live_attempts_files_alone(backend: Backend, root_url: str) -> None:
    url = step(root_url, 1)
    store = backend.open(url)
    # Another attempt of the same step in flight: its shard file and its fresh lease.
    store.put("__0_0.feedbeef.distcp", b"a live attempt's shard")
    doc = {
        "ckptstore_lease": 1,
        "run": "job-b",
        "host": "elsewhere",
        "pid": 1,
        "node": "another-node",
        "token": "t2",
        "time": time.time(),
        "attempt": "feedbeef",
    }
    store.put(lease_name("feedbeef"), json.dumps(doc).encode())
    save_ckpt(backend, url, sample_state())
    assert store.exists("__0_0.feedbeef.distcp")
    doc["time"] = time.time() - STALE_AFTER_S - 5  # its writer died: the next commit tidies
    store.put(lease_name("feedbeef"), json.dumps(doc).encode())
    save_ckpt(backend, url, sample_state(), overwrite=True)
    assert not store.exists("__0_0.feedbeef.distcp")
    assert not store.exists(lease_name("feedbeef"))
    assert loads(backend, url, 7)
