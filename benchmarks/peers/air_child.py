"""One contender of benchmarks.peers.air_bench, in a process of its own (one rank of it).

    python -m benchmarks.peers.air_child SPEC.json OUT.json     (RANK, WORLD_SIZE, ... set)

``part`` "ckpt": an untimed small warm-up save and load, then the state's save (returned;
durable), its load (checked bitwise) and a ``dcp.async_save`` (returned; durable), each into
a fresh directory. Around each: the fsync calls this process made (``os.fsync``,
``os.fdatasync`` and ``os.sync`` are wrapped before anything runs) and its ``/proc/self/io``
counters. How each contender becomes durable once ``dcp.save`` has returned:

  ckptstore  nothing to add: every file is written to a temp name, fsynced and renamed, the
             directory fsynced, then the manifest and the COMMITTED marker the same way
  stock      torch's FileSystemWriter fsyncs each data file and .metadata (sync_files=True)
             but not the directory it renames .metadata in: + fsync of the checkpoint
             directory and of its parent (which holds the new directory's entry)
  air        its writer fsyncs each file in its local staging directory, then copies it to
             the destination without an fsync: + fsync of every destination file, the
             checkpoint directory and its parent

``part`` "data": the loader's modules imported (timed apart), then one data epoch cold
(loader built with an empty cache, then epoch 0) and one warm (epoch 1, the same loader and
cache). ``part`` "resume": a loader's state after
two batches (``save_to``), or a resume from such a state (``load_from``): the error, if any.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading
import time
from typing import Any

__all__ = ["main"]

_FSYNCS = {"n": 0}
_LOCK = threading.Lock()


def _count_syncs() -> None:
    """Wrap os.fsync / os.fdatasync / os.sync so that every call is counted."""

    def counted(fn: Any) -> Any:
        def call(*args: Any) -> Any:
            with _LOCK:
                _FSYNCS["n"] += 1
            return fn(*args)

        return call

    for name in ("fsync", "fdatasync", "sync"):
        setattr(os, name, counted(getattr(os, name)))


def _proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def _durable(contender: str, path: str) -> None:
    """What ``contender`` leaves to do after ``dcp.save`` returns (module docstring)."""
    from benchmarks.common import fsync_path

    if contender == "ckptstore":
        return
    if contender == "air":
        for d, _, files in os.walk(path):
            for name in files:
                fsync_path(os.path.join(d, name))
    fsync_path(path)
    fsync_path(os.path.dirname(path))


def _storage(contender: str, path: str, write: bool) -> Any:
    if contender == "ckptstore":
        import ckptstore

        return ckptstore.writer(path) if write else ckptstore.reader(path)
    if contender == "air":
        from benchmarks.peers.air import air_reader, air_writer

        return air_writer(path) if write else air_reader(path)
    import torch.distributed.checkpoint as dcp

    return dcp.FileSystemWriter(path) if write else dcp.FileSystemReader(path)


class _Phase:
    """Times an operation as max over ranks (barrier before and after) and records this
    rank's fsync calls and ``/proc/self/io`` deltas across it."""

    def __init__(self, world: int) -> None:
        self.world = world

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def __enter__(self) -> _Phase:
        self.barrier()
        self.io0, self.n0 = _proc_io(), _FSYNCS["n"]
        self.t0 = time.perf_counter()
        return self

    def mark(self) -> float:
        return time.perf_counter() - self.t0

    def __exit__(self, *exc: Any) -> None:
        self.barrier()
        self.s = time.perf_counter() - self.t0
        io = _proc_io()
        self.fsyncs = _FSYNCS["n"] - self.n0
        self.io = {
            k: io[k] - self.io0[k] for k in ("wchar", "write_bytes", "cancelled_write_bytes")
        }


def _ckpt(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    import shutil

    import torch
    import torch.distributed.checkpoint as dcp

    from benchmarks.common import StateShape, make_state

    torch.set_num_threads(1)
    cfg = StateShape(spec["size_mib"], world, 1, spec["tensors_per_rank"])
    who, base = spec["contender"], spec["dir"]
    paths = {p: os.path.join(base, p) for p in ("warmup", "save", "async")}
    small = make_state(rank, cfg, numel=64 * 1024)
    dcp.save(small, storage_writer=_storage(who, paths["warmup"], True))
    dcp.load(small, storage_reader=_storage(who, paths["warmup"], False))
    _Phase(world).barrier()
    if rank == 0:
        shutil.rmtree(paths["warmup"])
    state = make_state(rank, cfg)
    dest = {k: torch.zeros_like(v) for k, v in state.items()}
    out: dict[str, Any] = {"state_bytes": cfg.state_bytes}

    with _Phase(world) as ph:
        dcp.save(state, storage_writer=_storage(who, paths["save"], True))
        returned, n_own = ph.mark(), _FSYNCS["n"] - ph.n0
        ph.barrier()
        if rank == 0:
            _durable(who, paths["save"])
    out["save"] = {"returned_s": returned, "s": ph.s, "fsyncs": ph.fsyncs, "fsyncs_own": n_own}
    out["save"].update(ph.io)

    with _Phase(world) as ph:
        dcp.load(dest, storage_reader=_storage(who, paths["save"], False))
    if not all(torch.equal(dest[k], state[k]) for k in state):
        raise AssertionError(f"{who}: the load is not bitwise equal to the state")
    out["load"] = {"s": ph.s, "fsyncs": ph.fsyncs, **ph.io}

    with _Phase(world) as ph:
        fut = dcp.async_save(state, storage_writer=_storage(who, paths["async"], True))
        staging = getattr(fut, "staging_completion", None)
        if staging is not None:
            staging.result()
        returned = ph.mark()
        (getattr(fut, "upload_completion", None) or fut).result()
        ph.barrier()
        if rank == 0:
            _durable(who, paths["async"])
    out["async"] = {"returned_s": returned, "s": ph.s, "fsyncs": ph.fsyncs, **ph.io}
    return out


def _loader(spec: dict[str, Any]) -> Any:
    if spec["contender"] == "air":
        from benchmarks.peers.air import air_loader

        return air_loader(spec["files"], spec["batch"], spec["workers"])
    from benchmarks.peers.contenders import CONTENDERS

    return CONTENDERS["ckptstore"](spec).loader(None)


def _data(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    import torch

    from benchmarks.peers.rank import disk_bytes

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if spec["contender"] == "air":
        import benchmarks.peers.air  # noqa: F401 - imports mlflow (its DataLoader's metrics)
    else:
        import ckptstore.data.dataset  # noqa: F401
        import ckptstore.data.loader  # noqa: F401
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loader = _loader(spec)
    epochs = []
    for _ in range(2):
        ids: list[int] = []
        for batch in loader:
            ids.extend(batch["id"].tolist())
        epochs.append({"s": time.perf_counter() - t0, "ids": sorted(ids)})
        t0 = time.perf_counter()
    return {"epochs": epochs, "cache_bytes": disk_bytes(spec["cache"]), "import_s": import_s}


def _resume(spec: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    loader = _loader(spec)
    if spec.get("load_from"):
        with open(spec["load_from"], "rb") as f:
            state = pickle.load(f)
        try:
            loader.load_state_dict(state)
            n = sum(len(b["id"]) for b in loader)
        except ValueError as exc:
            return {"refused": f"{type(exc).__name__}: {exc}"}
        return {"refused": None, "samples_after_resume": n}
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    del it
    with open(spec["save_to"].format(rank=rank), "wb") as f:
        pickle.dump(state, f)
    return {"saved": True}


def main() -> None:
    _count_syncs()
    spec_path, out_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    run = {"ckpt": _ckpt, "data": _data, "resume": _resume}[spec["part"]]
    result = run(spec, rank, world)
    result["rank"] = rank
    with open(out_path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out_path + ".tmp", out_path)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
