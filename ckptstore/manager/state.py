"""DCP ``Stateful`` wrappers for a training state: model + optimizer, per-rank RNG states.

``AppState(model, optimizer)`` is the model and optimizer as one ``Stateful``, through
``torch.distributed.checkpoint.state_dict``'s ``get_state_dict`` / ``set_state_dict`` (which
handle DDP, FSDP and DTensor FQNs and optimizer state keyed by parameter name), so
``{"app": AppState(model, optim)}`` is a state a ``CheckpointManager`` saves and restores.

``RNGState`` is DCP-``Stateful``: put it in the state dict next to the model and
optimizer. It captures Python ``random``, NumPy and torch (CPU and every CUDA device) RNG
states of *this* rank under the key ``rank<r>``, so each rank restores its own streams.

Call order on restore (``CheckpointManager`` does it): ``expect_world_size(n)`` with the
checkpoint's world size, then DCP calls ``state_dict()`` (to learn what to load) and
``load_state_dict()``, which ends the expectation: later ``state_dict()`` calls (saves) hold
this rank's streams on the current world size. On the same world size every rank gets its
exact streams back; on a different one the old per-rank streams mean nothing, so every rank
re-seeds deterministically from ``(seed, rank)`` and a warning says so.
"""

from __future__ import annotations

import io
import pickle
import random
import warnings
from typing import Any

import numpy as np
import torch

from ckptstore.errors import UnsafePickleError

__all__ = ["AppState", "RNGState", "capture_rng", "restore_rng"]

#: The only globals an RNG state's pickle may name: NumPy's array reconstruction (the
#: MT19937 key is a uint32 array). Python's ``random`` state needs none (ints and tuples).
_RNG_GLOBALS = frozenset(
    {
        ("numpy._core.multiarray", "_reconstruct"),  # NumPy >= 2
        ("numpy.core.multiarray", "_reconstruct"),  # NumPy 1.x
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }
)


class _RNGUnpickler(pickle.Unpickler):
    """Loads RNG states only: any other global (a callable an attacker could name) is refused.

    The bytes come from a checkpoint root, which is untrusted ground: a checksum proves they
    are what the manifest says, not that the manifest's author meant well.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _RNG_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of an RNG state")
        return super().find_class(module, name)


def _load_rng(data: Any, which: str) -> Any:
    try:
        return _RNGUnpickler(io.BytesIO(bytes(data))).load()
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is the same refusal
        raise UnsafePickleError(
            f"the saved {which} RNG state is not a plain RNG state ({exc}); it was not "
            "unpickled. The checkpoint was not written by RNGState.state_dict(): restore "
            "without RNGState, or from a checkpoint you trust"
        ) from exc


class AppState:
    """A model and (optionally) its optimizer as one DCP ``Stateful``.

    ``state_dict()`` is ``{"model": ..., "optim": ...}`` from DCP's ``get_state_dict``
    (``{"model": ...}`` without an optimizer); ``load_state_dict()`` puts a loaded one back
    with ``set_state_dict``, in place. ``options`` is DCP's ``StateDictOptions`` (None: its
    defaults, sharded state for FSDP/DTensor models).
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any = None, options: Any = None):
        self.model, self.optimizer, self.options = model, optimizer, options

    def state_dict(self) -> dict[str, Any]:
        """``{"model": ..., "optim": ...}`` (``{"model": ...}`` without an optimizer)."""
        from torch.distributed.checkpoint import state_dict as sd

        if self.optimizer is None:
            return {"model": sd.get_model_state_dict(self.model, options=self.options)}
        model, optim = sd.get_state_dict(self.model, self.optimizer, options=self.options)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put ``state`` (as ``state_dict`` returns it) into the model and optimizer, in place."""
        from torch.distributed.checkpoint import state_dict as sd

        if self.optimizer is None:
            sd.set_model_state_dict(self.model, state["model"], options=self.options)
            return
        sd.set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.options,
        )


def _rank() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def capture_rng() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU, CUDA)."""
    out: dict[str, Any] = {
        "python": pickle.dumps(random.getstate()),
        "numpy": pickle.dumps(np.random.get_state()),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return out


def restore_rng(states: dict[str, Any]) -> None:
    """Set this process's RNG states from what ``capture_rng`` returned.

    The python and numpy states are unpickled by a restricted unpickler that accepts RNG
    states only (``UnsafePickleError`` for anything else). The CUDA states are set only
    when CUDA is available here.
    """
    random.setstate(_load_rng(states["python"], "python"))
    np.random.set_state(_load_rng(states["numpy"], "numpy"))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(states["cuda"]))


class RNGState:
    """Per-rank RNG states as a DCP ``Stateful``; see the module docstring."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._saved_world_size: int | None = None

    def expect_world_size(self, world_size: int | None) -> None:
        """The world size of the checkpoint about to be loaded (None: unknown, assume same)."""
        self._saved_world_size = world_size

    def _same_world(self) -> bool:
        return self._saved_world_size in (None, _rank()[1])

    def state_dict(self) -> dict[str, Any]:
        """``{"world_size": n, "rank<r>": capture_rng()}`` for this rank.

        While a load on a different world size is expected (``expect_world_size``), only
        ``{"world_size": n}``: the old ranks' streams are not asked for.
        """
        rank, world = _rank()
        if not self._same_world():
            return {"world_size": world}
        return {"world_size": world, f"rank{rank}": capture_rng()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's streams from ``state``, or re-seed them from ``(seed, rank)``.

        Re-seeds, with a warning, when the checkpoint's world size differs from this one or
        ``state`` holds no entry for this rank. Ends the ``expect_world_size`` expectation.
        """
        rank, world = _rank()
        key = f"rank{rank}"
        same = self._same_world()
        # The expected world size describes this load only: the checkpoints saved from now
        # on must hold this rank's streams again (else a restart on the new world size has
        # nothing to load).
        self._saved_world_size = None
        if key in state and same:
            restore_rng(state[key])
            return
        warnings.warn(
            f"RNG state was saved on {state.get('world_size', '?')} ranks and is restored on "
            f"{world}: per-rank streams cannot carry over, so rank {rank} is re-seeded "
            f"deterministically from (seed={self.seed}, rank={rank}).",
            stacklevel=2,
        )
        seed = self.seed * 1_000_003 + rank
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
