"""What work beside a training loop costs its steps, by what that work holds: a core or the GIL.

    python -m benchmarks.checkpoint.gil_share [--model demo|sized] [--state-mib 256]
        [--steps 30] [--pairs 3]

One process, the step-rate benchmark's model (``step_rate.build_model``), one torch thread,
AdamW. Each case runs in a fresh process, the cases alternated ``--pairs`` times; per case
the median over its runs of the milliseconds a training step takes (forward, backward,
optimizer: what training itself computes) and, with a checkpoint after every step, of
``save()`` (training blocked) and of a whole step with its save:

- ``alone``: nothing beside the loop;
- ``native thread``: a thread hashing 8 MiB buffers (``hashlib`` releases the GIL): a
  busy core, no GIL;
- ``python thread``: a thread running a pure-Python loop: the GIL, held (its run is capped
  at ``MAX_S`` seconds: a step then takes seconds);
- ``ckptstore (thread)`` / ``ckptstore (process)``: a ``CheckpointManager`` saving model
  and optimizer after every step, its background work on the training process's save
  thread (the default) or in a writer process (``background="process"``).

On a machine with a core to spare, a thread that only computes costs a step little, a
thread that runs Python costs it much: every op of the step waits for the GIL, up to the
interpreter's switch interval (5 ms) while the other thread holds it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Any

from benchmarks.checkpoint.step_rate import BATCH, SEQ, build_model, shape_of
from benchmarks.common import (
    REPO_ROOT,
    cell,
    load_average,
    machine_line,
    machine_load,
    markdown_table,
    rotated,
    write_results,
)

__all__ = ["main", "run_case"]

CASES = ("alone", "native thread", "python thread", "ckptstore (thread)", "ckptstore (process)")
MAX_S = 20.0  # a case's timed steps stop after this many seconds


def _hash_loop(stop: threading.Event) -> None:
    block = os.urandom(8 << 20)
    while not stop.is_set():
        hashlib.sha256(block).digest()


def _python_loop(stop: threading.Event) -> None:
    while not stop.is_set():
        total = 0
        for i in range(10_000):
            total += i


def run_case(case: str, model_name: str, state_mib: int, steps: int) -> dict[str, Any]:
    """One case in this process: medians of step and ``save()`` milliseconds."""
    import torch

    from ckptstore import AppState, CheckpointManager

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(shape_of(model_name, state_mib))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, 64, (BATCH, SEQ))

    def train_step() -> None:
        optim.zero_grad(set_to_none=True)
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        optim.step()

    for _ in range(3):
        train_step()
    stop = threading.Event()
    loops = {"native thread": _hash_loop, "python thread": _python_loop}
    side = threading.Thread(target=loops[case], args=(stop,)) if case in loops else None
    mgr = None
    root = tempfile.mkdtemp(prefix="gil_share-")
    step_ms, save_ms, whole_ms = [], [], []
    try:
        if case.startswith("ckptstore"):
            warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
            logging.getLogger("ckptstore").setLevel(logging.WARNING)
            background = "process" if "process" in case else "thread"
            mgr = CheckpointManager(root, strict=True, background=background)
            state = {"app": AppState(model, optim)}
            mgr.save(0, state)  # warm-up: allocates the staging buffers
            train_step()
            mgr.wait()
        if side is not None:
            side.start()
            time.sleep(0.2)
        deadline = time.perf_counter() + MAX_S
        for n in range(1, steps + 1):
            t0 = time.perf_counter()
            train_step()
            t1 = time.perf_counter()
            if mgr is not None:
                mgr.save(n, state)
            t2 = time.perf_counter()
            step_ms.append(1e3 * (t1 - t0))
            save_ms.append(1e3 * (t2 - t1))
            whole_ms.append(1e3 * (t2 - t0))
            if t2 > deadline:
                break
    finally:
        stop.set()
        if side is not None and side.is_alive():
            side.join()
        if mgr is not None:
            mgr.close()
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    return {"step_ms": med(step_ms), "save_ms": med(save_ms), "whole_ms": med(whole_ms)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="demo", choices=("demo", "sized"))
    p.add_argument("--state-mib", type=int, default=256, help="the sized model's state")
    p.add_argument("--steps", type=int, default=30, help="timed steps a case (at most)")
    p.add_argument("--pairs", type=int, default=3, help="runs of every case, alternated")
    p.add_argument("--child", help=argparse.SUPPRESS)  # run one case here, print JSON
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_case(args.child, args.model, args.state_mib, args.steps)))
        return
    before = load_average()
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)  # the children import this checkout
    for r in range(args.pairs):
        for case in rotated(CASES, r):
            cmd = [sys.executable, "-m", "benchmarks.checkpoint.gil_share", "--child", case]
            cmd += ["--model", args.model, "--state-mib", str(args.state_mib)]
            cmd += ["--steps", str(args.steps)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs[case].append(json.loads(out.strip().splitlines()[-1]))
            print(f"repeat {r + 1}: {case}: {runs[case][-1]}", flush=True)
    rows = []
    for case, got in runs.items():
        row = [case]
        for key in ("step_ms", "save_ms", "whole_ms"):
            values = [g[key] for g in got]
            spread = f"({min(values):.1f}–{max(values):.1f})"
            row.append(f"{cell(statistics.median(values), '.1f')} {spread}")
        rows.append(row)
    header = ("case", "training step ms", "save() ms", "step + save() ms")
    print(markdown_table(header, "lrrr", rows))
    machine = machine_load(before)
    print(machine_line(machine))
    path = write_results("gil_share", {"args": vars(args), "runs": runs, "machine": machine})
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
