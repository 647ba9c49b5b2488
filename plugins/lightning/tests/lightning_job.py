"""A tiny Lightning run: imported by the tests, and run as a script by the kill tests.

As a script it may run several processes (``--devices 2 --strategy ddp``, under
Lightning's own launcher, which starts this script again for the other ranks, or under
``torchrun``); rank 0 writes what its ``Recorder`` saw to ``--record``.

Every batch is the same, so the weights after N steps depend only on N and on the model,
optimizer and scheduler state carried across a resume, not on where in an epoch
Lightning restarts its (non-resumable) data loader.
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from ckptstore_lightning import CkptStoreIO


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, sync_dist=True)  # what ModelCheckpoint(monitor=) ranks
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def data() -> DataLoader:
    x = torch.linspace(-1, 1, 16).view(4, 4)
    y = torch.stack([x.sum(1), x[:, 0] - x[:, 3]], 1)
    return DataLoader(TensorDataset(x.repeat(4, 1), y.repeat(4, 1)), batch_size=4)


def snapshot(trainer: L.Trainer) -> dict[str, Any]:
    module = trainer.lightning_module
    return {
        "model": {k: v.detach().clone() for k, v in module.state_dict().items()},
        "optim": copy.deepcopy(trainer.optimizers[0].state_dict()),
        "lr": trainer.optimizers[0].param_groups[0]["lr"],
    }


class Recorder(Callback):
    """The step and state a run starts from, and its state after every step."""

    def __init__(self) -> None:
        self.start_step: int | None = None
        self.start: dict[str, Any] = {}
        self.by_step: dict[int, dict[str, Any]] = {}

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.start_step = trainer.global_step
        self.start = snapshot(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.by_step[trainer.global_step] = snapshot(trainer)


def fit(
    dirpath: str,
    root: str | None,
    max_steps: int,
    ckpt_path: str | None = None,
    io: CkptStoreIO | None = None,
    devices: int = 1,
    strategy: str = "auto",
    **checkpoint_kwargs: Any,
) -> tuple[L.Trainer, Recorder]:
    torch.manual_seed(0)
    model = Tiny()
    recorder = Recorder()
    checkpoint_kwargs.setdefault("every_n_train_steps", 2)
    checkpoint_kwargs.setdefault("save_last", True)
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=dirpath,
        plugins=[io or CkptStoreIO(root)],
        callbacks=[ModelCheckpoint(dirpath=dirpath, **checkpoint_kwargs), recorder],
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float reduction order in every process
    try:
        trainer.fit(model, data(), ckpt_path=ckpt_path)
    finally:
        torch.set_num_threads(threads)
    return trainer, recorder


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--ckpt-path", default=None)
    p.add_argument("--top-k", type=int, default=None, help="save_top_k by train_loss")
    p.add_argument("--record", default=None, help="rank 0 writes its Recorder here")
    p.add_argument("--crash-at", default=None, help="CKPTSTORE_CRASH_AT, on --crash-rank only")
    p.add_argument("--crash-rank", type=int, default=0)
    a = p.parse_args()
    # Lightning's launcher starts this script again for ranks 1.. with LOCAL_RANK set (and
    # the parent's environment), so the crash point is armed here, per process. It kills the
    # process that reaches it: saves on the thread backend run in the trainer, so the rank
    # dies mid-save, as in a node failure (a writer process killed alone is
    # tests/manager/test_background_process.py's case). Every rank decides the backend the
    # same, from the arguments (it is agreed collectively).
    armed = a.crash_at or os.environ.get("CKPTSTORE_CRASH_AT")
    io = CkptStoreIO(a.root, background="thread") if armed else None
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    if a.crash_at and rank == a.crash_rank:
        os.environ["CKPTSTORE_CRASH_AT"] = a.crash_at
    top_k = {} if a.top_k is None else {"monitor": "train_loss", "save_top_k": a.top_k}
    trainer, rec = fit(
        a.dir, a.root, a.max_steps, a.ckpt_path, io, devices=a.devices, strategy=a.strategy, **top_k
    )
    if a.record and trainer.is_global_zero:
        torch.save(
            {
                "start_step": rec.start_step,
                "start": rec.start,
                "by_step": rec.by_step,
                "best_model_path": trainer.checkpoint_callback.best_model_path,
                "best_k_models": dict(trainer.checkpoint_callback.best_k_models),
            },
            a.record,
        )
    # The launcher's gloo group, destroyed before exit: a process that exits with one
    # alive can abort at interpreter exit (pytorch/pytorch#190489).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
