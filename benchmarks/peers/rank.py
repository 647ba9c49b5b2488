"""One rank of a data.vs_peers run: the training loop, timed; a kill; a resume.

    python -m benchmarks.peers.rank SPEC.json OUT.json     (RANK, WORLD_SIZE, ... set)

The environment is torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so every contender sees a normal distributed job. The loop, per
epoch: ``next(loader)`` (timed: the wait), then a sleep of ``step_s`` (the "GPU step", with
the GIL free). ``kill_after`` = K: after step K the rank writes its loader state and the ids
trained so far (the checkpoint), trains two more steps (lost work) and SIGKILLs itself.
``state_in``: resume from such a checkpoint (with this run's world size and workers).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.peers.contenders import CONTENDERS


def disk_bytes(path: str) -> int:
    if not os.path.exists(path):
        return 0
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=False)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 0


def main() -> None:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    contender = CONTENDERS[spec["contender"]](spec)
    state = None
    if spec.get("state_in"):
        path = spec["state_in"].format(rank=rank % spec["state_world"])
        with open(path, "rb") as f:
            state = pickle.load(f)["state"]
    t0 = time.perf_counter()
    result: dict[str, Any] = {"rank": rank, "epochs": []}
    try:
        loader = contender.loader(state)
    except Exception as exc:  # noqa: BLE001 - recorded: a contender that refuses a resume
        result["error"] = f"{type(exc).__name__}: {exc}"[-700:]
        _write(out_path, result)
        dist.destroy_process_group()
        return
    result["build_s"] = time.perf_counter() - t0
    result["phases"] = dict(contender.phases)
    step_s = spec["step_s"]
    steps = 0
    trained: list[list[int]] = []
    for epoch in range(spec["epochs"]):
        waits, ids = [], []
        e0 = time.perf_counter()
        it = iter(loader)
        if epoch == 0:
            result["phases"]["iter_s"] = time.perf_counter() - e0  # workers start, prefetch
        first = None
        try:
            while True:
                t = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                waits.append(time.perf_counter() - t)
                if first is None:
                    first = time.perf_counter() - (t0 if epoch == 0 else e0)
                    if epoch == 0:
                        result["phases"]["first_next_s"] = waits[-1]
                got = batch["id"].tolist() if not isinstance(batch, list) else []
                ids.append(got)
                trained.append(got)
                time.sleep(step_s)
                steps += 1
                if spec.get("kill_after") and steps == spec["kill_after"]:
                    checkpoint = {"state": contender.state(loader), "trained": list(trained)}
                    with open(spec["state_out"].format(rank=rank), "wb") as f:
                        pickle.dump(checkpoint, f)
                    dist.barrier()  # every rank has its checkpoint
                if spec.get("kill_after") and steps == spec["kill_after"] + 2:
                    os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, workers running
        except Exception as exc:  # noqa: BLE001 - recorded, as above
            result["error"] = f"epoch {epoch}: {type(exc).__name__}: {exc}"[-700:]
            break
        finally:
            del it
        result["epochs"].append(
            {
                "waits": waits,
                "ids": ids,
                "first_batch_s": first,
                "wall_s": time.perf_counter() - e0,
            }
        )
    result["disk_bytes"] = disk_bytes(spec["cache"])
    _write(out_path, result)
    dist.destroy_process_group()


def _write(path: str, result: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
