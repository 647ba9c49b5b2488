"""A torchtitan-shaped training job on CPU gloo ranks, checkpointed by the plugin.

torchtitan's ``Trainer`` needs an accelerator, so the job builds what it hands its
checkpointer: a small model sharded with FSDP2 (``fully_shard``, DTensor parameters, as
torchtitan shards), torchtitan's own ``OptimizersContainer`` (AdamW) and
``LRSchedulersContainer``, a dataloader-like ``Stateful`` that, like torchtitan's, saves
its position as pickled bytes under a per-rank key, and a train state (the trainer's
``step``). ``train`` runs one rank: load, then train steps with ``save`` after each, as
``Trainer.train`` calls the manager.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch
from torch import nn

STEP_TOKENS = 8  # samples per rank per step


class Batches:
    """The data order: a deterministic stream per rank; its state is its position."""

    def __init__(self, rank: int) -> None:
        self.rank, self.position = rank, 0

    def next(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 * self.rank + self.position)
        self.position += 1
        return torch.randn(STEP_TOKENS, 16, generator=g)

    def state_dict(self) -> dict[str, Any]:
        return {f"dp_rank_{self.rank}": pickle.dumps({"position": self.position})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = pickle.loads(state[f"dp_rank_{self.rank}"])["position"]


class TrainState:
    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def _model(world: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def build(rank: int, world: int, **config: Any) -> tuple[Any, dict[str, Any]]:
    """The manager the plugin makes from ``config`` and the components it checkpoints."""
    from ckptstore_titan import CkptStoreCheckpointManager
    from torchtitan.components.optimizer import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw

    model = _model(world)
    opt_config = default_adamw(lr=1e-2)
    opt_config.implementation = "for-loop"
    optimizers = opt_config.build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
        optimizers=optimizers, training_steps=20
    )
    parts = {
        "model": model,
        "optimizers": optimizers,
        "lr_schedulers": schedulers,
        "dataloader": Batches(rank),
        "train_state": TrainState(),
    }
    manager = CkptStoreCheckpointManager.Config(enable=True, **config).build(
        dataloader=parts["dataloader"],
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": parts["train_state"]},
        sd_adapter=None,
    )
    return manager, parts


def snapshot(parts: dict[str, Any]) -> dict[str, Any]:
    """Everything a resume must restore: full tensors as their bytes (compared bitwise,
    and sent back to the test without shared memory), numbers as they are."""
    out: dict[str, Any] = {f"param/{k}": _bytes(v) for k, v in parts["model"].state_dict().items()}
    for k, v in parts["optimizers"].state_dict().items():
        if isinstance(v, torch.Tensor):
            out[f"optim/{k}"] = _bytes(v)
    out["lr"] = parts["lr_schedulers"].schedulers[0].get_last_lr()
    out["position"] = parts["dataloader"].position
    out["step"] = parts["train_state"].step
    return out


def _bytes(t: torch.Tensor) -> bytes:
    full = t.full_tensor() if hasattr(t, "full_tensor") else t
    return full.detach().contiguous().numpy().tobytes()


def train_step(parts: dict[str, Any]) -> None:
    x = parts["dataloader"].next()
    loss = parts["model"](x).pow(2).mean()
    loss.backward()
    parts["optimizers"].step()
    parts["lr_schedulers"].step()
    parts["optimizers"].zero_grad()
    parts["train_state"].step += 1


def train(
    rank: int,
    world: int,
    until: int,
    config: dict[str, Any],
    expected_at: str | None = None,
    load_step: int = -1,
) -> dict[str, Any]:
    """Load (``load_step``), train to step ``until``, calling ``save`` after each step
    (step ``until`` is the last step: torchtitan saves it synchronously); what the rank
    holds at the end, and whether and where it resumed. With ``expected_at``, each rank
    writes its snapshot there before the last step's save (a save may kill it)."""
    manager, parts = build(rank, world, **config)
    try:
        resumed = manager.load(step=load_step)
        start = parts["train_state"].step
        while parts["train_state"].step < until:
            manager.maybe_wait_for_staging()
            train_step(parts)
            step = parts["train_state"].step
            if expected_at and step == until:
                torch.save(snapshot(parts), os.path.join(expected_at, f"r{rank}.pt"))
            manager.save(step, last_step=step == until)
        manager.maybe_wait_for_saving()
    finally:
        manager.close()
    return {"resumed": resumed, "start": start, "state": snapshot(parts)}


def train_until_killed(rank: int, world: int, until: int, config: dict[str, Any], out: str) -> str:
    """``train`` where a save is meant to fail (a rank killed inside it): the survivors
    report how their save ended instead of raising."""
    try:
        train(rank, world, until, config, expected_at=out)
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        return f"save failed: {type(exc).__name__}"
    return "finished"
