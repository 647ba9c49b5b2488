"""A tiny Accelerate loop with ``CkptStoreAccelerate``, run as a script by the multi-process tests.

Launched with ``accelerate launch --multi_gpu --num_processes N`` (Accelerate's torchrun
launcher; ``Accelerator(cpu=True)`` makes each process a CPU gloo rank). A Linear layer trains with
Adam + StepLR on the same full batch on every rank (so DDP's averaged gradient is the
same on any number of ranks), ``save_state()`` every 2 steps under automatic checkpoint
naming; with ``--resume`` the newest committed step is restored first. The main process
writes the step it started from and its state after every step to ``--record``.
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

from ckptstore_hf import CkptStoreAccelerate


class Counter:
    """The loop's own step, registered for checkpointing like any user object."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def run(
    project: str,
    root: str,
    until: int,
    resume: bool,
    tamper: Any = None,
    background: str = "auto",
) -> dict[str, Any]:
    """Train until step ``until`` (``save_state`` every 2 steps); what the run saw.
    ``background``: ``CheckpointManager``'s, the same on every rank.

    ``tamper(path)``, if given, runs on the restored folder before ``load_state`` reads it.
    Every process returns its own record (``world``: the number of processes).
    """
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    acc = Accelerator(cpu=True, project_config=config)
    model, opt, sched = acc.prepare(model, opt, sched)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    ckpt = CkptStoreAccelerate(root, background=background).register(acc)
    out: dict[str, Any] = {"path": None, "by_step": {}, "world": acc.num_processes}
    if resume:
        out["path"] = ckpt.prepare_resume()
        if tamper:
            tamper(out["path"])
        acc.load_state(out["path"])
    out["start"] = (counter.step, acc.project_configuration.iteration)

    def snap() -> dict[str, Any]:
        inner = acc.unwrap_model(model)
        return {
            "model": {k: v.detach().clone() for k, v in inner.state_dict().items()},
            "optim": copy.deepcopy(opt.state_dict()),
            "lr": sched.get_last_lr(),
        }

    out["start_state"] = snap()
    x = torch.linspace(-1, 1, 32).view(8, 4)
    y = torch.stack([x.sum(1), x[:, 0]], 1)
    while counter.step < until:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        counter.step += 1
        out["by_step"][counter.step] = snap()
        if counter.step % 2 == 0:
            acc.save_state()
    ckpt.close()
    # Accelerate's documented end: it destroys the process group. A process that exits
    # with a gloo group alive can abort at interpreter exit ("terminate called without an
    # active exception", pytorch/pytorch#190489).
    acc.end_training()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--project", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--until", type=int, required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--record", required=True)
    p.add_argument("--crash-at", default=None, help="CKPTSTORE_CRASH_AT, on --crash-rank only")
    p.add_argument("--crash-rank", type=int, default=0)
    a = p.parse_args()
    # A crash point kills the process that reaches it: saves on the thread backend run in
    # the trainer, so the rank dies mid-save, as in a node failure (a writer process killed
    # alone is tests/manager/test_background_process.py's case). Every rank decides the
    # same from the arguments (the backend is agreed collectively).
    background = "thread" if (a.crash_at or os.environ.get("CKPTSTORE_CRASH_AT")) else "auto"
    if a.crash_at and int(os.environ.get("RANK", "0")) == a.crash_rank:
        os.environ["CKPTSTORE_CRASH_AT"] = a.crash_at
    torch.set_num_threads(1)
    out = run(a.project, a.root, a.until, a.resume, background=background)
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(out, a.record)


if __name__ == "__main__":
    main()
