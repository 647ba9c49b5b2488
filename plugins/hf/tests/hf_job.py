"""A tiny Transformers Trainer run: imported by the tests, and run as a script by the kill tests.

As a script it may run under ``torchrun`` (DDP on gloo); the main process writes what its
``Recorder`` saw to ``--record``.

The model is built from a config (never loaded from the Hub), with dropout off, and the
data is a fixed token set, so an interrupted-and-resumed run can be compared bit for bit
with an uninterrupted one.
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from ckptstore_hf import CkptStoreCallback  # noqa: E402


def tiny_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def snapshot(model: Any, optimizer: Any) -> dict[str, Any]:
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optim": copy.deepcopy(optimizer.state_dict()),
    }


class Recorder(TrainerCallback):
    """The step and state a run starts from, and its state after every step."""

    def __init__(self) -> None:
        self.start_step: int | None = None
        self.start: dict[str, Any] = {}
        self.by_step: dict[int, dict[str, Any]] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.start_step = state.global_step
        self.start = snapshot(kw["model"], kw["optimizer"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.by_step[state.global_step] = snapshot(kw["model"], kw["optimizer"])


def train(
    output_dir: str,
    root: str,
    max_steps: int,
    resume: bool | str = False,
    background: str = "auto",
) -> tuple[Trainer, Recorder, CkptStoreCallback]:
    """``resume``: True as the Trainer takes it; ``"auto"`` the documented pattern,
    ``resume_from_checkpoint=ckpt.resume_from`` (a fresh run or a resume alike).
    ``background``: ``CheckpointManager``'s (the default's unless a test needs one)."""
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=2,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        logging_steps=1000,
        disable_tqdm=True,
        seed=0,
    )
    recorder = Recorder()
    ckpt = CkptStoreCallback(root, background=background)
    trainer = Trainer(
        model=tiny_model(), args=args, train_dataset=Tokens(), callbacks=[ckpt, recorder]
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same float reduction order in every process
    try:
        trainer.train(
            resume_from_checkpoint=ckpt.resume_from if resume == "auto" else resume or None
        )
    finally:
        torch.set_num_threads(threads)
    ckpt.close()
    return trainer, recorder, ckpt


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--record", default=None, help="the main process writes its Recorder here")
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
    trainer, rec, _ = train(a.out, a.root, a.max_steps, resume=a.resume, background=background)
    if a.record and trainer.is_world_process_zero():
        torch.save(
            {"start_step": rec.start_step, "start": rec.start, "by_step": rec.by_step}, a.record
        )
    # The launcher's gloo group, destroyed before exit: a process that exits with one
    # alive can abort at interpreter exit (pytorch/pytorch#190489).
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
