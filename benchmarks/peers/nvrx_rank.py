"""One rank of benchmarks.peers.nvrx_local: a save or a restore with one contender, timed.

    python -m benchmarks.peers.nvrx_rank SPEC.json OUT.json      (RANK, WORLD_SIZE, ... set)

Each rank is a simulated node (its own local directory). ``nvrx``: nvidia-resiliency-ext
0.4.1's ``LocalCheckpointManager`` with a ``CliqueReplicationStrategy`` (factor 2) through
the CPU adapter below; ``ckptstore``: ``CheckpointManager(root, local_tier_dir, replicas=1)``.

The adapter, and why (file:line in nvidia_resiliency_ext/checkpointing/local/, 0.4.1): the
library is written for CUDA tensors. ``BasicTensorAwareStateDict`` asserts ``is_cuda`` on
every tensor (basic_state_dict.py:89) and moves them back with ``.to("cuda")`` after a load
(:185, called by ckpt_managers/base_manager.py:141); a peer's send does ``ten.cuda()``
(replication/group_utils.py:394) and a receive into a CPU tensor goes through a CUDA buffer
(:444). ``CpuStateDict`` and ``CpuGroup`` are those classes with the device hops removed
and nothing else changed; the save, the replication (all_gather of every rank's tensors) and
the plan of a restore are the library's own code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["expected_state", "main"]

STEP = 5
SESSION = "bench"


def expected_state(rank: int, size_mib: int, tensors: int = 4) -> dict[str, torch.Tensor]:
    """Half replicated (the same on every rank: ``rep.t<i>``), half the rank's own
    (``own<rank>.t<i>``); float32 noise, seeded, so a restore is checked bitwise."""
    numel = size_mib * 2**20 // 4 // (2 * tensors)
    rep = torch.Generator().manual_seed(7)
    own = torch.Generator().manual_seed(1000 + rank)
    out = {f"rep.t{i}": torch.randn(numel, generator=rep) for i in range(tensors)}
    out.update({f"own{rank}.t{i}": torch.randn(numel, generator=own) for i in range(tensors)})
    return out


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """barrier -> fn -> barrier: (this rank's time in fn, the span to the last barrier, result)."""
    dist.barrier()
    t0 = time.perf_counter()
    result = fn()
    own = time.perf_counter() - t0
    dist.barrier()
    return own, time.perf_counter() - t0, result


def _same(got: dict[str, Any], want: dict[str, torch.Tensor]) -> bool:
    return set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


# -- nvidia-resiliency-ext ------------------------------------------------------------------

from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import (  # noqa: E402
    BasicTensorAwareStateDict,
)
from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import (  # noqa: E402
    LocalCheckpointManager,
)
from nvidia_resiliency_ext.checkpointing.local.replication.group_utils import (  # noqa: E402
    GroupWrapper,
    parse_group_sequence,
)
from nvidia_resiliency_ext.checkpointing.local.replication.strategies import (  # noqa: E402
    CliqueReplicationStrategy,
)


class CpuStateDict(BasicTensorAwareStateDict):  # type: ignore[misc]
    """``BasicTensorAwareStateDict`` for CPU tensors: no ``is_cuda`` check, no move back."""

    def __init__(self, state_dict: dict[str, Any]) -> None:
        self.state_dict = state_dict
        self._is_hollow = False

    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        """The tensors were CPU tensors when saved: they stay there."""


class CpuGroup(GroupWrapper):  # type: ignore[misc]
    """``GroupWrapper`` whose point-to-point state-dict send and receive stay on the CPU
    (the library's code, group_utils.py:378-450, minus ``.cuda()`` and the CUDA buffer)."""

    def isend_state_dict(self, state_dict: Any, dst: int) -> dict[str, float]:
        tensor_data = state_dict.pop_tensors()
        log_data = {"data_sent": sum(ten.nbytes for ten in tensor_data)}
        self.send_object(state_dict, dst)
        for ten in tensor_data:
            dist.send(ten, dst, group=self.group)
        state_dict.insert_tensors(tensor_data)
        return log_data

    def irecv_state_dict(self, src: int) -> tuple[Any, dict[str, float]]:
        hollow = self.recv_object(src)
        hollow.init_tensors()
        for ten in hollow.tensors:
            dist.recv(ten, src, group=self.group)
        return hollow, {"data_recv": sum(ten.nbytes for ten in hollow.tensors)}


def nvrx_manager(tier: str, factor: int = 2) -> LocalCheckpointManager:
    """``CliqueReplicationStrategy.from_replication_params(1, factor)`` (whose default jump,
    ``torch.cuda.device_count()``, is 0 here: strategies.py:193) with a ``CpuGroup``."""
    world = dist.get_world_size()
    groups = [dist.new_group(g) for g in parse_group_sequence(1, factor, world)]
    mine = GroupWrapper.from_list_of_groups(groups).group
    strategy = CliqueReplicationStrategy(CpuGroup(mine), target_device="cpu")
    return LocalCheckpointManager(tier, session_id=SESSION, repl_strategy=strategy)


def nvrx_phase(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    mgr = nvrx_manager(os.path.join(spec["work"], f"node{rank}"))
    want = expected_state(rank, spec["size_mib"])
    if spec["phase"] == "save":
        state = CpuStateDict(expected_state(rank, spec["size_mib"]))
        own, span, _ = _timed(lambda: mgr.save(state, STEP, is_async=False))
        return {"own_s": own, "span_s": span}

    def restore() -> Any:
        assert mgr.find_latest() == STEP
        return mgr.load()[0]

    own, span, got = _timed(restore)
    return {"own_s": own, "span_s": span, "bitwise": _same(got.state_dict, want), "root_bytes": 0}


# -- ckptstore ------------------------------------------------------------------------------


def ckptstore_phase(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    from ckptstore.engine.store import Store
    from ckptstore.manager import CheckpointManager
    from ckptstore.stores.local import LocalStore
    from ckptstore.testing.faults import FaultyStore

    class Reads(FaultyStore):
        """Passes every call through; counts the bytes read (shared with its children)."""

        def __init__(self, inner: Store, count: dict[str, int]) -> None:
            super().__init__(inner)
            self.count = count

        def child(self, prefix: str) -> Reads:
            return Reads(self.inner.child(prefix), self.count)

        def _add(self, path: str, n: int) -> None:
            self.count["all"] += n
            self.count["data"] += n if path.endswith(".distcp") else 0

        def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
            out = super().get(path, start, end)
            self._add(path, len(out))
            return out

        def get_into(self, path: str, start: int, buf: memoryview) -> int:
            n = super().get_into(path, start, buf)
            self._add(path, n)
            return n

    count = {"all": 0, "data": 0}
    root = Reads(LocalStore(os.path.join(spec["work"], "root")), count)
    tier = os.path.join(spec["work"], f"node{rank}")
    want = expected_state(rank, spec["size_mib"])
    with CheckpointManager(root, local_tier_dir=tier, replicas=1) as mgr:
        if spec["phase"] == "save":
            state = expected_state(rank, spec["size_mib"])

            def save() -> None:
                mgr.save(STEP, state)
                mgr.wait()  # the bucket write, the local tier and the replication

            own, span, _ = _timed(save)
            record = mgr.records[-1]
            assert record.status == "committed" and not record.warnings, record
            return {"own_s": own, "span_s": span, "blocking_s": record.blocking_s}
        out = {k: torch.zeros_like(v) for k, v in want.items()}
        own, span, step = _timed(lambda: mgr.restore(out))
    assert step == STEP, step
    return {
        "own_s": own,
        "span_s": span,
        "bitwise": _same(out, want),
        "root_bytes": count["all"],
        "root_data_bytes": count["data"],
    }


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    phase = nvrx_phase if spec["contender"] == "nvrx" else ckptstore_phase
    try:
        result = {"rank": rank, **phase(spec, rank)}
    except Exception as e:
        result = {"rank": rank, "error": f"{type(e).__name__}: {e}"}
        raise
    finally:
        with open(sys.argv[2], "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
