"""A small DDP training loop with CheckpointManager, run under torchrun by the tests.

Data comes from each rank's global torch RNG, so an exact resume needs the model, the
optimizer *and* the per-rank RNG state. At the end every rank writes its final model,
optimizer and RNG state to ``<out>.<rank>`` for bitwise comparison.
"""

import argparse
import os
import signal
from datetime import timedelta

if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":  # crash points: first attempt only
    for _name in ("CKPTSTORE_CRASH_AT", "CKPTSTORE_CRASH_RANK"):
        os.environ.pop(_name, None)

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP

from ckptstore.launch import init_process_group
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import KeepLast
from ckptstore.manager.state import RNGState


class AppState(Stateful):
    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt

    def state_dict(self) -> dict:
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, sd: dict) -> None:
        set_state_dict(
            self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--local-tier", default=None)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--preempt-at", type=int, default=-1, help="rank 1 gets SIGTERM at this step")
    p.add_argument("--background", default="thread", choices=("thread", "process"))
    p.add_argument("--kill-at", type=int, default=-1, help="first attempt: kill -9 at this step")
    p.add_argument("--kill-rank", type=int, default=1)
    args = p.parse_args()

    init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1000 + rank)  # per-rank data stream
    state = {"app": AppState(model, opt), "rng": RNGState(seed=1000)}
    mgr = CheckpointManager(
        args.root,
        local_tier_dir=args.local_tier,
        keep=KeepLast(2),
        strict=True,
        handle_sigterm=True,
        background=args.background,
    )
    restored = mgr.restore(state)
    first = 0 if restored is None else restored + 1
    if rank == 0:
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        print(f"resumed from {restored} (restart count {attempt})", flush=True)
    for step in range(first, args.steps):
        x = torch.randn(16, 32)
        loss = (model(x) - x.sum(dim=1, keepdim=True).sin()).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.preempt_at and rank == 1:
            if mgr._bg is not None:  # a scheduler signals the whole job: the writer too
                os.kill(mgr._bg.writer.proc.pid, signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        if mgr.preemption_requested():  # every rank agrees, whichever got the signal
            ok = mgr.finalize(step, state)
            mgr.close()
            print(f"preempted at step {step}; final checkpoint committed: {ok}", flush=True)
            dist.destroy_process_group()
            return
        if step % args.every == 0 or step == args.steps - 1:
            mgr.save(step, state)
        if step == args.kill_at and rank == args.kill_rank and first_attempt:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-upload when a save just started
    mgr.close()
    msd, osd = get_state_dict(model, opt)
    torch.save({"model": msd, "optim": osd, "rng": torch.get_rng_state()}, f"{args.out}.{rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
