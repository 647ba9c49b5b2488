"""The thread backend's staging arena and its host-memory budget (``max_staging_bytes``)."""

import json

import pytest
import torch

from ckptstore.engine.catalog import step_name
from ckptstore.errors import ConfigError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.backend import ThreadBackend
from ckptstore.manager.staging import ArenaStager
from harness.dist import run_distributed

KIB = 1024


def make_state(seed: int, tag: str = "") -> dict:
    """~42 KiB of tensors; ``tag`` names (and seeds) this rank's model tensors apart from
    other ranks'; ``ints`` and ``meta`` are the same on every rank (replicated)."""
    g = torch.Generator().manual_seed(seed * 1000 + len(tag) + sum(map(ord, tag)))
    return {
        "model": {f"{tag}w{i}": torch.randn(1024 * (i + 1), generator=g) for i in range(4)},
        "ints": torch.arange(300, dtype=torch.int64) * seed,
        "meta": {"epoch": seed, "names": ["a", "b"]},
    }


def zeros_like(state: dict) -> dict:
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "ints": torch.zeros_like(state["ints"]),
        "meta": {"epoch": -1, "names": []},
    }


def scribble(state: dict) -> None:
    """What training does right after ``save`` returns: change every tensor in place."""
    for t in [*state["model"].values(), state["ints"]]:
        t.fill_(-7)
    state["meta"]["names"].append("changed")


def assert_same(got: dict, want: dict) -> None:
    for k, v in want["model"].items():
        assert torch.equal(got["model"][k], v), k
    assert torch.equal(got["ints"], want["ints"])
    assert got["meta"] == want["meta"]


def stager_of(mgr: CheckpointManager) -> ArenaStager:
    assert isinstance(mgr._backend, ThreadBackend)
    return mgr._backend.arena


@pytest.mark.parametrize("staging", [False, True], ids=["direct", "staging_dir"])
def test_a_state_larger_than_the_budget_saves_and_restores_bitwise(tmp_path, staging) -> None:
    budget = 20 * KIB  # the state holds ~42 KiB of tensors: about half stays live
    kwargs = {"staging_dir": str(tmp_path / "nvme")} if staging else {}
    with CheckpointManager(str(tmp_path / "root"), max_staging_bytes=budget, **kwargs) as mgr:
        for step in (1, 2):  # the second save reuses the first one's arena
            state = make_state(step)
            want = {
                "model": {k: v.clone() for k, v in state["model"].items()},
                "ints": state["ints"].clone(),
                "meta": {"epoch": step, "names": ["a", "b"]},
            }
            assert mgr.save(step, state)
            scribble(state)  # neither the staged nor the live part may see this
            mgr.wait()
            record = mgr.records[-1]
            assert record.status == "committed"
            assert record.bytes == sum(v.nbytes for v in want["model"].values()) + 300 * 8
            with open(tmp_path / "root" / step_name(step) / "ckptstore.manifest.json") as f:
                timings = json.load(f)["extra"]["timings"]
            # the wait for the live part is blocking time, in the record and the manifest
            assert timings["blocking_s"] == record.blocking_s > record.staging_s
            stager = stager_of(mgr)
            assert 0 < stager.peak_in_use <= budget
            assert stager.arena is not None and stager.arena.size <= budget
            out = zeros_like(want)
            assert mgr.restore(out, step=step) == step
            assert_same(out, want)
        assert stager_of(mgr).allocations == 1


def test_without_a_budget_the_whole_state_is_staged_into_one_reused_arena(tmp_path) -> None:
    with CheckpointManager(str(tmp_path)) as mgr:
        for step in (1, 2, 3):
            state = make_state(step)
            want = make_state(step)
            assert mgr.save(step, state)
            scribble(state)
            mgr.wait()
            out = zeros_like(want)
            assert mgr.restore(out, step=step) == step
            assert_same(out, want)
        stager = stager_of(mgr)
        assert stager.allocations == 1
        assert stager.peak_in_use >= sum(v.nbytes for v in want["model"].values())


def test_the_stager_never_holds_more_than_its_budget() -> None:
    state = {"a": torch.ones(1000), "b": torch.ones(10), "c": torch.ones(2000), "d": torch.ones(5)}
    stager = ArenaStager(budget=4096 + 128)  # "a" (4000 B) and the two small ones fit
    staged = stager.stage(state)
    assert staged is not None
    assert stager.in_use <= 4096 + 128 and stager.arena is not None
    assert stager.arena.size <= 4096 + 128
    assert [staged.is_live(staged.state[k]) for k in "abcd"] == [False, False, True, False]
    assert staged.live_bytes == 8000 and staged.nbytes == 4000 + 40 + 8000 + 20
    assert staged.state["c"] is state["c"]  # live: training's own tensor, not a copy
    assert torch.equal(staged.state["a"], state["a"]) and staged.state["a"] is not state["a"]
    # each staged tensor owns exactly its bytes: the writer saves it without cloning it
    for k in "abd":
        assert staged.state[k].untyped_storage().nbytes() == staged.state[k].nbytes
    tiny = ArenaStager(budget=1)  # nothing fits: everything is live, no arena at all
    all_live = tiny.stage(state)
    assert all_live is not None and all_live.live_bytes == all_live.nbytes
    assert tiny.arena is None and tiny.peak_in_use == 0
    stager.close()


def test_a_non_plain_tensor_goes_to_dcp_s_stager_or_stays_live_under_a_budget() -> None:
    state = {"dense": torch.ones(8), "sparse": torch.eye(4).to_sparse()}
    assert ArenaStager().stage(state) is None  # the thread backend uses DefaultStager then
    staged = ArenaStager(budget=1024).stage(state)
    assert staged is not None and staged.state["sparse"] is state["sparse"]
    assert not staged.is_live(staged.state["dense"])


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1GiB"])
def test_bad_budgets_are_config_errors(tmp_path, bad) -> None:
    with pytest.raises(ConfigError, match="max_staging_bytes must be a positive number"):
        CheckpointManager(str(tmp_path), max_staging_bytes=bad)


def test_a_budget_with_the_process_backend_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="background='thread' with a staging budget"):
        CheckpointManager(str(tmp_path), max_staging_bytes=1 << 20, background="process")


def _two_ranks_over_budget(rank: int, world: int, root: str) -> bool:
    with CheckpointManager(root, max_staging_bytes=12 * KIB) as mgr:
        state = make_state(10, tag=f"r{rank}.")
        want = make_state(10, tag=f"r{rank}.")
        assert mgr.save(5, state)
        scribble(state)
        mgr.wait()
        assert stager_of(mgr).peak_in_use <= 12 * KIB
        out = zeros_like(want)
        assert mgr.restore(out) == 5
        assert_same(out, want)
    return True


@pytest.mark.distributed
@pytest.mark.slow  # two spawned ranks: seconds alone, over a minute on a loaded machine
def test_two_ranks_over_the_budget_save_and_restore_bitwise(tmp_path) -> None:
    assert run_distributed(_two_ranks_over_budget, 2, str(tmp_path)) == [True, True]
