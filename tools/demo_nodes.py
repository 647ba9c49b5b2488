"""The demo's node scene: two simulated nodes, one replaced, its restore served by its peer.

Two torchrun agents (``harness.nodes``, ``--rdzv-backend ckptstore-c10d``), one worker each,
each node with a local tier of its own; every save's shards are copied to the other node
(the peer tier, ``replicas=1``). Once every node logged the commit of step 8 (logged after
its replication), node 1 — agent, worker and local disk — is replaced by a new agent. The
scene passes when the replacement joined, restored the same step as the survivor with its
files received from node 0 (nothing from the store when that step is step 8), and the job
ran to its last step.
"""

from __future__ import annotations

import os
import time

from harness.nodelog import restore_bytes, restores, tier
from harness.nodes import NodeJob

__all__ = ["node_scene"]

STEPS, EVERY = 24, 4
MODEL = ["--d-model", "64", "--layers", "2", "--heads", "2", "--ff", "128"]


def node_scene(script: str, data: str, root: str, global_batch: int) -> tuple[bool, list[str]]:
    """Run the scene in ``root/nodes`` on the dataset ``data``; (passed, report lines)."""
    d = os.path.join(root, "nodes")
    args = [
        "--data", data, "--root", os.path.join(d, "ckpt"), "--out", os.path.join(d, "out"),
        "--steps", str(STEPS), "--save-every", str(EVERY),
        "--global-batch", str(global_batch), *MODEL,
    ]  # fmt: skip
    with NodeJob(script, args, run_dir=d, nnodes=2, max_restarts=2, timeout_s=300) as nj:
        nj.start()
        nj.wait_until("both workers in their group", lambda: nj.joined(0) and nj.joined(1))
        nj.wait_commit(2 * EVERY)
        t_kill = time.monotonic()
        nj.replace_node(1)
        nj.wait_until("the replacement in the group", lambda: nj.joined(1))
        joined = time.monotonic() - t_kill
        nj.wait()
    (survivor,), (replaced,) = restores(nj, 0), restores(nj, 1)
    got, kept = restore_bytes(replaced), restore_bytes(survivor)
    same = survivor["restored"] == replaced["restored"]
    from_peer = tier(replaced) == "local" and got["peers"] > 0
    clean = got["remote"] == 0 or replaced["restored"] != 2 * EVERY
    finished = all(os.path.exists(os.path.join(d, "out", f"final.rank{r}.pt")) for r in (0, 1))
    ok = same and from_peer and clean and finished
    return ok, [
        "",
        "node replacement: 2 simulated nodes (a torchrun agent each, --rdzv-backend "
        f"ckptstore-c10d), a checkpoint every {EVERY} steps, each node's shards copied to the "
        f"other (the peer tier); node 1 (agent, worker, local disk) replaced after step "
        f"{2 * EVERY}'s commit; the new node was in the group {joined:.1f} s later",
        f"  node 1 restored step {replaced['restored']}: {_kb(got['peers'])} received from "
        f"node 0, {_kb(got['remote'])} read from the store, in {replaced['restore_s']:.2f} s; "
        f"node 0 "
        f"read {_kb(kept['local'])} from its own local tier -> "
        + ("OK" if same and from_peer and clean else "FAILED"),
        f"  the job ran on to step {STEPS} -> " + ("OK" if finished else "FAILED"),
    ]


def _kb(n: int) -> str:
    return f"{n / 1000:,.0f} kB"
