"""A writer stopped for longer than its lease never commits over a deletion (``engine.fence``).

A save is stopped with SIGSTOP (every thread, its lease heartbeat included, as a cgroup
freezer or a VM pause stops it) at each point of its commit; its lease is then made stale
(the time that passes while it is stopped), and ``ckptstore-tool gc`` or another manager's
retention takes its step for an abandoned one. Resumed, the writer either fails, or
commits a checkpoint whose every file is there: never a marker over deleted files. Then
the other way round: a gc stopped between taking an attempt's fence and deleting its
files never touches the checkpoint a new save of that step commits meanwhile. Real
processes, real stores (a volume, SeaweedFS).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings

import pytest

from ckptstore.engine.catalog import list_steps
from ckptstore.engine.fence import fence_attempt, read_fence
from ckptstore.engine.lease import is_lease_name
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.verify import verify_checkpoint
from tests.cli.conftest import REPO, Backend, sample_state, save_ckpt, script_env, step, tear
from tests.conftest import BUCKET

pytestmark = pytest.mark.processes

#: Saves step 3 at argv[1] with the stock writer; says how it ended.
_WRITER = """
import json, sys, warnings
import ckptstore
from ckptstore.errors import CkptStoreError
from tests.cli.conftest import sample_state
warnings.simplefilter("ignore")
opts = json.loads(sys.argv[2]) or None
try:
    ckptstore.save(sample_state(step=3), ckptstore.writer(sys.argv[1], storage_options=opts))
    print("RESULT committed")
except CkptStoreError as exc:
    print("RESULT", type(exc).__name__, exc)
"""

#: Another manager on the root: saves step 7 with keep=KeepLast(1) (its retention then
#: deletes every older step, torn or committed).
_RETENTION = """
import json, sys, warnings
import torch
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import KeepLast
warnings.simplefilter("ignore")
opts = json.loads(sys.argv[2]) or None
with CheckpointManager(sys.argv[1], keep=KeepLast(1), async_save=False, background="thread",
                       storage_options=opts) as mgr:
    mgr.save(7, {"w": torch.ones(4)})
print("RESULT retention done")
"""


def _start(script: str, url: str, backend: Backend, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, url, json.dumps(backend.options)],
        env=script_env(**env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(script: str, url: str, backend: Backend) -> str:
    p = _start(script, url, backend)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return out


def _gc(backend: Backend, root: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ckptstore.cli", "gc", root, "--keep-last", "1", *backend.opts],
        env=script_env(**env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_stopped(p: subprocess.Popen[str], what: str) -> None:
    """Until ``p`` is stopped (state T); fails if it ends first."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            out, err = p.communicate()
            pytest.fail(f"{what} ended before its stop point: {out} {err}")
        with open(f"/proc/{p.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.05)
    pytest.fail(f"{what} never reached its stop point")


def _age_leases(backend: Backend, url: str) -> None:
    """What the stopped writer's lease looks like once STALE_AFTER_S has passed: its
    heartbeat thread is stopped with it, so nothing refreshes it."""
    store = backend.open(url)
    for name in store.find():
        if is_lease_name(name):
            doc = json.loads(store.get(name))
            doc["time"] -= 3600
            store.put(name, json.dumps(doc).encode())


def _resume(p: subprocess.Popen[str]) -> str:
    os.kill(p.pid, signal.SIGCONT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return out


def _check_no_false_marker(backend: Backend, root: str) -> None:
    """Every step with a marker verifies byte for byte: a marker never vouches for a file
    that is not there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for e in list_steps(backend.open(root)):
            store = backend.open(step(root, e.step))
            if store.exists(MARKER_NAME):
                report = verify_checkpoint(store)
                assert report.ok, (e.step, report)


#: Where the writer is stopped -> whether it can still commit when resumed: before its
#: fence the deleter wins (takes the fence, deletes its files); once its fence is taken
#: the deleter leaves its files alone; after its marker the step is committed (and, older
#: than the newest, deleted whole by the policy).
_POINTS = {
    "before_marker": "deleter wins",
    "after_fence": "writer wins",
    "after_check": "writer wins",
    "after_marker": "committed, then deleted",
}


def _writer_stopped_while_deleting(backend: Backend, root: str, point: str, deleter: str) -> None:
    for n in (1, 5):
        save_ckpt(backend, step(root, n), sample_state(step=n))
    url = step(root, 3)
    writer = _start(_WRITER, url, backend, CKPTSTORE_CRASH_AT=point, CKPTSTORE_CRASH_SIGNAL="STOP")
    try:
        _wait_stopped(writer, f"the writer stopped at {point}")
        _age_leases(backend, url)
        if deleter == "gc":
            gc = _gc(backend, root)
            out, err = gc.communicate(timeout=120)
            assert gc.returncode == 0, err
        else:
            out = _run(_RETENTION, root, backend)
        result = _resume(writer)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    store = backend.open(url)
    marked = store.exists(MARKER_NAME)
    _check_no_false_marker(backend, root)
    outcome = _POINTS[point]
    if outcome == "deleter wins":
        assert "RESULT IncompleteCheckpointError" in result and "deleted" in result, result
        assert not marked
    elif outcome == "writer wins":
        assert "RESULT committed" in result, result
        assert marked and verify_checkpoint(store).ok
    else:
        assert "RESULT committed" in result, result
        assert not marked  # the policy deleted it: its leftovers are a torn step
    # what the stopped writer left is cleaned up by the next gc, never a marker
    gc = _gc(backend, root)
    out, err = gc.communicate(timeout=120)
    assert gc.returncode == 0, err
    _check_no_false_marker(backend, root)
    left = [n for n in backend.open(url).find()] if outcome != "writer wins" else []
    assert left == [], left


@pytest.mark.parametrize("deleter", ["gc", "retention"])
@pytest.mark.parametrize("point", sorted(_POINTS))
def test_a_stopped_writer_never_commits_over_a_deletion(tmp_path, point, deleter) -> None:
    backend = Backend("volume", str(tmp_path / "store"))
    _writer_stopped_while_deleting(backend, backend.url("run"), point, deleter)


@pytest.mark.server
@pytest.mark.parametrize("point", ["before_marker", "after_check"])
def test_a_stopped_writer_never_commits_over_gc_on_s3(seaweedfs, point) -> None:
    """The same on S3, where the fence is an If-None-Match create (the volume above runs
    every point and both deleters)."""
    backend = Backend(
        "s3", f"s3://{BUCKET}/fence-{uuid.uuid4().hex[:8]}", seaweedfs.storage_options
    )
    _writer_stopped_while_deleting(backend, backend.url("run"), point, "gc")


def test_a_stopped_gc_never_deletes_a_new_save(tmp_path) -> None:
    """gc takes the fence of a torn attempt of step 3 and is stopped before deleting its
    files; a new save of step 3 commits meanwhile (its own clean-up deletes the torn
    attempt's files through the same fence); gc resumes: the new checkpoint is whole."""
    backend = Backend("volume", str(tmp_path / "store"))
    root = backend.url("run")
    for n in (1, 3, 5):
        save_ckpt(backend, step(root, n), sample_state(step=n))
    tear(backend, step(root, 3))
    # the first fence gc takes is step 1's (committed: deleted whole), the second step 3's
    gc = _gc(backend, root, CKPTSTORE_CRASH_AT="after_condemn:2", CKPTSTORE_CRASH_SIGNAL="STOP")
    try:
        _wait_stopped(gc, "gc stopped after taking a fence")
        fences = [n for n in backend.open(step(root, 3)).find() if fence_attempt(n)]
        assert len(fences) == 1
        held = read_fence(backend.open(step(root, 3)), str(fence_attempt(fences[0])))
        assert held is not None and held.state == "delete"
        save_ckpt(backend, step(root, 3), sample_state(step=3))
        assert verify_checkpoint(backend.open(step(root, 3))).ok
        os.kill(gc.pid, signal.SIGCONT)
        out, err = gc.communicate(timeout=120)
        assert gc.returncode == 0, err
    finally:
        if gc.poll() is None:
            gc.kill()
            gc.wait()
    store = backend.open(step(root, 3))
    assert store.exists(MARKER_NAME) and verify_checkpoint(store).ok
    _check_no_false_marker(backend, root)


def _killed_after_fence(backend: Backend, root: str, elsewhere: bool) -> str:
    """Step 3's writer killed (SIGKILL) between its commit fence and its marker; with
    ``elsewhere`` its fence and lease say it ran on another machine (whose processes this
    one cannot see); its lease is stale. Returns the attempt."""
    for n in (1, 5):
        save_ckpt(backend, step(root, n), sample_state(step=n))
    url = step(root, 3)
    p = _start(_WRITER, url, backend, CKPTSTORE_CRASH_AT="after_fence")
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGKILL
    store = backend.open(url)
    (attempt,) = [a for n in store.find() if (a := fence_attempt(n)) is not None]
    if elsewhere:
        for name in (f"ckptstore.fence.{attempt}.json", f"ckptstore.lease.{attempt}.json"):
            doc = json.loads(store.get(name))
            doc["node"] = "another-machine:1"
            store.put(name, json.dumps(doc).encode())
    _age_leases(backend, url)
    return attempt


def test_a_writer_killed_after_its_fence_is_cleaned_up_by_gc(tmp_path) -> None:
    """Its process is gone (this machine): it can never create its marker, so gc takes
    its fence and deletes its files like any torn leftover's."""
    backend = Backend("volume", str(tmp_path / "store"))
    root = backend.url("run")
    _killed_after_fence(backend, root, elsewhere=False)
    gc = _gc(backend, root)
    out, err = gc.communicate(timeout=120)
    assert gc.returncode == 0, err
    assert backend.open(step(root, 3)).find() == []


def test_a_fence_held_elsewhere_is_kept_until_repair(tmp_path) -> None:
    """A writer of another machine that took its fence may still create its marker: gc
    keeps its files and says how to release them; ``gc --repair`` shows it, ``--apply``
    releases it (files and fence), and nothing of it is left."""
    backend = Backend("volume", str(tmp_path / "store"))
    root = backend.url("run")
    attempt = _killed_after_fence(backend, root, elsewhere=True)
    gc = _gc(backend, root)
    out, err = gc.communicate(timeout=120)
    assert gc.returncode == 0, err
    assert "claimed its commit" in err and "--repair --apply" in err, err
    assert f"save attempt {attempt} are kept" in out and "--repair" in out, out
    kept = backend.open(step(root, 3)).find()
    assert f"ckptstore.fence.{attempt}.json" in kept and any(".distcp" in n for n in kept)
    cmd = [sys.executable, "-m", "ckptstore.cli", "gc", root, "--repair"]
    dry = subprocess.run(cmd, env=script_env(), cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert f"attempt {attempt}" in dry.stdout and "would release" in dry.stdout, dry.stdout
    assert backend.open(step(root, 3)).find() == kept
    done = subprocess.run(
        [*cmd, "--apply"], env=script_env(), cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0 and "released" in done.stdout, (done.stdout, done.stderr)
    assert backend.open(step(root, 3)).find() == []
    _check_no_false_marker(backend, root)
