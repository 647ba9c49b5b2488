"""torch_checkpointing's async save on its own local backend vs on ckptstore's storage vs
ckptstore's CheckpointManager: the same state on the same ranks.

    PYTHONPATH=. python -m benchmarks.peers.torch_checkpointing              # 256 MiB, 2 ranks
    PYTHONPATH=. python -m benchmarks.peers.torch_checkpointing --quick      # 64 MiB, 1 round

Per round and contender, fresh rank processes (gloo) do one warm-up save (torch_checkpointing
starts its saver process, ckptstore its buffers), then ``--saves`` timed saves: barrier ->
save -> "blocking" (until save() returns) -> wait until durable and renamed/committed ->
barrier -> "committed". Contenders alternate which goes first each round.

  volume (a directory on this machine's disk):
    tc local      torch_checkpointing 0.1.1's AsyncCheckpointSaver + LocalFileSystemStorage
                  (buffered writes: its default O_DIRECT fails with EINVAL at close on this
                  disk; no fsync; temp directory + os.rename)
    tc+ckptstore  the same saver + ckptstore_tc.CkptStoreStorage (engine parts, fsync,
                  os.rename + directory fsync)
    ckptstore     ckptstore.CheckpointManager(async_save=True): stage, write, manifest,
                  COMMITTED
  s3 over the shaped link (SeaweedFS behind benchmarks.shaped_link, per-connection cap):
    tc+ckptstore  the storage on s3:// (multipart parts; the rename: server-side copies)
    ckptstore     the manager on s3://
  torch_checkpointing 0.1.1 has no fsspec backend (its only Storage is the local one), so
  there is no "torch_checkpointing + s3fs" contender.

Output: a Markdown table (median, min-max over every timed save of every round) and JSON in
benchmarks/results/bench_torch_checkpointing-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from benchmarks.common import (
    StateShape,
    cell,
    command_line,
    load_average,
    make_state,
    markdown_table,
    rotated,
    write_results,
)

__all__ = ["main", "run"]

BUCKET = "ckpt"
VOLUME = ("tc local", "tc+ckptstore", "ckptstore")
S3 = ("tc+ckptstore", "ckptstore")


def _tc_manager(storage: Any) -> Any:
    from torch_checkpointing.checkpoint_manager import CheckpointManager
    from torch_checkpointing.config import AsyncCheckpointSaverConfig
    from torch_checkpointing.staging import CheckpointStagerConfig

    # CPU staging: pinned memory and non-blocking copies need an accelerator
    staging = CheckpointStagerConfig(use_pinned_memory=False, use_non_blocking_copy=False)
    save = AsyncCheckpointSaverConfig(staging_config=staging)
    return CheckpointManager.Config(save=save, storage_config=storage).build()


def _rank(rank: int, world: int, tmp: Any, spec: dict[str, Any]) -> list[tuple[float, float]]:
    """One contender's saves on this rank: [(blocking s, committed s)] of the timed ones."""
    import torch.distributed as dist

    state = make_state(rank, StateShape(spec["size_mib"], world, tensors_per_rank=8))
    name, url, options = spec["contender"], spec["url"], spec["options"]
    if name == "ckptstore":
        import ckptstore

        mgr = ckptstore.CheckpointManager(url, storage_options=options, strict=True)

        def save(step: int) -> Any:
            return mgr.save(step, state)

        def done(_: Any) -> None:
            mgr.wait()

        close = mgr.close
    else:
        if name == "tc local":
            from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig

            # its default O_DIRECT write fails here at close (EINVAL: the file's unaligned
            # tail on this ext4 disk), so buffered writes, as its own tests use
            storage, base = LocalFileSystemStorageConfig(use_direct_io=False), url
        else:
            from ckptstore_tc import CkptStoreStorageConfig

            storage = CkptStoreStorageConfig(url, mount="/ckpt", storage_options=options)
            base = "/ckpt"
        tc = _tc_manager(storage)

        def save(step: int) -> Any:
            future = tc.save(f"{base}/step_{step}", {"model": state})
            # save() returns before its staging copy is made; training may change the
            # state only after it (the manager's own staging future: no public handle)
            if tc._staging_future is not None:
                tc._staging_future.result()
            return future

        def done(future: Any) -> None:
            if future is not None:
                future.result()

        close = tc.close
    out = []
    try:
        for step in range(spec["saves"] + 1):  # step 0: the warm-up
            dist.barrier()
            t0 = time.perf_counter()
            pending = save(step)
            blocking = time.perf_counter() - t0
            done(pending)
            dist.barrier()
            if step:
                out.append((blocking, time.perf_counter() - t0))
    finally:
        close()
    return out


def _scenario(
    kind: str, names: tuple[str, ...], url_of: Any, options: dict, a: argparse.Namespace
) -> dict:
    from harness.dist import run_distributed

    samples: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(a.rounds):
        for name in rotated(names, r):
            url, cleanup = url_of(name, r)
            spec = dict(contender=name, url=url, options=options, size_mib=a.size_mib)
            spec["saves"] = a.saves
            try:
                per_rank = run_distributed(
                    _rank, a.world, None, spec, timeout=a.timeout, daemon=False
                )
            finally:
                cleanup()
            samples[name] += [max(pair) for pair in zip(*per_rank)]  # the slowest rank
    return {
        n: {
            metric: {
                "samples": [s[i] for s in v],
                "median": statistics.median(s[i] for s in v),
                "min": min(s[i] for s in v),
                "max": max(s[i] for s in v),
            }
            for i, metric in enumerate(("blocking", "committed"))
        }
        | {"kind": kind}
        for n, v in samples.items()
    }


def run(a: argparse.Namespace) -> dict:
    """Both scenarios; the results as written to JSON."""
    work = tempfile.mkdtemp(prefix="bench-tc-", dir=a.dir)
    results: dict[str, Any] = {"command": command_line(), "load_before": load_average()}
    try:

        def volume(name: str, r: int) -> tuple[str, Any]:
            path = os.path.join(work, f"{name.replace(' ', '_')}-{r}")
            os.makedirs(path)
            return path, lambda: shutil.rmtree(path, ignore_errors=True)

        results["volume"] = _scenario("volume", VOLUME, volume, {}, a)
        if not a.no_s3:
            results["s3"] = _s3(a)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_after"] = load_average()
    return results


def _s3(a: argparse.Namespace) -> dict:
    from benchmarks.shaped_link import ShapedLink
    from harness.seaweedfs import SeaweedFS

    with SeaweedFS() as server:
        server.create_bucket(BUCKET)
        link = ShapedLink(server.port, mbps=a.link_mbps, latency_ms=a.link_latency_ms).start()
        try:
            options = dict(server.storage_options, endpoint_url=link.endpoint)

            def url_of(name: str, r: int) -> tuple[str, Any]:
                return f"s3://{BUCKET}/{name.replace('+', '_')}-{r}", lambda: None

            out = _scenario("s3 shaped", S3, url_of, options, a)
        finally:
            link.stop()
    return out


def table(results: dict) -> str:
    rows = []
    for kind in ("volume", "s3"):
        for name, r in results.get(kind, {}).items():
            b, c = r["blocking"], r["committed"]
            rows.append(
                [
                    r["kind"],
                    name,
                    f"{cell(b['median'], '.3f')} ({cell(b['min'], '.3f')}–{cell(b['max'], '.3f')})",
                    f"{cell(c['median'], '.3f')} ({cell(c['min'], '.3f')}–{cell(c['max'], '.3f')})",
                ]
            )
    header = ["where", "contender", "blocking s, median (min–max)", "committed s"]
    return markdown_table(header, "llrr", rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=256, help="state over all ranks")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per contender")
    p.add_argument("--saves", type=int, default=2, help="timed saves per round")
    p.add_argument("--link-mbps", type=float, default=200.0, help="shaped link, per connection")
    p.add_argument("--link-latency-ms", type=float, default=20.0, help="one way")
    p.add_argument("--no-s3", action="store_true", help="the volume scenario only")
    p.add_argument("--quick", action="store_true", help="64 MiB, 1 round")
    p.add_argument("--dir", default=None, help="where the volume runs write (default: /tmp)")
    p.add_argument("--timeout", type=float, default=600.0)
    a = p.parse_args(argv)
    if a.quick:
        a.size_mib, a.rounds = 64, 1
    results = run(a)
    print(table(results))
    print("results:", write_results("bench_torch_checkpointing", results))


if __name__ == "__main__":
    main()
