"""GPU -> host staging and async-save blocking time on one CUDA device (ready; not yet run).

    python -m benchmarks.checkpoint.gpu_staging --size-gib 4 [--saves 4] [--dir /local/nvme]

One process, one device, a 1-rank gloo group. The state is ``--size-gib`` of float32
(bf16 with ``--dtype bfloat16``) CUDA tensors of 256 MiB. Each contender runs ``--saves``
times; the first allocates its buffers and is reported apart, the table shows the median
and min–max of the others. Every time ends with ``torch.cuda.synchronize()``.

  copy_ -> pinned        floor: ``copy_(non_blocking=True)`` into preallocated pinned buffers
  copy_ -> pageable      the same into ordinary (pageable) host tensors
  .cpu() (fresh)         what a naive stager does: a fresh pageable copy every save
  dcp.async_save         stock, default stager; blocking = until async_save returns
  dcp.async_save + DefaultStager(pinned, async)   blocking = until staging_completion
  CheckpointManager      ckptstore, pinned cached staging; blocking = save() returning;
                         committed = the record's total_s (written, fsynced, committed)
  CheckpointManager + local_tier_dir   the same via a local staging tier
  CheckpointManager behind the step    the tensors as an optimizer's parameters: save()
                         returns before they are copied (a side CUDA stream), and the
                         optimizer's next step waits for the copy (``defer_staging``)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def timed(fn: Any) -> float:
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-gib", type=float, default=4.0)
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--dir", default=None, help="checkpoint root's parent (default: a temp dir)")
    a = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_staging.py: no CUDA device here (torch.cuda.is_available() is False; torch "
            f"{torch.__version__}). Run it on a machine with an NVIDIA GPU and a CUDA build "
            "of torch.",
            file=sys.stderr,
        )
        return 2
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from ckptstore.manager import CheckpointManager

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    dtype = getattr(torch, a.dtype)
    per = 256 * 2**20 // torch.tensor([], dtype=dtype).element_size()
    n = max(1, int(a.size_gib * 4))
    state = {f"t{i}": torch.randn(per, device="cuda").to(dtype) for i in range(n)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    base = tempfile.mkdtemp(prefix="ckptstore-gpu-", dir=a.dir)
    res: dict[str, dict[str, list[float]]] = {}

    def rec(name: str, blocking: float, committed: float | None = None) -> None:
        r = res.setdefault(name, {"blocking": [], "committed": []})
        r["blocking"].append(blocking)
        if committed is not None:
            r["committed"].append(committed)

    try:
        pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
        pageable = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in state.items()}
        for _ in range(a.saves):
            rec(
                "copy_ -> pinned",
                timed(lambda: [pinned[k].copy_(v, non_blocking=True) for k, v in state.items()]),
            )
            rec(
                "copy_ -> pageable", timed(lambda: [pageable[k].copy_(v) for k, v in state.items()])
            )
            rec(".cpu() (fresh)", timed(lambda: [v.cpu() for v in state.values()]))
        pinned.clear()
        pageable.clear()
        pg = dist.new_group(backend="gloo")
        stager = DefaultStager(StagingOptions(True, False, True, True))
        for name, st in (("dcp.async_save", None), ("dcp.async_save + DefaultStager", stager)):
            for i in range(a.saves):
                t0 = time.perf_counter()
                fut = dcp.async_save(
                    state,
                    storage_writer=dcp.FileSystemWriter(os.path.join(base, f"{name[:14]}{i}")),
                    process_group=pg,
                    async_stager=st,
                )
                staging = getattr(fut, "staging_completion", None)
                if staging is not None:
                    staging.result()
                _sync()
                blocking = time.perf_counter() - t0
                (getattr(fut, "upload_completion", None) or fut).result()
                rec(name, blocking, time.perf_counter() - t0)
        stager.close()
        for name, local_tier_dir in (("CheckpointManager", None), ("+ local_tier_dir", "staging")):
            sd = os.path.join(base, local_tier_dir) if local_tier_dir else None
            mgr = CheckpointManager(os.path.join(base, f"mgr-{local_tier_dir}"), local_tier_dir=sd)
            for i in range(a.saves):
                t0 = time.perf_counter()
                mgr.save(i, state)
                _sync()
                blocking = time.perf_counter() - t0
                mgr.wait()
                rec(
                    f"CheckpointManager {name if local_tier_dir else ''}".strip(),
                    blocking,
                    mgr.records[-1].total_s,
                )
            mgr.close()
        # Staging behind the step: the tensors are an optimizer's parameters, so save()
        # returns before they are copied (on a side stream) and the optimizer's step waits.
        params = {k: torch.nn.Parameter(v, requires_grad=False) for k, v in state.items()}
        opt = torch.optim.SGD(params.values(), lr=0.0)
        mgr = CheckpointManager(os.path.join(base, "mgr-behind"))
        for i in range(a.saves):
            t0 = time.perf_counter()
            mgr.save(i, {"params": params, "optim": opt})
            _sync()
            returned = time.perf_counter() - t0
            opt.step()  # its pre-hook waits for the deferred copy
            _sync()
            stepped = time.perf_counter() - t0
            mgr.wait()
            rec("CheckpointManager behind the step: save()", returned)
            rec("... + the next step's wait", stepped, mgr.records[-1].total_s)
        mgr.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
        dist.destroy_process_group()

    floor = statistics.median(res["copy_ -> pinned"]["blocking"][1:] or [float("nan")])
    print(
        f"\n{torch.cuda.get_device_name()}: {nbytes / 2**30:.2f} GiB of {a.dtype}, "
        f"{a.saves} saves each (first apart)\n"
    )
    print(
        "| contender | blocking s median | min–max | first | × pinned copy_ | GB/s | committed s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in res.items():
        b = r["blocking"][1:] or r["blocking"]
        med = statistics.median(b)
        c = r["committed"][1:] or r["committed"]
        cs = f"{statistics.median(c):.2f}" if c else "—"
        print(
            f"| {name} | {med:.3f} | {min(b):.3f}–{max(b):.3f} | {r['blocking'][0]:.3f} | "
            f"{med / floor:.2f} | {nbytes / 1e9 / med:.1f} | {cs} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
