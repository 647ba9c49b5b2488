"""Two cadences: the local tier every ``local_every`` steps, the root every ``root_every``.

A local-only step is committed in the local tier alone (its manifest says so) and never
touches the root; a restore takes the newest step complete across the tiers (a newer
local-only step beats an older durable one) and falls back to the root's newest when the
local-only step cannot be loaded. On several nodes a local-only step's small objects and
replicas reach the peers, so that a replaced node, node 0 included, restores it with
nothing read from the root.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from typing import Any

import pytest
import torch

from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME
from ckptstore.engine.names import JOB_STAMP, step_name
from ckptstore.errors import ConfigError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.options import ManagerOptions
from ckptstore.stores.local import LocalStore
from ckptstore.tier.rules import LOCAL_ONLY, save_tier
from harness.dist import run_distributed
from tests.manager.test_peer_tier import DataReads
from tests.tier_dirs import job_dir, step_dir, steps_in

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.mark.parametrize(
    ("local_every", "root_every", "want"),
    [
        (None, 1, ["root"] * 6),
        (None, 3, [None, None, "root", None, None, "root"]),
        (2, 4, [None, "local", None, "root", None, "local"]),
        (1, 3, ["local", "local", "root", "local", "local", "root"]),
    ],
)
def test_save_tier_routes_each_step(local_every, root_every, want) -> None:
    assert [save_tier(s, local_every, root_every) for s in range(1, 7)] == want


@pytest.mark.parametrize(
    ("keywords", "words"),
    [
        ({"local_every": 2}, "local_tier_dir"),
        ({"local_every": 0, "local_tier_dir": "/x"}, "local_every"),
        ({"root_every": True}, "root_every"),
        ({"keep_local": 0}, "keep_local"),
    ],
)
def test_bad_cadences_are_refused_with_the_option_named(keywords, words) -> None:
    with pytest.raises(ConfigError, match=words):
        ManagerOptions(**keywords)


def state(v: float) -> dict[str, Any]:
    return {"w": torch.arange(10_000.0) * v, "b": torch.full((100,), v)}


def equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in b)


def extra(path: str) -> dict[str, Any]:
    with open(os.path.join(path, MANIFEST_NAME)) as f:
        return json.load(f)["extra"]


def run_cadence(tmp: str, steps: range, **keywords: Any) -> list[Any]:
    keywords.setdefault("background", "thread")  # the cadences, not where saves run
    with CheckpointManager(
        os.path.join(tmp, "root"), local_tier_dir=os.path.join(tmp, "tier"), **keywords
    ) as mgr:
        for s in steps:
            mgr.save(s, state(float(s)))
            mgr.wait()
        return [(r.step, r.status, r.tier) for r in mgr.records]


def restore(tmp: str) -> tuple[int | None, dict[str, Any]]:
    out = state(0.0)
    with CheckpointManager(
        os.path.join(tmp, "root"), local_tier_dir=os.path.join(tmp, "tier"), background="thread"
    ) as mgr:
        return mgr.restore(out), out


def test_local_only_steps_never_reach_the_root_and_the_newest_is_restored(tmp_path) -> None:
    tmp = str(tmp_path)
    records = run_cadence(tmp, range(1, 7), local_every=2, root_every=4)
    assert [(s, str(st), t) for s, st, t in records] == [
        (1, "skipped", "root"),
        (2, "committed", "local"),
        (3, "skipped", "root"),
        (4, "committed", "root"),
        (5, "skipped", "root"),
        (6, "committed", "local"),
    ]
    assert sorted(os.listdir(os.path.join(tmp, "root"))) == [step_name(4)]
    tier = os.path.join(tmp, "tier")
    assert steps_in(tier) == [step_name(6)]  # keep_local=1: the newest only
    assert extra(step_dir(tier, 6))["tier"] == LOCAL_ONLY
    step, out = restore(tmp)
    assert step == 6 and equal(out, state(6.0))


def test_keep_local_keeps_the_newest_steps_a_restore_could_pick(tmp_path) -> None:
    tmp = str(tmp_path)
    tier = os.path.join(tmp, "tier")
    run_cadence(tmp, range(1, 7), local_every=2, root_every=4, keep_local=2)
    assert steps_in(tier) == [step_name(4), step_name(6)]
    run_cadence(tmp, range(7, 9), local_every=2, root_every=4, keep_local=2)
    # durable step 8 supersedes local-only step 6: the root's 4 and 8 are what a restore
    # could pick
    assert steps_in(tier) == [step_name(4), step_name(8)]
    run_cadence(tmp, range(9, 10), local_every=1, root_every=10, keep_local=2)
    assert steps_in(tier) == [step_name(8), step_name(9)]


def test_a_damaged_local_only_step_falls_back_to_the_roots_newest(tmp_path) -> None:
    tmp = str(tmp_path)
    run_cadence(tmp, range(1, 7), local_every=2, root_every=4)
    d = step_dir(os.path.join(tmp, "tier"), 6)
    (shard,) = [n for n in os.listdir(d) if n.endswith(".distcp")]
    with open(os.path.join(d, shard), "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\xff" * 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step, out = restore(tmp)
    assert step == 4 and equal(out, state(4.0))
    assert any("step 6 could not be restored" in str(w.message) for w in caught)


def test_a_local_only_step_asked_for_by_number_is_restored(tmp_path) -> None:
    tmp = str(tmp_path)
    run_cadence(tmp, range(1, 4), local_every=1, root_every=2, keep_local=2)
    out = state(0.0)
    with CheckpointManager(
        os.path.join(tmp, "root"), local_tier_dir=os.path.join(tmp, "tier"), background="thread"
    ) as mgr:
        assert mgr.restore(out, step=3) == 3 and equal(out, state(3.0))
        assert mgr.restore(out, step=2) == 2 and equal(out, state(2.0))


@pytest.mark.processes
def test_the_process_backend_saves_local_only_steps(tmp_path) -> None:
    tmp = str(tmp_path)
    run_cadence(tmp, range(1, 4), local_every=1, root_every=2, background="process")
    assert os.listdir(os.path.join(tmp, "root")) == [step_name(2)]
    assert extra(step_dir(os.path.join(tmp, "tier"), 3))["tier"] == LOCAL_ONLY
    step, out = restore(tmp)
    assert step == 3 and equal(out, state(3.0))


# -- several nodes (gloo ranks, a local tier each) --------------------------------------
NODES = 3


def node_state(rank: int, v: float) -> dict[str, Any]:
    return {"w": torch.arange(50_000.0) * v, f"own{rank}": torch.full((20_000,), rank + v)}


def _nodes(rank: int, world: int, tmp: str, restore: bool) -> Any:
    tier = os.path.join(tmp, f"node{rank}")
    root = DataReads(LocalStore(os.path.join(tmp, "root")))
    with CheckpointManager(  # one run across both launches: the tier's copies are its own
        root,
        local_tier_dir=tier,
        local_every=5,
        root_every=10,
        background="thread",
        run_id="cadence",
    ) as mgr:
        if not restore:
            for s in (10, 15):
                mgr.save(s, node_state(rank, float(s)))
            mgr.wait()
            return [str(r.status) for r in mgr.records]
        out = node_state(rank, 0.0)
        step = mgr.restore(out)
    assert step is not None and equal(out, node_state(rank, float(step)))
    return step, sorted(root.read)


def wipe(tmp: str, *nodes: int) -> None:
    for node in nodes:
        shutil.rmtree(os.path.join(tmp, f"node{node}"))


@pytest.mark.distributed
def test_a_replaced_node_0_restores_a_local_only_step_from_its_peers(tmp_path) -> None:
    tmp = str(tmp_path)
    assert run_distributed(_nodes, NODES, tmp, False) == [["committed"] * 2] * NODES
    for node in range(NODES):  # every node can open step 15: its small objects are there
        assert os.path.exists(
            os.path.join(step_dir(os.path.join(tmp, f"node{node}"), 15), MARKER_NAME)
        )
    assert not os.path.exists(os.path.join(tmp, "root", step_name(15)))
    wipe(tmp, 0)  # the coordinator's node replaced
    results = run_distributed(_nodes, NODES, tmp, True)
    assert results == [(15, [])] * NODES  # nothing read from the root


@pytest.mark.distributed
def test_two_adjacent_nodes_lost_the_restore_falls_back_to_the_roots_step(tmp_path) -> None:
    tmp = str(tmp_path)
    run_distributed(_nodes, NODES, tmp, False)
    wipe(tmp, 1, 2)  # node 1's shards of step 15 were on nodes 1 and 2 only
    results = run_distributed(_nodes, NODES, tmp, True)
    assert [step for step, _ in results] == [10] * NODES


def test_finalize_saves_to_the_root_whatever_the_cadences_say(tmp_path) -> None:
    tmp = str(tmp_path)
    with CheckpointManager(
        os.path.join(tmp, "root"),
        local_tier_dir=os.path.join(tmp, "tier"),
        local_every=1,
        root_every=10,
        background="thread",
    ) as mgr:
        mgr.save(3, state(3.0))
        assert mgr.finalize(4, state(4.0))
        assert [r.tier for r in mgr.records] == ["local", "root"]
    assert os.listdir(os.path.join(tmp, "root")) == [step_name(4)]


def test_another_jobs_steps_in_the_local_tier_are_never_deleted(tmp_path, caplog) -> None:
    tmp = str(tmp_path)
    tier = os.path.join(tmp, "tier")
    for run, steps in (("run-a", range(1, 3)), ("run-b", range(3, 5))):
        with CheckpointManager(
            os.path.join(tmp, run),
            local_tier_dir=tier,
            run_id=run,
            local_every=1,
            background="thread",
        ) as mgr:
            for s in steps:
                mgr.save(s, state(float(s)))
                mgr.wait()
    a = job_dir(tier, str(tmp_path / "run-a"), "run-a")
    b = job_dir(tier, str(tmp_path / "run-b"), "run-b")
    # run-b trimmed its own step 3, never run-a's step 2 (nor the older layout's step 0)
    assert sorted(os.listdir(a)) == [JOB_STAMP, step_name(2)]
    assert sorted(os.listdir(b)) == [JOB_STAMP, step_name(4)]
    os.makedirs(os.path.join(tier, step_name(0)))
    caplog.set_level("INFO", logger="ckptstore")
    with CheckpointManager(
        os.path.join(tmp, "run-b"),
        local_tier_dir=tier,
        run_id="run-b",
        local_every=1,
        background="thread",
    ) as mgr:
        mgr.save(5, state(5.0))
    assert sorted(os.listdir(b)) == [JOB_STAMP, step_name(5)]
    assert sorted(os.listdir(a)) == [JOB_STAMP, step_name(2)]
    assert os.path.isdir(os.path.join(tier, step_name(0)))
    # the first save's trim said, once, what else the tier holds and whose it is
    assert f"also holds 1 other jobs' copies (run run-a of root {tmp_path / 'run-a'}" in caplog.text
    assert "1 step directories of an older ckptstore's layout (step_000000000" in caplog.text
