"""A small, real training job for torchrun: tiny causal transformer, Parquet tokens, ckptstore.

    python examples/resilience/tokens.py /tmp/tokens
    torchrun --standalone --nproc-per-node 2 --max-restarts 3 examples/resilience/train.py \\
        --data /tmp/tokens --root /tmp/ckpts --local-tier /tmp/nvme --events /tmp/log

torchrun's defaults as they are: the process group comes from
``ckptstore.launch.init_process_group``, which meets in torchrun's shared store under a
namespace of the attempt's own, so a restarted group never reads the dead one's addresses.

It uses the three pieces a fault-tolerant loop needs: ``CheckpointManager`` (async saves,
verified resume, retention, SIGTERM preemption), ``RNGState`` (each rank's dropout stream)
and the ckptstore ``DataLoader`` (the data position: one cursor, exact on any world size).
``--global-batch`` stays fixed; each rank takes ``global / world`` samples, so a restart on
another number of processes trains on the same global batches.

Every rank logs, per step, the sample ids it consumed, the loss and timings, and each save
and restore with a checksum of the model + optimizer state (``eventlog.py`` beside it);
at the end it writes its final model, optimizer and RNG state to ``--out/final.rank<r>.pt``.
The repository's chaos harness kills and resizes this job; ``tools/demo.py`` drives the
whole story. Deterministic: same seeds and world size give bitwise the same run.
"""

from __future__ import annotations

import time

T_START = time.time()  # before the heavy imports: process start, for the goodput account

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="dataset URL (a directory of Parquet shards)")
    p.add_argument("--cache", default="", help="node-local data cache directory")
    p.add_argument("--root", required=True, help="checkpoint root URL")
    p.add_argument("--storage-options", default="{}", help="JSON storage options for --root")
    p.add_argument("--local-tier", default="", help="local tier directory (node-local NVMe)")
    p.add_argument("--events", default="", help="event log directory (default: the chaos run's)")
    p.add_argument("--out", default="", help="write final.rank<r>.pt here")
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--global-batch", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--keep", type=int, default=0, help="KeepLast(n); 0 keeps every checkpoint")
    p.add_argument(
        "--background",
        default="thread",
        choices=("thread", "process"),
        help="CheckpointManager(background=): where the background save runs",
    )
    p.add_argument(
        "--lenient",
        action="store_true",
        help="a failed save warns and training goes on (CheckpointManager strict=False)",
    )
    p.add_argument(
        "--retry-attempts", type=int, default=0, help="RetryConfig.attempts (0: the default)"
    )
    p.add_argument(
        "--step-delay", type=float, default=0.0, help="sleep this long per step (a bigger model)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=17)
    p.add_argument("--buckets", type=int, default=3)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ff", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument(
        "--torch-save-dir",
        default="",
        help="also time a rank-0 torch.save + fsync of the same state at each save (here)",
    )
    return p.parse_args(argv)


def build_model(a: argparse.Namespace) -> Any:
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(a.vocab, a.d_model)
            self.pos = nn.Embedding(a.seq_len, a.d_model)
            layer = nn.TransformerEncoderLayer(
                a.d_model, a.heads, a.ff, a.dropout, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, a.layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(a.d_model)
            self.head = nn.Linear(a.d_model, a.vocab)
            mask = nn.Transformer.generate_square_subsequent_mask(a.seq_len)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
            h = self.blocks(h, mask=self.mask, is_causal=True)
            return self.head(self.norm(h))

    return TinyLM()


class AppState:
    """Model + optimizer as one DCP Stateful (the DCP state_dict helpers do the FQN work)."""

    def __init__(self, model: Any, opt: Any) -> None:
        self.model, self.opt = model, opt

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(
            self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
        )


def state_crcs(app: AppState) -> tuple[str, str]:
    """Checksums of (model + optimizer state, model state) as the log records them."""
    from eventlog import tensor_crc  # beside this script

    sd = app.state_dict()
    return tensor_crc(sd), tensor_crc(sd["model"])


def torch_save_blocking(path: str, app: AppState, rank: int) -> tuple[float, int]:
    """Barrier, rank-0 torch.save of the same state + fsync, barrier: seconds and bytes."""
    import torch
    import torch.distributed as dist

    state = app.state_dict()
    dist.barrier()
    t0 = time.perf_counter()
    size = 0
    if rank == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
    dist.barrier()
    return time.perf_counter() - t0, size


class RestoreLog(logging.Handler):
    """Keeps the messages ``ckptstore.manager.restore`` logs (which tier a restore read)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        logger = logging.getLogger("ckptstore.manager.restore")
        logger.setLevel(logging.INFO)
        logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(argv: list[str] | None = None) -> None:
    from eventlog import RunLog, chaos_context  # beside this script (on sys.path as its folder)

    ctx = chaos_context()  # arms this attempt's crash point before anything saves
    a = parse_args(argv)
    import torch
    import torch.distributed as dist
    from tokens import collate, crop
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ckptstore import CheckpointManager, KeepAll, KeepLast, RNGState
    from ckptstore.config import RetryConfig, TransferConfig, WriterOptions
    from ckptstore.data import DataLoader, ShardedDataset
    from ckptstore.launch import init_process_group

    restore_log = RestoreLog()  # which tier each restore read, from the manager's log
    init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    log = RunLog(a.events or ctx.log_dir, ctx.segment, ctx.restart, rank)
    log.write("start", t=T_START, pid=os.getpid(), world=world, crash=ctx.crash)
    if a.global_batch % world:
        raise SystemExit(f"--global-batch {a.global_batch} is not divisible by {world} ranks")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    torch.manual_seed(a.seed)  # the same initial weights on every rank
    model = DDP(build_model(a))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    torch.manual_seed(a.seed * 1000 + 1 + rank)  # this rank's dropout stream
    ds = ShardedDataset(
        a.data,
        cache_dir=a.cache or None,
        seed=a.data_seed,
        buckets=a.buckets,
        transform=crop,
    )
    if ds.num_samples % a.global_batch:  # keeps every step full: no short or empty batches
        raise SystemExit(f"{ds.num_samples} samples are not a multiple of {a.global_batch}")
    loader = DataLoader(
        ds, batch_size=a.global_batch // world, num_workers=a.num_workers, collate_fn=collate
    )
    app = AppState(model, opt)
    state = {"app": app, "rng": RNGState(seed=a.seed), "data": loader}
    mgr = CheckpointManager(
        a.root,
        storage_options=json.loads(a.storage_options) or None,
        local_tier_dir=a.local_tier or None,
        keep=KeepLast(a.keep) if a.keep else KeepAll(),
        writer=WriterOptions(transfer=TransferConfig(retry=RetryConfig(attempts=a.retry_attempts)))
        if a.retry_attempts
        else WriterOptions(),
        strict=not a.lenient,
        handle_sigterm=True,
        background=a.background,
    )
    t = time.time()
    restored = mgr.restore(state)
    log.write(
        "ready",
        restored=restored,
        restore_s=time.time() - t,
        restore_log=restore_log.messages,
        cursor=loader.cursor,
        state_crc=state_crcs(app)[0],
    )
    save_t0: dict[int, float] = {}
    logged = 0  # how many of mgr.records were reported (saves finish in order)

    def report_commits() -> None:
        nonlocal logged
        while logged < len(mgr.records):
            r = mgr.records[logged]
            if r.status == "writing" or (r.status != "skipped" and not r.total_s):
                break  # still in flight (its timings are set last)
            log.write(
                "commit",
                step=r.step,
                status=r.status,
                blocking_s=r.blocking_s,
                step_waited_s=r.step_waited_s,
                waited_s=r.waited_s,
                staging_s=r.staging_s,
                background_s=r.background_s,
                total_s=r.total_s,
                bytes=r.bytes,
                error=r.error,
                t=save_t0.get(r.step, 0.0) + r.total_s,
            )
            logged += 1

    def save(step: int, final: bool = False) -> bool:
        """Save ``step`` (``final``: flush and save synchronously, on preemption)."""
        (crc, model_crc), cursor = state_crcs(app), loader.cursor
        t0 = time.time()
        if final:
            saved = mgr.finalize(step, state) or mgr.latest_step() == step
        else:
            saved = mgr.save(step, state)
        t1 = time.time()
        save_t0[step] = t0
        log.write(
            "save",
            step=step,
            t0=t0,
            t1=t1,
            saved=saved,
            cursor=cursor,
            state_crc=crc,
            model_crc=model_crc,
            final=final,
        )
        if a.torch_save_dir and not final:
            path = os.path.join(a.torch_save_dir, f"step_{step:09d}.pt")
            seconds, size = torch_save_blocking(path, app, rank)
            log.write("torch_save", step=step, seconds=seconds, bytes=size)
        return saved

    step = restored or 0
    loss_sum = torch.zeros(1)
    while step < a.steps:
        batches = iter(loader)  # leaves the global torch RNG (dropout) alone
        while step < a.steps:
            t0 = time.time()
            k0 = loader.cursor
            batch = next(batches, None)
            if batch is None:
                break  # the epoch is over: iterate the next one
            step += 1
            tokens = batch["tokens"]
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, a.vocab), tokens[:, 1:].reshape(-1)
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if a.step_delay:
                time.sleep(a.step_delay)
            loss_sum.copy_(loss.detach())
            dist.all_reduce(loss_sum)
            global_loss = loss_sum.item() / world
            if not math.isfinite(global_loss):
                raise FloatingPointError(f"loss is {global_loss} at step {step}")
            log.write(
                "step",
                step=step,
                t0=t0,
                t1=time.time(),
                k0=k0,
                epoch=k0 // ds.num_samples,
                ids=batch["id"].tolist(),
                loss=global_loss,
                local_loss=loss.item(),
            )
            if step % a.save_every == 0 or step == a.steps:
                save(step)
            report_commits()
            if mgr.preemption_requested():  # SIGTERM on any rank: all agree
                ok = save(step, final=True)
                report_commits()
                log.write("preempted", step=step, ok=ok)
                mgr.close()
                loader.close()
                dist.destroy_process_group()
                return
        del batches
    mgr.close()
    report_commits()
    log.write("end", step=step)
    if a.out:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, opt)
        os.makedirs(a.out, exist_ok=True)
        final = {"model": msd, "optim": osd, "rng": torch.get_rng_state(), "step": step}
        torch.save(final, os.path.join(a.out, f"final.rank{rank}.pt"))
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
