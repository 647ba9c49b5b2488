"""Recovery semantics: damaged steps are replaced on re-save, the local tier falls back to
the root's copy of the same step, and a racing loser always gets a conflict error."""

from __future__ import annotations

import multiprocessing as mp
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptstore.engine.catalog import list_steps, step_name
from ckptstore.engine.committed import open_committed
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import KeepLast
from ckptstore.stores.local import LocalStore
from tests.tier_dirs import step_dir


def state(v: float) -> dict[str, Any]:
    return {"w": torch.full((512,), v), "n": v}


def shards(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*.distcp"))


def damage(path: Path) -> None:
    """Flip bytes in the middle of a shard: same size, marker fine, CRC fails at load."""
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _three_steps(root: str) -> None:
    with CheckpointManager(root, keep=KeepLast(3), background="thread") as mgr:
        for s in (2, 4, 6):
            mgr.save(s, state(float(s)))


def test_resaving_a_step_restore_skipped_as_corrupt_replaces_it(tmp_path: Path) -> None:
    root = str(tmp_path)
    _three_steps(root)
    step6 = tmp_path / step_name(6)
    old_attempt = open_committed(LocalStore(str(step6))).marker.attempt
    damage(shards(step6)[0])
    out = state(0.0)
    with CheckpointManager(root, keep=KeepLast(2), background="thread") as mgr:
        with pytest.warns(RuntimeWarning, match="step 6 could not be restored"):
            assert mgr.restore(out) == 4
        assert mgr.save(6, state(66.0))  # not skipped as "already committed"
        mgr.wait()
        assert mgr.records[-1].status == "committed"
        assert mgr.steps() == [4, 6]  # the good 4 is kept, 2 goes
    committed = open_committed(LocalStore(str(step6)))
    assert committed.marker.attempt != old_attempt and committed.canonical
    assert all(old_attempt not in p.name for p in step6.rglob("*"))  # old attempt's files gone
    out = state(0.0)
    with CheckpointManager(root, background="thread") as mgr, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert mgr.restore(out) == 6
    assert out["n"] == 66.0 and torch.equal(out["w"], state(66.0)["w"])


def test_saving_over_a_step_whose_marker_commits_nothing_valid_replaces_it(
    tmp_path: Path,
) -> None:
    root = str(tmp_path)
    _three_steps(root)
    (tmp_path / step_name(6) / "COMMITTED").write_bytes(b"[]")  # marker garbage
    with CheckpointManager(root, keep=KeepLast(3), background="thread") as mgr:
        assert mgr.restore(state(0.0)) == 4
        assert mgr.save(6, state(6.5))
    out = state(0.0)
    with CheckpointManager(root, background="thread") as mgr:
        assert mgr.restore(out) == 6
    assert out["n"] == 6.5


def _replace_and_crash(root: str, point: str) -> None:
    os.environ["CKPTSTORE_CRASH_AT"] = point
    with CheckpointManager(root, keep=KeepLast(3), async_save=False) as mgr:
        mgr.restore(state(0.0))
        mgr.save(6, state(66.0))


@pytest.mark.parametrize(("point", "expect"), [("before_marker", 4), ("after_marker", 6)])
@pytest.mark.processes
def test_replacement_killed_midway_leaves_old_or_new_whole(
    tmp_path: Path, point: str, expect: int
) -> None:
    root = str(tmp_path)
    _three_steps(root)
    damage(shards(tmp_path / step_name(6))[0])
    proc = mp.get_context("spawn").Process(target=_replace_and_crash, args=(root, point))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -9  # killed at the crash point
    out = state(0.0)
    with CheckpointManager(root) as mgr, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert mgr.restore(out) == expect
    assert out["n"] == (66.0 if expect == 6 else 4.0)
    # Whatever the crash left, step 6 is a whole committed checkpoint (old or new).
    assert {e.step: e.status for e in list_steps(LocalStore(root))}[6] == "committed"


def test_damaged_local_copy_falls_back_to_the_remote_copy_of_the_same_step(
    tmp_path: Path,
) -> None:
    root, staging = str(tmp_path / "remote"), str(tmp_path / "local")
    with CheckpointManager(root, local_tier_dir=staging, background="thread") as mgr:
        for s in (1, 2):
            mgr.save(s, state(float(s)))
    local = Path(step_dir(staging, 2))
    assert shards(local)
    damage(shards(local)[0])
    out = state(0.0)
    with CheckpointManager(root, local_tier_dir=staging, background="thread") as mgr:
        with pytest.warns(RuntimeWarning, match="tier copy of step 2") as caught:
            assert mgr.restore(out) == 2
        assert mgr._damaged == set()
    assert not any("falling back" in str(w.message) for w in caught)
    assert out["n"] == 2.0 and torch.equal(out["w"], state(2.0)["w"])


def _racer(root: str, who: int, barrier: Any, steps: int) -> list[str]:
    outcomes = []
    # Two processes of the same run (a zombie and its replacement, FAULTS row 14): the
    # root owner lets both in; the create-only marker decides each step.
    mgr = CheckpointManager(
        root, keep=KeepLast(100), async_save=False, strict=True, run_id="one-run"
    )
    for s in range(steps):
        barrier.wait(60)
        try:
            outcomes.append("ok" if mgr.save(s, state(float(who))) else "skipped")
        except FileExistsError as exc:  # CheckpointExistsError / CommitConflictError
            outcomes.append(f"conflict:{type(exc).__name__}")
        except Exception as exc:  # noqa: BLE001 - recorded, asserted on below
            outcomes.append(f"other:{type(exc).__name__}: {exc}")
    try:
        mgr.close()  # re-raises the last failed save: a conflict, if this one lost last
    except FileExistsError:
        pass
    return outcomes


def _race_entry(root: str, who: int, barrier: Any, steps: int, results: Any) -> None:
    results.put((who, _racer(root, who, barrier, steps)))


@pytest.mark.slow  # two spawned processes: ~25 s on two busy cores
def test_racing_managers_loser_always_gets_a_conflict(tmp_path: Path) -> None:
    root, steps = str(tmp_path), 8
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_race_entry, args=(root, who, barrier, steps, results))
        for who in range(2)
    ]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=170) for _ in procs)
    for p in procs:
        p.join(30)
    for s in range(steps):
        pair = sorted((got[0][s], got[1][s]))
        assert not any(o.startswith("other") for o in pair), (s, pair)
        assert pair.count("ok") == 1, (s, pair)  # exactly one committed the step
    out = state(-1.0)
    with CheckpointManager(root) as mgr:
        assert mgr.restore(out) == steps - 1
    assert out["n"] in (0.0, 1.0)
