"""ckptstore in one minute: train on 2 processes, checkpoint, restore on 2 fresh ones, verify.

    python tools/demo.py                     # a fresh temp dir, removed at the end
    python tools/demo.py --dir ./demo-ckpts --keep

1. train    2 gloo processes train a small MLP (DDP, AdamW) and, every ``--save-every``
            steps, save {model, optimizer, step} with ``ckptstore.save`` to
            ``<dir>/ckpts/step_<n>``; for comparison rank 0 also ``torch.save``s the same
            state (+ fsync) to ``<dir>/torch-save/step_<n>.pt``.
2. restore  2 *new* processes find the newest committed step (by its COMMITTED marker,
            never by mtime), load it into a freshly initialised model and optimizer
            through the verifying reader, and compare every tensor bitwise with the
            torch.save copy of that step.
3. report   median blocking time per save (ckptstore vs rank-0 torch.save), bytes, and
            whether verification passed. Exit status 1 if it did not.

Each stage is a plain function, so a kill-and-resume demo can reuse them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["DemoConfig", "train", "save", "restore", "report", "main"]


@dataclass(frozen=True)
class DemoConfig:
    root: str  # holds ckpts/ and torch-save/
    steps: int = 40
    save_every: int = 8
    d_in: int = 512
    hidden: int = 1024
    classes: int = 10
    batch: int = 64
    lr: float = 1e-3
    seed: int = 0

    @property
    def ckpt_root(self) -> str:
        return os.path.join(self.root, "ckpts")

    @property
    def ref_root(self) -> str:
        return os.path.join(self.root, "torch-save")


# -- model and data ------------------------------------------------------------------------
def build(cfg: DemoConfig, seed: int) -> tuple[Any, Any]:
    """A fresh MLP and its AdamW optimizer (weights from ``seed``)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(cfg.d_in, cfg.hidden),
        nn.ReLU(),
        nn.Linear(cfg.hidden, cfg.hidden),
        nn.ReLU(),
        nn.Linear(cfg.hidden, cfg.classes),
    )
    return model, torch.optim.AdamW(model.parameters(), lr=cfg.lr)


def batch(cfg: DemoConfig, step: int, rank: int) -> tuple[Any, Any]:
    """This rank's synthetic batch for ``step``: labels from a fixed random linear teacher."""
    import torch

    teacher = torch.randn(cfg.d_in, cfg.classes, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 1000 + rank)
    x = torch.randn(cfg.batch, cfg.d_in, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def checkpoint_state(model: Any, opt: Any, step: int) -> dict[str, Any]:
    """What a checkpoint holds: DCP state dicts of model and optimizer, plus the step."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "step": step}


def _max_over_ranks(x: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


# -- 1. train ------------------------------------------------------------------------------
def train(rank: int, world: int, cfg: DemoConfig) -> dict[str, Any]:
    """Train ``cfg.steps`` steps with DDP, saving every ``cfg.save_every``; per-save timings."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    model, opt = build(cfg, cfg.seed)
    ddp = DistributedDataParallel(model)
    saves, losses = [], []
    t0 = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        x, y = batch(cfg, step, rank)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % cfg.save_every == 0:
            saves.append(save(rank, ddp, opt, step, cfg))
    loop_s = time.perf_counter() - t0
    return {"saves": saves, "first_loss": losses[0], "last_loss": losses[-1], "loop_s": loop_s}


# -- checkpoint ----------------------------------------------------------------------------
def save(rank: int, model: Any, opt: Any, step: int, cfg: DemoConfig) -> dict[str, Any]:
    """Checkpoint ``step`` with ckptstore, then (for comparison) rank-0 torch.save + fsync.

    Both times are barrier-to-barrier, max over ranks: what training is blocked for.
    """
    import torch
    import torch.distributed as dist

    import ckptstore
    from ckptstore.catalog import step_name

    state = checkpoint_state(model, opt, step)
    path = os.path.join(cfg.ckpt_root, step_name(step))
    dist.barrier()
    t0 = time.perf_counter()
    ckptstore.save(state, path)
    dist.barrier()
    ckpt_s = _max_over_ranks(time.perf_counter() - t0)

    ref = os.path.join(cfg.ref_root, f"{step_name(step)}.pt")
    dist.barrier()
    t0 = time.perf_counter()
    if rank == 0:  # DDP state is replicated: rank 0 already holds all of it
        os.makedirs(cfg.ref_root, exist_ok=True)
        with open(ref, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(cfg.ref_root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    dist.barrier()
    torch_s = _max_over_ranks(time.perf_counter() - t0)
    out = {"step": step, "ckptstore_s": ckpt_s, "torch_save_s": torch_s}
    if rank == 0:
        out["ckpt_bytes"] = _dir_bytes(path)
        out["ckpt_files"] = len(os.listdir(path))
        out["ckpt_shards"] = sum(n.endswith(".distcp") for n in os.listdir(path))
        out["torch_save_bytes"] = os.path.getsize(ref)
    return out


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


# -- 2. restore ----------------------------------------------------------------------------
def newest_step(cfg: DemoConfig) -> int | None:
    """The newest step whose COMMITTED marker matches its manifest, or None."""
    from ckptstore.catalog import committed_steps
    from ckptstore.stores import open_store

    return next(iter(committed_steps(open_store(cfg.ckpt_root), newest_first=True)), None)


def restore(rank: int, world: int, cfg: DemoConfig) -> dict[str, Any]:
    """Load the newest committed checkpoint into a fresh model + optimizer; compare bitwise."""
    import torch
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.nn.parallel import DistributedDataParallel

    import ckptstore
    from ckptstore.catalog import step_name

    torch.set_num_threads(1)
    step = newest_step(cfg)
    if step is None:
        raise RuntimeError(f"no committed checkpoint under {cfg.ckpt_root}")
    model, opt = build(cfg, seed=cfg.seed + 12345)  # deliberately different weights
    ddp = DistributedDataParallel(model)
    state = checkpoint_state(ddp, opt, step=-1)  # also creates AdamW's state to load into
    reader = ckptstore.reader(os.path.join(cfg.ckpt_root, step_name(step)))  # verify=True
    t0 = time.perf_counter()
    ckptstore.load(state, reader)
    load_s = _max_over_ranks(time.perf_counter() - t0)
    set_state_dict(ddp, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    got = checkpoint_state(ddp, opt, state["step"])
    ref_path = os.path.join(cfg.ref_root, f"{step_name(step)}.pt")
    expected = torch.load(ref_path, weights_only=True)
    mismatches = _compare(got, expected)
    n_tensors = sum(1 for _ in _leaves(expected) if torch.is_tensor(_))
    return {
        "step": step,
        "load_s": load_s,
        "ranges_verified": len(reader.manifest.ranges) if reader.manifest else 0,
        "tensors_compared": n_tensors,
        "mismatches": mismatches,
    }


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [leaf for k in sorted(obj, key=str) for leaf in _leaves(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [leaf for v in obj for leaf in _leaves(v)]
    return [obj]


def _compare(got: Any, expected: Any, where: str = "") -> list[str]:
    """Paths where ``got`` differs from ``expected`` (tensors bitwise, others by ==)."""
    import torch

    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            return [f"{where or '/'}: keys differ"]
        return [m for k in expected for m in _compare(got[k], expected[k], f"{where}/{k}")]
    if torch.is_tensor(expected):
        same = (
            torch.is_tensor(got)
            and got.dtype == expected.dtype
            and got.shape == expected.shape
            and torch.equal(got, expected)
        )
        return [] if same else [where]
    return [] if got == expected else [where]


# -- 3. report -----------------------------------------------------------------------------
def report(cfg: DemoConfig, trained: dict[str, Any], restored: list[dict[str, Any]]) -> bool:
    """Print the summary; True if the restored state matched on every rank."""
    saves = trained["saves"]
    ck = [s["ckptstore_s"] for s in saves]
    ts = [s["torch_save_s"] for s in saves]
    last = saves[-1]
    r0 = restored[0]
    ok = all(not r["mismatches"] for r in restored) and all(
        r["step"] == saves[-1]["step"] for r in restored
    )
    mb = 1e6
    print(
        f"\ntrained {cfg.steps} steps on 2 ranks: loss {trained['first_loss']:.3f} -> "
        f"{trained['last_loss']:.3f} in {trained['loop_s']:.1f} s (saves included); "
        f"checkpoints at steps {', '.join(str(s['step']) for s in saves)}"
    )
    print(f"\nblocking time per save ({len(saves)} saves, barrier to barrier, max over ranks)")
    print("| save | median s | min–max s | MB |")
    print("| --- | ---: | ---: | ---: |")
    print(
        f"| ckptstore.save (verified, committed) | {statistics.median(ck):.3f} | "
        f"{min(ck):.3f}–{max(ck):.3f} | {last['ckpt_bytes'] / mb:.1f} |"
    )
    print(
        f"| rank-0 torch.save + fsync | {statistics.median(ts):.3f} | "
        f"{min(ts):.3f}–{max(ts):.3f} | {last['torch_save_bytes'] / mb:.1f} |"
    )
    print(
        f"\nckptstore checkpoint: {last['ckpt_bytes']:,} bytes in {last['ckpt_files']} files "
        f"({last['ckpt_shards']} shards written in parallel by the ranks, .metadata, manifest, "
        f"COMMITTED, and the attempt's own manifest/.metadata copies); torch.save file: "
        f"{last['torch_save_bytes']:,} bytes"
    )
    print(
        f"restore: newest committed step {r0['step']} loaded on 2 fresh processes in "
        f"{r0['load_s']:.3f} s; {r0['ranges_verified']} stored ranges CRC32C-verified; "
        f"{r0['tensors_compared']} tensors compared with the torch.save copy"
    )
    for rank, r in enumerate(restored):
        if r["mismatches"]:
            print(f"  rank {rank} mismatches: {', '.join(r['mismatches'][:10])}")
    print(f"verification: {'PASSED (bitwise equal on every rank)' if ok else 'FAILED'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="", help="working directory (default: a fresh temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the directory afterwards")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-every", type=int, default=8)
    a = p.parse_args(argv)
    if a.dir and os.path.exists(a.dir) and os.listdir(a.dir):
        print(f"{a.dir} is not empty; pass an empty or new directory", file=sys.stderr)
        return 2
    root = os.path.abspath(a.dir) if a.dir else tempfile.mkdtemp(prefix="ckptstore-demo-")
    os.makedirs(root, exist_ok=True)
    cfg = DemoConfig(root=root, steps=a.steps, save_every=a.save_every)

    from ckptstore.testing.dist import run_distributed

    model, opt = build(cfg, cfg.seed)
    n_params = sum(p.numel() for p in model.parameters())
    del model, opt
    print(
        f"ckptstore demo: MLP {cfg.d_in}-{cfg.hidden}-{cfg.hidden}-{cfg.classes} "
        f"({n_params / 1e6:.2f} M params, {n_params * 4 / 1e6:.1f} MB; with AdamW state "
        f"~{n_params * 12 / 1e6:.0f} MB), DDP on 2 gloo processes\ncheckpoints: "
        f"{cfg.ckpt_root}\ntorch.save copies: {cfg.ref_root}"
    )
    t0 = time.perf_counter()
    try:
        trained = run_distributed(train, 2, cfg)[0]
        t1 = time.perf_counter()
        restored = run_distributed(restore, 2, cfg)
        t2 = time.perf_counter()
        ok = report(cfg, trained, restored)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"demo took {time.perf_counter() - t0:.0f} s (train + saves {t1 - t0:.0f} s, restore "
        f"{t2 - t1:.0f} s, each including process start)" + (f"; kept {root}" if a.keep else "")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
