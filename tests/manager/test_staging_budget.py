"""Staging and its host-memory budget (``max_staging_bytes``): the thread backend's arena,
and the process backend's shared memory in rounds."""

import json

import pytest
import torch

from ckptstore.engine.catalog import step_name
from ckptstore.errors import ConfigError, WriterProcessDiedError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.saving.host_arena import ArenaStager
from ckptstore.manager.saving.shared_stager import SharedStager
from ckptstore.manager.saving.thread_backend import ThreadBackend
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


@pytest.mark.parametrize("staging", [False, True], ids=["direct", "local_tier_dir"])
def test_a_state_larger_than_the_budget_saves_and_restores_bitwise(tmp_path, staging) -> None:
    budget = 20 * KIB  # the state holds ~42 KiB of tensors: about half stays live
    kwargs = {"local_tier_dir": str(tmp_path / "nvme")} if staging else {}
    with CheckpointManager(
        str(tmp_path / "root"), max_staging_bytes=budget, background="thread", **kwargs
    ) as mgr:
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
    with CheckpointManager(str(tmp_path), background="thread") as mgr:
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


def test_what_training_changes_after_staging_is_not_in_the_staged_state() -> None:
    """The values around the tensors are copied (``prepare`` deep-copies the state with a
    hole for each tensor; the holes themselves are shared, never changed)."""
    groups = [{"lr": 0.1, "params": ["w"]}]
    moments = {"step": torch.tensor(3.0), "m": torch.ones(4)}
    state = {"param_groups": groups, "state": {"w": moments}}
    stager = ArenaStager()
    first = stager.stage(state)
    assert first is not None
    groups[0]["lr"] = 0.5
    groups[0]["params"].append("v")
    state["state"]["w"]["m"].fill_(7)
    assert first.state["param_groups"] == [{"lr": 0.1, "params": ["w"]}]
    assert torch.equal(first.state["state"]["w"]["m"], torch.ones(4))
    second = stager.stage(state)
    assert second is not None and second.state["param_groups"][0]["lr"] == 0.5
    assert torch.equal(second.state["state"]["w"]["m"], torch.full((4,), 7.0))
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


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1GiB"])
def test_bad_budgets_are_config_errors_in_process_mode(tmp_path, bad) -> None:
    """Refused before any writer process starts."""
    with pytest.raises(ConfigError, match="max_staging_bytes must be a positive number"):
        CheckpointManager(str(tmp_path), max_staging_bytes=bad, background="process")


def _two_ranks_over_budget(rank: int, world: int, root: str, background: str) -> bool:
    # thread: the 12 and 16 KiB tensors stay live; process: 3 rounds (each tensor must fit)
    budget = 12 * KIB if background == "thread" else 20 * KIB
    with CheckpointManager(root, max_staging_bytes=budget, background=background) as mgr:
        state = make_state(10, tag=f"r{rank}.")
        want = make_state(10, tag=f"r{rank}.")
        assert mgr.save(5, state)
        scribble(state)
        mgr.wait()
        if background == "thread":
            assert stager_of(mgr).peak_in_use <= budget
        else:
            assert mgr._shared is not None
            assert 0 < mgr._shared.peak_in_use <= budget
            assert 0 < mgr._shared.peak_resident <= budget
        out = zeros_like(want)
        assert mgr.restore(out) == 5
        assert_same(out, want)
    return True


@pytest.mark.distributed
@pytest.mark.slow  # two spawned ranks: seconds alone, over a minute on a loaded machine
@pytest.mark.parametrize("background", ["thread", "process"])
def test_two_ranks_over_the_budget_save_and_restore_bitwise(tmp_path, background) -> None:
    assert run_distributed(_two_ranks_over_budget, 2, str(tmp_path), background) == [True] * 2


# -- background="process": the shared-memory staging in rounds -----------------------------
def rounds_state(seed: int) -> dict:
    """~86 KiB in 6 tensors of 4-24 KiB, an int tensor and non-tensor values."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {f"w{i}": torch.randn(1024 * (i + 1), generator=g) for i in range(6)},
        "ints": torch.arange(300, dtype=torch.int64) * seed,
        "meta": {"epoch": seed, "names": ["a", "b"]},
    }


def test_the_shared_stager_holds_one_round_of_at_most_its_budget() -> None:
    """Counted from the layout and by the kernel (the memfd's allocated blocks)."""
    state = rounds_state(1)
    tensors = [*state["model"].values(), state["ints"]]
    budget = 32 * KIB
    stager = SharedStager(budget=budget)
    staged = stager.stage(state)
    try:
        assert staged.rounds == 4  # 86 KiB in rounds of at most 32 KiB
        assert stager.arena is not None and staged.arena_size <= budget  # one segment for all
        for round in range(staged.rounds):
            if round:
                stager.stage_round(round)
            assert 0 < stager.in_use <= budget and stager.arena.resident() <= budget
            here = [i for i, s in enumerate(staged.slots) if s.round == round]
            assert here
            for i in here:
                assert torch.equal(stager.views[i], tensors[i])
        assert stager.peak_in_use <= budget and 0 < stager.peak_resident <= budget
        stager.release()
        with pytest.raises(ValueError, match="without a state of several rounds"):
            stager.stage_round(1)  # training's tensors are no longer held
        assert stager.stage(state).rounds == 4 and stager.allocations == 1
    finally:
        stager.close()


def test_a_tensor_larger_than_the_process_budget_is_a_config_error() -> None:
    stager = SharedStager(budget=8 * KIB)
    with pytest.raises(ConfigError, match="larger than max_staging_bytes.*background='thread'"):
        stager.stage({"big": torch.ones(4096), "small": torch.ones(4)})  # 16 KiB > 8 KiB
    stager.close()


@pytest.mark.parametrize("staging", [False, True], ids=["direct", "local_tier_dir"])
@pytest.mark.processes
def test_process_mode_over_the_budget_saves_in_rounds_and_restores_bitwise(
    tmp_path, staging
) -> None:
    budget = 32 * KIB  # the state holds ~86 KiB of tensors: written in 4 rounds
    kwargs = {"local_tier_dir": str(tmp_path / "nvme")} if staging else {}
    root = tmp_path / "root"
    with CheckpointManager(
        str(root), max_staging_bytes=budget, background="process", strict=True, **kwargs
    ) as mgr:
        for step in (1, 2):  # the second save reuses the first one's arena
            state = rounds_state(step)
            want = rounds_state(step)
            assert mgr.save(step, state)
            scribble(state)  # no round may see this, staged or still to stage
            mgr.wait()
            record = mgr.records[-1]
            assert record.status == "committed"
            assert record.bytes == sum(v.nbytes for v in want["model"].values()) + 300 * 8
            with open(root / step_name(step) / "ckptstore.manifest.json") as f:
                manifest = json.load(f)
            # training waited for the rounds: blocking time, in the record and the manifest
            assert manifest["extra"]["timings"]["blocking_s"] == record.blocking_s
            assert record.blocking_s > record.staging_s
            shards = [name for name in manifest["files"] if name.endswith(".distcp")]
            assert len(shards) == 4  # one shard file per round
            shared = mgr._shared
            assert shared is not None and shared.arena is not None
            assert 0 < shared.peak_in_use <= budget and 0 < shared.peak_resident <= budget
            out = zeros_like(want)
            assert mgr.restore(out, step=step) == step
            assert_same(out, want)
        assert shared.allocations == 1


@pytest.mark.processes
def test_a_writer_killed_between_rounds_commits_nothing(tmp_path, monkeypatch) -> None:
    """SIGKILL after the first round's file: the save fails, training is let go, the step
    is not committed; the next save starts a new writer and commits (restores of rounds
    are checked above)."""
    monkeypatch.setenv("CKPTSTORE_CRASH_AT", "after_shards:1")  # the writer inherits it
    root = tmp_path / "root"
    mgr = CheckpointManager(str(root), max_staging_bytes=32 * KIB, background="process")
    try:
        state = rounds_state(1)
        assert mgr.save(1, state)  # returns: the dead writer releases training too
        with pytest.raises(WriterProcessDiedError, match="SIGKILL.*step 1 was not committed"):
            mgr.wait()  # the manager's first save: raised, not a warning
        assert mgr.records[-1].status == "failed"
        assert mgr.steps() == []
        assert not (root / step_name(1) / "COMMITTED").exists()
        monkeypatch.delenv("CKPTSTORE_CRASH_AT")  # the next writer must not crash
        assert mgr.save(2, rounds_state(2))
        mgr.wait()
        assert mgr.records[-1].status == "committed" and mgr.steps() == [2]
    finally:
        mgr.close()
