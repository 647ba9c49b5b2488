"""A save that one rank cannot take raises on every rank at once (issue 17's trust gap).

Before, a rank that could not stage its state (in process mode a tensor larger than
``max_staging_bytes``; a staging arena it could not allocate) raised from ``save`` alone,
and the other ranks went on into the save's collectives and hung there until the group
timeout. Now whatever can refuse a state is found before the save's one agreement and
carried by it (the arena is allocated before it); what only a writer process can find (a
value it cannot unpickle) fails inside DCP's planning step, which every rank enters. Real
gloo groups: only rank 1 holds the state that cannot be saved.
"""

import contextlib
import os
import resource
import sys
import threading
import types
from collections.abc import Iterator

import pytest
import torch

from ckptstore.engine.catalog import step_name
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.errors import ConfigError, StagingMemoryError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.saving.host_arena import ArenaStager
from ckptstore.manager.saving.shared_stager import SharedStager
from harness.dist import run_distributed

KIB = 1024


def _steps_on_disk(root: str) -> list[str]:
    return (
        sorted(n for n in os.listdir(root) if n.startswith("step_")) if os.path.isdir(root) else []
    )


def _outcome(fn) -> tuple[str, str]:
    """(the exception's class name, its message and notes) of ``fn()``, or ("", "")."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test compares what each rank raised
        return type(exc).__name__, "\n".join([str(exc), *getattr(exc, "__notes__", [])])
    return "", ""


def _ephemeral_value() -> object:
    """An object of a class the training process can pickle and a writer process cannot
    unpickle (its module exists only here)."""
    mod = sys.modules.setdefault(
        "ckptstore_test_ephemeral", types.ModuleType("ckptstore_test_ephemeral")
    )
    if not hasattr(mod, "Box"):
        box = type("Box", (), {"__module__": mod.__name__})
        mod.Box = box  # type: ignore[attr-defined]
    return mod.Box()  # type: ignore[attr-defined]


def _process_mode_refusals(rank: int, world: int, root: str) -> dict:
    budget = 64 * KIB
    out: dict = {}
    with CheckpointManager(
        root, max_staging_bytes=budget, background="process", strict=True
    ) as mgr:
        # 1. Only rank 1 holds a tensor larger than the budget (128 KiB > 64 KiB).
        big = (
            {"w": torch.ones(256), "big": torch.ones(32 * KIB)}
            if rank == 1
            else {"w": torch.ones(256)}
        )
        out["oversize"] = _outcome(lambda: mgr.save(1, big))
        out["after_oversize"] = _steps_on_disk(root)
        # 2. Only rank 1's writer cannot rebuild the state (found in the writer process):
        #    save() returns on both, the save fails on both inside DCP's planning step.
        odd = {"w": torch.full((256,), 2.0), "meta": _ephemeral_value() if rank == 1 else 0}
        out["unpicklable_saved"] = mgr.save(2, odd)
        out["unpicklable"] = _outcome(mgr.wait)
        out["marker_2"] = os.path.exists(os.path.join(root, step_name(2), MARKER_NAME))
        # 3. The state fixed (the large tensor split into tensors that fit): saves and restores.
        fixed = {"w": torch.full((256,), 3.0)}
        if rank == 1:
            fixed.update({f"big{i}": torch.full((8 * KIB,), float(i)) for i in range(4)})
        _save_and_restore(mgr, 3, fixed, out)
    return out


def _save_and_restore(mgr: CheckpointManager, step: int, state: dict, out: dict) -> None:
    """Save ``state`` as ``step`` and restore it: into ``out``, what came back and how."""
    assert mgr.save(step, state)
    mgr.wait()
    back = {k: torch.zeros_like(v) for k, v in state.items()}
    out["restored"] = mgr.restore(back)
    out["bitwise"] = all(torch.equal(back[k], state[k]) for k in state)
    out["steps"] = mgr.steps()
    out["statuses"] = [r.status for r in mgr.records]


@pytest.mark.distributed
@pytest.mark.slow  # two ranks with writer processes: seconds alone, a minute under load
def test_a_state_one_rank_cannot_stage_raises_on_every_rank_and_the_next_save_works(
    tmp_path,
) -> None:
    root = str(tmp_path / "root")
    results = run_distributed(_process_mode_refusals, 2, root, timeout=240)
    for rank, r in enumerate(results):
        name, message = r["oversize"]
        assert name == "ConfigError", (rank, r["oversize"])
        assert "larger than max_staging_bytes=65536" in message, (rank, message)
        assert "the save of step 1 was not started on any rank" in message, (rank, message)
        if rank == 0:
            assert "(rank 1)" in message, message  # the other rank names the one that refused
        assert r["after_oversize"] == []  # nothing was written: no step directory at all
        assert r["unpicklable_saved"] is True
        name, message = r["unpicklable"]
        assert name == "ConfigError", (rank, r["unpicklable"])
        assert "cannot unpickle" in message and "(rank 1)" in message, (rank, message)
        assert r["marker_2"] is False
        assert r["restored"] == 3 and r["bitwise"] and r["steps"] == [3]
        assert r["statuses"] == ["failed", "committed"]


class _Flaky:
    """A Stateful whose state_dict() raises on rank 1 until it is fixed."""

    def __init__(self, rank: int) -> None:
        self.rank, self.broken = rank, True
        self.w = torch.arange(16.0)

    def state_dict(self) -> dict:
        if self.broken and self.rank == 1:
            raise RuntimeError("rank 1's model is not ready")
        return {"w": self.w}

    def load_state_dict(self, sd: dict) -> None:
        self.w.copy_(sd["w"])


def _thread_mode_refusal(rank: int, world: int, root: str) -> dict:
    with CheckpointManager(root) as mgr:
        app = _Flaky(rank)
        out = {"refused": _outcome(lambda: mgr.save(1, {"app": app}))}
        out["after"] = _steps_on_disk(root)
        app.broken = False
        out["saved"] = mgr.save(2, {"app": app})
        mgr.wait()
        out["steps"] = mgr.steps()
    return out


@pytest.mark.distributed
def test_a_stateful_that_raises_on_one_rank_fails_the_save_on_every_rank(tmp_path) -> None:
    root = str(tmp_path / "root")
    r0, r1 = run_distributed(_thread_mode_refusal, 2, root)
    assert r1["refused"][0] == "RuntimeError" and "not ready" in r1["refused"][1]
    assert r0["refused"][0] == "CkptStoreError"
    assert "RuntimeError: rank 1's model is not ready (rank 1)" in r0["refused"][1]
    for r in (r0, r1):
        assert "the save of step 1 was not started on any rank" in r["refused"][1]
        assert r["after"] == [] and r["saved"] is True and r["steps"] == [2]


@contextlib.contextmanager
def _address_space_capped(cap: bool = True) -> Iterator[None]:
    """With ``cap``: this process's address space limited (RLIMIT_AS, a real kernel limit)
    to 32 MiB beyond what it maps now, so a 64 MiB allocation fails; lifted on exit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if cap:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * KIB for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + 32 * KIB * KIB, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _arena_refusal(rank: int, world: int, root: str, background: str) -> dict:
    """Rank 1's address space is capped (RLIMIT_AS, a real kernel limit) below what the
    bigger state's arena needs; the mmap that allocates it fails there alone."""
    out: dict = {}
    with CheckpointManager(root, background=background) as mgr:
        small = {"w": torch.arange(256.0)}
        assert mgr.save(1, small)
        mgr.wait()
        big = {"w": torch.arange(256.0), "big": torch.full((16 * KIB * KIB,), 3.0)}
        with _address_space_capped(rank == 1):  # 64 MiB of arena wanted, 32 MiB left
            out["refused"] = _outcome(lambda: mgr.save(2, big))
        out["marker_2"] = os.path.exists(os.path.join(root, step_name(2), MARKER_NAME))
        out["after"] = _steps_on_disk(root)
        _save_and_restore(mgr, 3, big, out)  # the limit lifted: the same state saves
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("background", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_an_arena_one_rank_cannot_allocate_fails_the_save_on_every_rank(
    tmp_path, background
) -> None:
    root = str(tmp_path / "root")
    results = run_distributed(_arena_refusal, 2, root, background, timeout=240)
    for rank, r in enumerate(results):
        name, message = r["refused"]
        assert name == "StagingMemoryError", (rank, r["refused"])
        assert "could not allocate 67109888 bytes of host memory" in message, (rank, message)
        assert "max_staging_bytes" in message, (rank, message)  # what to do
        assert "the save of step 2 was not started on any rank" in message, (rank, message)
        assert ("(rank 1)" if rank == 0 else "(this is rank 1)") in message, message
        assert r["marker_2"] is False and r["after"] == [step_name(1)]  # nothing of step 2
        assert r["restored"] == 3 and r["bitwise"] and r["steps"] == [1, 3]
        assert r["statuses"] == ["committed", "committed"]


def _sharded(value: float, numel: int) -> object:
    """A DTensor of ``numel`` elements per rank (its local shard; nothing else allocated)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (2,))
    return DTensor.from_local(torch.full((numel,), value), mesh, [Shard(0)])


def _sharded_copy_refusal(rank: int, world: int, root: str) -> dict:
    """DCP's DefaultStager copies a sharded state at every save, after the save's agreement:
    rank 1's failed copy (RLIMIT_AS again) fails that save inside DCP, on every rank."""
    out: dict = {}
    with CheckpointManager(root, strict=True) as mgr:
        assert mgr.save(1, {"d": _sharded(1.0, 256)})
        mgr.wait()
        big = {"d": _sharded(3.0, 16 * KIB * KIB)}  # 64 MiB per rank
        with _address_space_capped(rank == 1):
            out["saved"] = mgr.save(2, big)
        out["failed"] = _outcome(mgr.wait)
        out["marker_2"] = os.path.exists(os.path.join(root, step_name(2), MARKER_NAME))
        assert mgr.save(3, big)
        mgr.wait()
        back = {"d": _sharded(0.0, 16 * KIB * KIB)}
        out["restored"] = mgr.restore(back)
        out["bitwise"] = torch.equal(back["d"].to_local(), big["d"].to_local())
        out["steps"] = mgr.steps()
        out["statuses"] = [r.status for r in mgr.records]
    return out


@pytest.mark.distributed
def test_a_sharded_state_one_rank_cannot_copy_fails_the_save_on_every_rank(tmp_path) -> None:
    root = str(tmp_path / "root")
    results = run_distributed(_sharded_copy_refusal, 2, root, timeout=240)
    for rank, r in enumerate(results):
        assert r["saved"] is True  # found after the agreement: the save itself fails
        name, message = r["failed"]
        assert name == "StagingMemoryError", (rank, r["failed"])
        assert "could not allocate 67108864 bytes of host memory" in message, (rank, message)
        assert "(rank 1)" in message, (rank, message)  # on rank 1 too: DCP gathered it
        assert r["marker_2"] is False
        assert r["restored"] == 3 and r["bitwise"] and r["steps"] == [1, 3]
        assert r["statuses"] == ["committed", "failed", "committed"]


# -- the checks themselves, one process ------------------------------------------------
def test_prepare_refuses_without_touching_the_arena() -> None:
    """A refused state leaves the stager as it was (a save may be reading the arena)."""
    stager = SharedStager(budget=64 * KIB)
    try:
        staged = stager.stage({"w": torch.ones(1024)})
        arena, views = stager.arena, list(stager.views)
        with pytest.raises(ConfigError, match="larger than max_staging_bytes"):
            stager.prepare({"w": torch.ones(1024), "big": torch.ones(32 * KIB)})
        with pytest.raises(ConfigError, match="cannot be pickled.*background='thread'"):
            stager.prepare({"w": torch.ones(1024), "lock": threading.Lock()})
        assert stager.arena is arena and stager.allocations == 1
        assert all(a is b for a, b in zip(stager.views, views, strict=True))
        assert stager.stage(stager.prepare({"w": torch.ones(1024)})).slots == staged.slots
    finally:
        stager.close()


def test_the_thread_stager_refuses_a_value_it_cannot_copy() -> None:
    stager = ArenaStager()
    with pytest.raises(ConfigError, match="cannot be copied"):
        stager.prepare({"w": torch.ones(8), "gen": (i for i in range(3))})
    assert stager.arena is None  # nothing was allocated
    stager.close()


@pytest.mark.parametrize("stager_cls", [ArenaStager, SharedStager])
def test_a_failed_arena_allocation_leaves_a_stager_that_allocates_next_time(
    stager_cls,
) -> None:
    """The old arena is freed before the larger one is made; when that fails the stager
    holds none and lays out again at the next call (nothing half set up)."""
    stager = stager_cls()
    try:
        stager.stage({"w": torch.ones(1024)})
        big = {"w": torch.ones(1024), "big": torch.ones(16 * KIB * KIB)}
        with _address_space_capped():
            with pytest.raises(StagingMemoryError, match="could not allocate 671129.. bytes"):
                stager.reserve(stager.prepare(big))
        assert stager.arena is None and stager.allocations == 1
        stager.stage(stager.prepare(big))
        assert stager.allocations == 2 and stager.arena is not None
    finally:
        stager.close()


@pytest.mark.processes
def test_one_process_raises_the_refusal_itself(tmp_path) -> None:
    with CheckpointManager(str(tmp_path), max_staging_bytes=KIB, background="process") as mgr:
        with pytest.raises(ConfigError, match="larger than max_staging_bytes") as caught:
            mgr.save(1, {"big": torch.ones(1024)})
        assert "the save of step 1 was not started on any rank" in caught.value.__notes__
        assert _steps_on_disk(str(tmp_path)) == []
        assert mgr.save(2, {"small": torch.ones(16)})
    assert _steps_on_disk(str(tmp_path)) == [step_name(2)]
