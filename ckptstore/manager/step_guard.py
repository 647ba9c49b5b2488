"""``StepGuard``: which tensors a save may copy after ``save()`` returns, and the wait.

Staging behind the next step (``ManagerOptions.defer_staging``): the first thing in a
training loop that changes the saved parameters and optimizer state in place is the
optimizer's step, so those tensors may be copied on the save thread while the next
forward and backward run, if every such step waits for the copy first. The guard finds
the optimizers in the state a save is given (an ``Optimizer`` value, or an attribute of
one, as of ``AppState`` or DCP's tutorial wrappers), installs a step pre-hook on each
(once) and says which tensors they own: their parameters and state, by storage.
Everything else a save holds (buffers a forward changes, such as batch-norm statistics,
frozen parameters, the user's own tensors) is copied before ``save()`` returns.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["StepGuard", "find_optimizers"]


def find_optimizers(state: dict[str, Any]) -> list[torch.optim.Optimizer]:
    """The optimizers among ``state``'s values: an ``Optimizer``, or one an object holds
    as an attribute (alone, or in a list or tuple), as ``AppState`` and the app-state
    wrappers of DCP's tutorials do. Each once, in the order found."""
    found: list[torch.optim.Optimizer] = []
    for value in state.values():
        if isinstance(value, torch.optim.Optimizer):
            held: list[Any] = [value]
        elif isinstance(value, (torch.Tensor, torch.nn.Module, dict, list, tuple)):
            continue
        else:
            held = list(getattr(value, "__dict__", {}).values())
        for item in held:
            many = item if isinstance(item, (list, tuple)) else [item]
            found.extend(o for o in many if isinstance(o, torch.optim.Optimizer) and o not in found)
    return found


def _storages(optimizers: list[torch.optim.Optimizer]) -> set[int]:
    """The storage addresses of every parameter and state tensor of ``optimizers``."""
    ptrs: set[int] = set()
    for opt in optimizers:
        for group in opt.param_groups:
            ptrs.update(_ptr(p) for p in group["params"])
        for per_param in opt.state.values():
            ptrs.update(_ptr(v) for v in per_param.values() if isinstance(v, torch.Tensor))
    ptrs.discard(0)  # empty tensors have no storage to change
    return ptrs


def _ptr(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.untyped_storage().data_ptr())


class StepGuard:
    """The optimizers' step pre-hooks and the one deferred copy they wait for.

    Call order (training thread; the manager drives it)::

        defer = guard.deferrable(state)  # save(): None (copy everything now: no
                                         # optimizer found), else a predicate naming the
                                         # tensors the found optimizers' steps change;
                                         # hooks those optimizers (once each)
        guard.hold(wait)                 # save() deferred a copy: ``wait()`` returns once
                                         # it is done (the seconds the save records)
        waited = guard.wait()            # an optimizer's step (its pre-hook), or
                                         # CheckpointManager.wait_staged(): at once when
                                         # nothing is held
        guard.close()                    # removes the hooks
    """

    def __init__(self) -> None:
        self._hooks: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._held: Callable[[], float] | None = None

    def deferrable(self, state: dict[str, Any]) -> Callable[[torch.Tensor], bool] | None:
        """A predicate true for the tensors of ``state``'s optimizers (their parameters
        and state), or None when ``state`` holds no optimizer; hooks each one found."""
        optimizers = find_optimizers(state)
        if not optimizers:
            return None
        for opt in optimizers:
            if opt not in self._hooks:
                self._hooks[opt] = opt.register_step_pre_hook(self._before_step)
        ptrs = _storages(optimizers)
        return lambda t: t.numel() > 0 and _ptr(t) in ptrs

    def hold(self, wait: Callable[[], float]) -> None:
        """The next ``wait`` (a step, or ``wait_staged``) calls ``wait`` first."""
        self._held = wait

    def wait(self) -> float:
        """Wait for the deferred copy held, if any: the seconds it took."""
        held, self._held = self._held, None
        return held() if held is not None else 0.0

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.wait()

    def close(self) -> None:
        """Remove every hook (a held wait is dropped: the manager waited for its save)."""
        for handle in list(self._hooks.values()):
            handle.remove()
        self._hooks.clear()
        self._held = None
