"""The steady-state wait of a data loader whose workers are ahead: what handing over costs.

    python -m benchmarks.data.handoff_wait [--steps 300] [--busy 2]

data.vs_peers shows every contender at a 5-9 % wait per 40 ms step even in the steady
state, when the workers have batches ready. This measures that floor in one process, warm
cache, no network: the training loop sleeps ``--step-ms`` (the "GPU step") and times each
``next()``. Contenders, each with 2 workers and batch 8 of the peers benchmark's token rows
(``id`` + 1 024 ``int32`` tokens):

  torch     a plain torch DataLoader over an IterableDataset yielding ready-made batches
            (no reading, no decoding): the hand-off alone, worker -> loop
  torch-inline  the same, each batch wrapped by ckptstore.data.handoff.inline (small
            tensors copied through the pipe, not passed as shared memory)
  ckptstore ckptstore's DataLoader over local Parquet shards, cache warm

each under torch's two sharing strategies (``file_descriptor``, the default, passes every
tensor's shared memory as an fd through the worker's resource-sharer thread, which needs
that worker's GIL; ``file_system`` passes a name). ``--busy N`` adds N processes spinning
on the CPU (the other rank, the server, the proxy of the peers run). Prints p50 / p99 /
mean of the wait in ms and as % of the step, over the steps after the first 10.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import IterableDataset


class _Ready(IterableDataset):
    def __init__(self, steps: int, batch: int, tokens: int, inline: bool) -> None:
        self.steps, self.batch, self.tokens, self.inline = steps, batch, tokens, inline

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        from ckptstore.data.handoff import inline

        for s in range(w, self.steps, n):
            batch = {
                "id": torch.arange(s * self.batch, (s + 1) * self.batch),
                "tokens": torch.zeros(self.batch, self.tokens, dtype=torch.int32),
            }
            yield inline(batch) if self.inline else batch


def _spin(stop: Any) -> None:
    while not stop.is_set():
        sum(range(10_000))


def _loop(loader: Any, step_s: float, steps: int) -> list[float]:
    waits = []
    it = iter(loader)
    for _ in range(steps):
        t = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t)
        time.sleep(step_s)
    del it
    return waits[10:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-ms", type=float, default=40.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU")
    p.add_argument("--strategies", default="file_descriptor,file_system")
    p.add_argument("--contenders", default="torch,torch-inline,ckptstore")
    args = p.parse_args(argv)
    from benchmarks.peers.convert import make_tokens
    from ckptstore.data import DataLoader, ShardedDataset

    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="ckptstore-handoff-")
    rows = 144
    shards = max(16, -(-args.steps * args.batch // rows))
    make_tokens(os.path.join(work, "tokens"), shards, rows, 1024, 64)
    stop = mp.get_context("fork").Event()
    spinners = [
        mp.get_context("fork").Process(target=_spin, args=(stop,)) for _ in range(args.busy)
    ]
    for s in spinners:
        s.start()
    print(f"load average {os.getloadavg()}; {args.busy} spinning; step {args.step_ms} ms")
    print("| contender | sharing | wait p50 ms | p99 ms | mean ms | p50 % of step | p99 % |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    try:
        for strategy in args.strategies.split(","):
            torch.multiprocessing.set_sharing_strategy(strategy)
            for name in args.contenders.split(","):
                if name in ("torch", "torch-inline"):
                    loader: Any = torch.utils.data.DataLoader(
                        _Ready(args.steps, args.batch, 1024, name == "torch-inline"),
                        batch_size=None,
                        num_workers=args.workers,
                    )
                else:
                    ds = ShardedDataset(
                        os.path.join(work, "tokens"),
                        cache_dir=os.path.join(work, "cache"),
                        columns=["id", "tokens"],
                        seed=1,
                    )
                    loader = DataLoader(ds, args.batch, args.workers)
                    for _ in loader:  # warm: every shard cached
                        pass
                waits = sorted(_loop(loader, args.step_ms / 1e3, args.steps))
                if hasattr(loader, "close"):
                    loader.close()
                p50 = waits[len(waits) // 2] * 1e3
                p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))] * 1e3
                mean = statistics.mean(waits) * 1e3
                print(
                    f"| {name} | {strategy} | {p50:.2f} | {p99:.2f} | {mean:.2f} | "
                    f"{p50 / args.step_ms * 100:.1f} | {p99 / args.step_ms * 100:.1f} |",
                    flush=True,
                )
    finally:
        stop.set()
        for s in spinners:
            s.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
