"""``dcp.save`` / ``dcp.load`` for ckptstore's own calls, quiet and direct in a single process.

Stock ``dcp.save`` / ``dcp.load`` warn "torch.distributed is disabled, unavailable or
uninitialized ..." on every call made without an initialised process group, even with
``no_dist=True``. A script that saves without ``torch.distributed`` means to, so with a
process group of several ranks :func:`save` and :func:`load` *are* ``dcp.save`` /
``dcp.load``, and without one, or with a group of one rank, they run the same steps
through DCP's own internal functions with ``no_dist`` (a torch without them gets the
stock call and its warning). Users calling ``dcp.save`` themselves get torch's
behaviour. :func:`unwrap_checkpoint_exception` turns DCP's ``CheckpointException`` into
the first rank's ckptstore error, and a state dict that does not match the checkpoint
into one ``StateDictMismatchError`` naming the key and shapes.
"""

from __future__ import annotations

import re
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from ckptstore.errors import CkptStoreError, StateDictMismatchError

try:  # DCP internals (torch >= 2.4); without them the stock calls are used
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    from torch.distributed.checkpoint.state_dict_saver import (
        _save_state_dict,
        _stateful_to_state_dict,
    )
except ImportError:  # pragma: no cover - depends on the torch version
    _save_state_dict = _load_state_dict = _stateful_to_state_dict = None  # type: ignore[assignment]

__all__ = ["save", "load", "unwrap_checkpoint_exception"]


def _single_process(process_group: Any) -> bool:
    """Whether the save or load involves this process alone: no process group, or a group
    (``process_group``, else the default one) of one rank. DCP's collectives then have no
    one to talk to, yet with a group they pickle every item's write result, the plans and
    the ``Metadata`` through gloo and back (~15 ms of the save thread's Python per save of
    the demo state, beside training); ``no_dist`` skips them, the steps are the same."""
    if _save_state_dict is None:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        return process_group is None
    return dist.get_world_size(process_group or dist.group.WORLD) == 1


def save(
    state_dict: dict[str, Any], storage_writer: Any, process_group: Any = None, planner: Any = None
) -> Any:
    """``dcp.save(state_dict, storage_writer=..., process_group=..., planner=...)``; see the
    module doc."""
    if not _single_process(process_group):
        return dcp.save(
            state_dict, storage_writer=storage_writer, process_group=process_group, planner=planner
        )
    return _save_state_dict(
        state_dict=_stateful_to_state_dict(state_dict),
        storage_writer=storage_writer,
        no_dist=True,
        planner=planner,
    )


def load(state_dict: dict[str, Any], storage_reader: Any, process_group: Any = None) -> None:
    """``dcp.load(state_dict, storage_reader=..., process_group=...)`` in place; see the doc."""
    if not _single_process(process_group):
        dcp.load(state_dict, storage_reader=storage_reader, process_group=process_group)
        return
    keys = sorted(state_dict)  # the order dcp.load uses
    loaded = {
        k: state_dict[k].state_dict() if isinstance(state_dict[k], Stateful) else state_dict[k]
        for k in keys
    }
    _load_state_dict(state_dict=loaded, storage_reader=storage_reader, no_dist=True)
    for k in keys:
        if isinstance(state_dict[k], Stateful):
            state_dict[k].load_state_dict(loaded[k])
        else:
            state_dict[k] = loaded[k]


def unwrap_checkpoint_exception(exc: BaseException) -> BaseException:
    """The first rank's ckptstore error inside DCP's ``CheckpointException``, else ``exc``.

    The error returned is a copy of that rank's (same type, attributes, traceback, cause
    and notes) whose message ends with `` (rank N)``; the exception inside ``exc`` is left
    as it was, so unwrapping twice never names the rank twice. Without a ckptstore error,
    DCP's planner refusing the state dict (a key the checkpoint lacks, another shape) is a
    ``StateDictMismatchError`` caused by that rank's error alone (not every rank's traces).
    """
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict):
        return exc
    errors = []
    for rank in sorted(failures):
        inner = failures[rank][0] if isinstance(failures[rank], tuple) else failures[rank]
        if isinstance(inner, CkptStoreError):
            return _with_rank(inner, rank)
        errors.append((rank, inner))
    for rank, inner in errors:
        mismatch = _mismatch(inner, rank)
        if mismatch is not None:
            return mismatch
    return exc


#: DCP's default load planner's refusals (torch 2.4 - 2.13): key, and saved / asked shapes.
_MISSING_KEY = re.compile(r"Missing key in checkpoint state_dict: (?P<key>.+?)\.?$", re.S)
_SIZE_MISMATCH = re.compile(
    r"Size mismatch between saved torch\.Size\((?P<saved>\[[^\]]*\])\) and current: "
    r"torch\.Size\((?P<asked>\[[^\]]*\])\) for (?P<key>.+?)\.?$",
    re.S,
)


def _mismatch(exc: BaseException, rank: int) -> StateDictMismatchError | None:
    """The ckptstore error for DCP's planner refusing the state dict on ``rank``, if so."""
    if not isinstance(exc, (ValueError, RuntimeError, KeyError)):
        return None
    text = str(exc.args[0]) if exc.args else str(exc)
    advice = (
        "Load into a state dict with the checkpoint's keys and shapes (`ckptstore-tool "
        "inspect URL` lists them); nothing was loaded"
    )
    if found := _MISSING_KEY.search(text):
        message = (
            f"the state dict to load asks for {found['key']!r}, which the checkpoint does not "
            f"hold. {advice} (rank {rank})"
        )
    elif found := _SIZE_MISMATCH.search(text):
        message = (
            f"{found['key']!r} has shape {found['asked']} in the state dict to load but "
            f"{found['saved']} in the checkpoint. {advice} (rank {rank})"
        )
    else:
        return None
    error = StateDictMismatchError(message)
    error.__cause__, error.__suppress_context__ = exc, True
    return error


def _with_rank(exc: CkptStoreError, rank: int) -> CkptStoreError:
    """A copy of ``exc`` whose message names ``rank``; ``exc`` itself is not changed."""
    args: tuple[Any, ...] = (f"{exc.args[0] if exc.args else exc} (rank {rank})",)
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror is not None:
        args = (exc.errno, f"{exc.strerror} (rank {rank})")  # "[Errno N] what (rank r)"
        args += tuple(f for f in (exc.filename, exc.filename2) if f is not None)
    cls = type(exc)
    try:
        fresh = cls.__new__(cls, *args)  # sets args; no __init__: its signature is the class's
    except TypeError:  # MemoryError's __new__ refuses a subclass with CkptStoreError first,
        try:  # whose instances BaseException's makes (as a call of the class does)
            fresh = BaseException.__new__(cls, *args)
        except Exception:  # noqa: BLE001 - a class whose __new__ wants more: leave it as is
            return exc
    except Exception:  # noqa: BLE001 - a class whose __new__ wants more: leave it as it is
        return exc
    fresh.__dict__.update(vars(exc))  # attributes and __notes__
    fresh.__cause__, fresh.__context__ = exc.__cause__, exc.__context__
    fresh.__suppress_context__ = exc.__suppress_context__
    return fresh.with_traceback(exc.__traceback__)
