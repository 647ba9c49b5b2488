"""Under ``--rdzv-backend ckptstore-c10d`` a script's own ``dist.init_process_group``
survives torchrun's restarts, with no ckptstore call in it.

Under stock c10d every attempt of the worker group meets in the rank-0 agent's one store
under the same keys, and a restarted gloo group can read the dead attempt's addresses
("Gloo connectFullMesh failed", or a hang): 5 of 8 single-node runs with two restarts
each failed so. ``ckptstore-c10d`` starts that store afresh every round, so each attempt
meets in an empty one. Each run here kills one rank (a different one every attempt) just
after a collective, leaving its gloo address in the store, on every attempt but the last;
the last attempt's all_reduce must be right on every rank.
"""

from __future__ import annotations

import os

import pytest

from harness.nodes import NodeJob

pytestmark = [pytest.mark.distributed, pytest.mark.processes, pytest.mark.slow]

RUNS, RESTARTS, WORLD = 3, 4, 2  # 12 restarts: stock c10d survives all of them ~0.3% of times

SCRIPT = """
import os, sys
import torch, torch.distributed as dist

attempt, last, out = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
if attempt < last and rank == attempt % world:
    os._exit(9)  # dies as a crashed worker does, its peers mid-collective
dist.barrier()
with open(os.path.join(out, f"attempt{attempt}.rank{rank}"), "w") as f:
    f.write(str(t.tolist()))
dist.destroy_process_group()
"""


def test_plain_init_process_group_survives_every_restart(tmp_path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(SCRIPT)
    want = [float(WORLD * (WORLD + 1) // 2)] * 4
    for run in range(RUNS):
        d = tmp_path / f"run{run}"
        (d / "done").mkdir(parents=True)
        job = NodeJob(
            str(script), [str(RESTARTS), str(d / "done")], run_dir=str(d), nnodes=1,
            nproc_per_node=WORLD, max_restarts=RESTARTS, timeout_s=90,
        )  # fmt: skip
        with job:
            job.start()
            job.wait()  # NodeError with the agent's output if it failed or hung
        done = {name: (d / "done" / name).read_text() for name in os.listdir(d / "done")}
        assert done == {f"attempt{RESTARTS}.rank{r}": str(want) for r in range(WORLD)}, (
            f"run {run}: {done}\n{job.tails()}"
        )
