"""Suite scenario ``objstore_torchsave``: rank-0 torch.save + upload vs the DCP writers, on S3.

The remote counterpart of ``checkpoint.local``'s torch.save row, in one run against one fresh
SeaweedFS (direct link), alternating with ``objstore.save_load``'s own ckptstore and
FsspecWriter contenders (called, not re-implemented):

  rank-0 torch.save + upload   checkpoint.local.save_torch into a local temp dir (gather to rank 0,
        torch.save, fsync of file and directory), then s3fs ``put_file`` of that one file to
        the bucket (s3fs's default multipart upload, one stream), then the local file is
        removed (untimed). The time is all of it; the split is kept in ``extra``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from benchmarks.common import make_state, record, rotated

__all__ = ["run_objstore_torchsave"]

NAMES = ("rank-0 torch.save + upload", "ckptstore", "FsspecWriter")


def _rank(rank: int, world: int, cfg: Any, endpoint: str, repeats: int, tmp: str) -> dict:
    import torch
    import torch.distributed as dist

    from benchmarks.checkpoint.local import save_torch
    from benchmarks.objstore import contenders as oc

    torch.set_num_threads(1)
    ctx = oc.RankCtx(rank, world, cfg, {"direct": endpoint}, {}, "")
    ctx.state = make_state(rank, cfg)
    fs, _ = oc._raw_client(ctx, "direct")

    def torch_save_upload(key: str) -> dict[str, float]:
        path = os.path.join(tmp, key)
        parts = save_torch(ctx.state, path, rank, world)
        if rank == 0:
            t = time.perf_counter()
            fs.put_file(os.path.join(path, "state.pt"), f"{oc.BUCKET}/direct/{key}/state.pt")
            parts["upload_s"] = time.perf_counter() - t
        return parts

    fns = {
        NAMES[0]: torch_save_upload,
        NAMES[1]: lambda key: oc.save_ckptstore(ctx, "direct", key),
        NAMES[2]: lambda key: oc.save_fsspec(ctx, "direct", key),
    }
    out: dict[str, list[dict]] = {n: [] for n in NAMES}
    for r in range(-1, repeats):  # r = -1: untimed-in-the-table warm-up
        for name in rotated(NAMES, r):
            key = f"ts{r + 1}-{NAMES.index(name)}"
            dist.barrier()
            t0 = time.perf_counter()
            parts = fns[name](key) or {}
            dist.barrier()
            if r >= 0:
                out[name].append({"s": time.perf_counter() - t0, **parts})
            if rank == 0:
                oc.delete_prefix(ctx, "direct", key)
                shutil.rmtree(os.path.join(tmp, key), ignore_errors=True)
            dist.barrier()
    return out


def run_objstore_torchsave(
    scn: str, size_mib: int, world: int, repeats: int, **_: Any
) -> list[dict]:
    from benchmarks.objstore import contenders as oc
    from harness.dist import run_distributed
    from harness.seaweedfs import SeaweedFS

    cfg = oc.BenchConfig(size_mib=size_mib, world=world, repeats=repeats)
    server = SeaweedFS().start()
    tmp = tempfile.mkdtemp(prefix="ckptstore-suite-ts3-")
    try:
        server.create_bucket(oc.BUCKET)
        per_rank = run_distributed(_rank, world, cfg, server.endpoint, repeats, tmp, timeout=1800)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out = []
    for name in NAMES:
        xs = [max(pr[name][i]["s"] for pr in per_rank) for i in range(repeats)]
        detail = [{k: v for k, v in d.items() if k != "s"} for d in per_rank[0][name]]
        out.append(
            record(
                scn,
                "objstore",
                "save",
                name,
                xs,
                bytes=cfg.state_bytes,
                world=world,
                dest="SeaweedFS direct",
                rank0_detail=detail,
            )
        )
    return out
