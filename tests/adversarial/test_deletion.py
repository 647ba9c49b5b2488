"""The one deletion path: gc, retention, torn-leftover cleanup and stale-upload aborts delete
only what ckptstore made, never the newest good checkpoint, and survive kill -9.

Stray names are what colleagues and other tools leave in a shared root: ``step_5/``,
``step_0000000005/``, ``notes.txt`` inside a step, a regular file named like a step.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

import ckptstore
from ckptstore.engine.catalog import SkippedEntryWarning, list_steps, scan_root
from ckptstore.engine.deletion import delete_step, remove_made
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.verify import verify_checkpoint
from ckptstore.errors import ConfigError, UnsafePathError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.prune import apply_prune, plan_prune
from ckptstore.manager.retention import KeepLast
from tests.cli.conftest import (
    REPO,
    Backend,
    sample_state,
    save_ckpt,
    script_env,
    step,
    tear,
)


def committed(backend: Backend, root: str) -> list[int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedEntryWarning)
        return [e.step for e in list_steps(backend.open(root)) if e.status == "committed"]


def loads(backend: Backend, url: str, n: int) -> bool:
    """``url`` verifies byte for byte and loads the state saved as step ``n``."""
    store = backend.open(url)
    if not verify_checkpoint(store).ok:
        return False
    out = sample_state(step=n)
    out["model"]["w"].zero_()
    ckptstore.load(out, store)
    return torch.equal(out["model"]["w"], sample_state(step=n)["model"]["w"])


# -- stray names -------------------------------------------------------------------------
def test_gc_leaves_stray_names_alone_and_says_so(backend: Backend, root_url: str, cli) -> None:
    for n in (2, 3, 5):
        save_ckpt(backend, step(root_url, n), sample_state(step=n))
    root = backend.open(root_url)
    root.put("step_5/notes.txt", b"a colleague's notes")  # would map to step 5
    root.put("step_0000000005/notes.txt", b"ten digits")
    root.put("step_2/notes.txt", b"would be a torn leftover")
    root.put("notes.txt", b"top-level notes")
    root.put("step_000000003/notes.txt", b"inside a step that goes")
    tear(backend, step(root_url, 3))  # a torn leftover holding a user's file
    doc = cli("gc", root_url, "--keep-last", "1", "--json").json()
    assert doc["deleted_steps"] == [2, 3]
    left = {a["path"]: a["reason"] for a in doc["left_alone"]}
    for name in ("step_5", "step_0000000005", "step_2", "notes.txt", "step_000000003/notes.txt"):
        assert "not ckptstore's" in left[name], left
    for name in ("step_5/notes.txt", "step_0000000005/notes.txt", "step_2/notes.txt"):
        assert root.exists(name), name
    assert root.get("notes.txt") == b"top-level notes"
    assert root.child("step_000000003").find() == ["notes.txt"]  # only ours went
    assert root.child("step_000000002").find() == []
    assert committed(backend, root_url) == [5] and loads(backend, step(root_url, 5), 5)
    r = cli("gc", root_url, "--keep-last", "1")
    assert r.rc == 0 and "step_5: not ckptstore's (directory): left alone" in r.out
    assert "no ckptstore files: not ckptstore's" in r.out  # step 3 holds only notes.txt


def test_manager_retention_keeps_a_committed_step_beside_step_5(tmp_path) -> None:
    root = str(tmp_path / "root")
    os.makedirs(os.path.join(root, "step_5"))
    with open(os.path.join(root, "step_5", "notes.txt"), "w") as f:
        f.write("mine")
    with CheckpointManager(root, keep=KeepLast(2), background="thread") as mgr:
        for n in (3, 4, 5, 6):
            mgr.save(n, {"w": torch.full((4,), float(n))})
    assert CheckpointManager(root, background="thread").steps() == [5, 6]
    assert open(os.path.join(root, "step_5", "notes.txt")).read() == "mine"
    out = {"w": torch.zeros(4)}
    with CheckpointManager(root, background="thread") as mgr:
        assert mgr.restore(out, step=5) == 5
    assert torch.equal(out["w"], torch.full((4,), 5.0))


def test_a_file_named_like_a_step_is_skipped_by_ls_gc_and_restore(
    backend: Backend, root_url: str, cli
) -> None:
    for n in (1, 2):
        save_ckpt(backend, step(root_url, n), sample_state(step=n))
    root = backend.open(root_url)
    root.put("step_000000009", b"not a directory")
    r = cli("ls", root_url)
    assert r.rc == 0 and "step_000000009: skipped (a file named like a step" in r.out
    assert cli("ls", root_url, "--json").json()["skipped"][0]["name"] == "step_000000009"
    r = cli("gc", root_url, "--keep-last", "1")
    assert r.rc == 0 and "step_000000009: a file named like a step" in r.out
    assert root.get("step_000000009") == b"not a directory"
    assert committed(backend, root_url) == [2]
    if backend.name == "volume":
        out = sample_state()
        with (
            CheckpointManager(root_url, background="thread") as mgr,
            pytest.warns(SkippedEntryWarning),
        ):
            assert mgr.restore(out) == 2


def test_unknown_files_beside_ours_survive_every_deletion(tmp_path) -> None:
    backend = Backend("volume", str(tmp_path / "store"))
    url = save_ckpt(backend, backend.url("run", "step_000000001"))
    root = backend.open(backend.url("run"))
    step_store = root.child("step_000000001")
    step_store.put("notes.txt", b"n")
    step_store.put("sub/log.txt", b"l")
    step_store.put("__0_0.distcp.bak", b"b")  # near-miss names are not ours either
    assert sorted(delete_step(root, "step_000000001").foreign) == [
        "__0_0.distcp.bak",
        "notes.txt",
        "sub/log.txt",
    ]
    assert step_store.find() == ["__0_0.distcp.bak", "notes.txt", "sub/log.txt"]
    assert not os.path.exists(os.path.join(url, MARKER_NAME))
    for bad in ("step_1", "step_0000000001", "../step_000000001", "notes.txt"):
        with pytest.raises(UnsafePathError):
            delete_step(root, bad)
    # failed-output cleanup: safe ckptstore names only
    assert remove_made(step_store, ["../victim", "/etc/passwd", "notes.txt"]) == [
        "../victim",
        "/etc/passwd",
        "notes.txt",
    ]
    assert step_store.exists("notes.txt")


def test_damaged_steps_neither_count_nor_go(tmp_path) -> None:
    """KeepLast(2) after a restore found step 6 damaged keeps 2 *good* steps and 6."""
    backend = Backend("volume", str(tmp_path / "store"))
    root_url = backend.url("run")
    for n in (2, 4, 6):
        save_ckpt(backend, step(root_url, n), sample_state(step=n))
    root = backend.open(root_url)
    plan = plan_prune(root, KeepLast(2), damaged={6})
    actions = {d.step: (d.status, d.action) for d in plan.steps}
    assert actions == {2: ("committed", "keep"), 4: ("committed", "keep"), 6: ("damaged", "keep")}
    assert plan.newest == "step_000000004"
    plan = plan_prune(root, KeepLast(1), damaged={6})
    assert [d.step for d in plan.deletions] == [2]
    apply_prune(root, plan)
    assert committed(backend, root_url) == [4, 6]
    mgr = CheckpointManager(root_url, keep=KeepLast(1), async_save=False)
    assert mgr._damaged == set()
    mgr._damaged.add(6)
    mgr.save(7, sample_state(step=7))
    mgr.close()
    assert committed(backend, root_url) == [6, 7]


# -- local_tier_dir overlapping the root -----------------------------------------------------
def test_a_local_tier_overlapping_the_root_is_a_config_error(tmp_path) -> None:
    from ckptstore.tier.tier_writer import TierWriter

    root = str(tmp_path / "root")
    for staging in (root, os.path.join(root, "nvme"), str(tmp_path), root + "/"):
        with pytest.raises(ConfigError, match="local_tier_dir"):
            CheckpointManager(root, local_tier_dir=staging, background="thread")
        with pytest.raises(ConfigError, match="local_tier_dir"):
            TierWriter(step(root, 1), tier=staging)
    CheckpointManager(root, local_tier_dir=str(tmp_path / "nvme"), background="thread").close()
    # the bug it prevents: staging == root left one checkpoint under KeepLast(3)
    with CheckpointManager(
        root, local_tier_dir=str(tmp_path / "nvme"), keep=KeepLast(3), background="thread"
    ) as mgr:
        for n in range(4):
            mgr.save(n, {"w": torch.ones(2)})
    assert CheckpointManager(root, background="thread").steps() == [1, 2, 3]


# -- kill -9 -------------------------------------------------------------------------------
def _gc(root: str, crash: str | None) -> subprocess.CompletedProcess:
    env = script_env(**({"CKPTSTORE_CRASH_AT": crash} if crash else {}))
    return subprocess.run(
        [sys.executable, "-m", "ckptstore.cli", "gc", root, "--keep-last", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


@pytest.mark.processes
def test_kill_9_during_gc_never_loses_a_kept_checkpoint(tmp_path) -> None:
    backend = Backend("volume", str(tmp_path / "store"))
    root = backend.url("run")
    steps = (1, 2, 3, 4, 5, 6)
    for n in steps:
        save_ckpt(backend, step(root, n), sample_state(step=n))
    tear(backend, step(root, 3))
    backend.open(root).put("step_2/notes.txt", b"mine")
    for crash in ("after_unmark:1", "after_step_deleted:1", "after_unmark:2"):
        r = _gc(root, crash)
        assert r.returncode == -9, (crash, r.stdout, r.stderr)
        for n in (5, 6):  # what keep-last 2 keeps is committed and loadable after every kill
            assert loads(backend, step(root, n), n), crash
        assert committed(backend, root)[-2:] == [5, 6]
    r = _gc(root, None)
    assert r.returncode == 0, r.stderr
    assert committed(backend, root) == [5, 6]
    listing = scan_root(backend.open(root))
    assert [e.step for e in listing.steps] == [5, 6]
    assert backend.open(root).get("step_2/notes.txt") == b"mine"
    assert _gc(root, None).returncode == 0 and "deleted 0 checkpoints" in _gc(root, None).stdout


_SAVER = """
import sys, torch
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import KeepLast
root, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with CheckpointManager(root, keep=KeepLast(2), async_save=False) as mgr:
    for n in range(first, last + 1):
        mgr.save(n, {"w": torch.full((8,), float(n))})
"""


@pytest.mark.slow
def test_kill_9_during_saves_and_retention_keeps_the_newest_loadable(tmp_path) -> None:
    root = str(tmp_path / "root")
    runs = [
        (1, 3, None),
        (4, 6, "after_unmark:1"),  # retention killed after unmarking an old step
        (7, 9, "before_marker:2"),  # a save killed before its marker
        (10, 11, "after_step_deleted:2"),
    ]
    for first, last, crash in runs:
        env = script_env(**({"CKPTSTORE_CRASH_AT": crash} if crash else {}))
        r = subprocess.run(
            [sys.executable, "-c", _SAVER, root, str(first), str(last)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == (-9 if crash else 0), (crash, r.stderr[-2000:])
        steps = CheckpointManager(root).steps()
        assert len(steps) >= 1 and steps == sorted(steps)
        out = {"w": torch.zeros(8)}
        with CheckpointManager(root) as mgr:
            got = mgr.restore(out)
        assert got == steps[-1] and torch.equal(out["w"], torch.full((8,), float(got)))
    before = CheckpointManager(root).steps()
    r = subprocess.run(
        [sys.executable, "-c", _SAVER, root, "12", "12"], env=script_env(), timeout=180
    )
    assert r.returncode == 0  # the next save's retention finishes what the kills left
    kept = [*before, 12][-2:]
    assert CheckpointManager(root).steps() == kept
    assert sorted(os.listdir(root)) == [f"step_{n:09d}" for n in kept]
