"""DCP ``Stateful`` wrappers for a training state: model + optimizer, per-rank RNG states.

``AppState(model, optimizer)`` is the model and optimizer as one ``Stateful``, through
``torch.distributed.checkpoint.state_dict``'s ``get_state_dict`` / ``set_state_dict`` (which
handle DDP, FSDP and DTensor FQNs and optimizer state keyed by parameter name), so
``{"app": AppState(model, optim)}`` is a state a ``CheckpointManager`` saves and restores.
``RNGState`` captures Python ``random``, NumPy and torch (CPU and every CUDA device) RNG
states of *this* rank under the key ``rank<r>``, so each rank restores its own streams.
"""

from __future__ import annotations

import io
import pickle
import random
import warnings
from typing import Any

import numpy as np
import torch

from ckptstore.errors import CorruptCheckpointError, UnsafePickleError

__all__ = ["AppState", "RNGState", "capture_rng", "restore_rng"]

#: The globals a NumPy RNG state's pickle names (its MT19937 key is a uint32 array): each
#: resolves to a stand-in below, never to NumPy itself. Python's ``random`` state needs none.
_RECONSTRUCT = {
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),
}
_NDARRAY = ("numpy", "ndarray")
_DTYPE = ("numpy", "dtype")
_MT_WORDS = 624  # MT19937's key: 624 uint32 words


class _ArrayType:
    """Stands for ``numpy.ndarray`` in an RNG pickle (only ever passed to _reconstruct)."""


class _DType:
    """Stands for the ``numpy.dtype('u4')`` of an RNG pickle: only that dtype is accepted."""

    def __init__(self, name: Any, align: Any = False, copy: Any = True) -> None:
        if name != "u4" or type(align) is not bool or type(copy) is not bool:
            raise ValueError(f"dtype {name!r:.40} is not an RNG key's uint32")
        self.order = "<"

    def __setstate__(self, state: Any) -> None:
        # (version, byte order, subarray, names, fields, elsize, alignment, flags)
        if type(state) is not tuple or len(state) != 8 or state[1] not in ("<", ">", "=", "|"):
            raise ValueError("a uint32 dtype with a malformed state")
        if any(v is not None for v in state[2:5]) or state[7] != 0:
            raise ValueError("a dtype with fields or a sub-array")
        self.order = "<" if state[1] == "=" else state[1]


class _Array:
    """Stands for the MT19937 key array: checked to be 624 uint32 words, then built by
    ``key()`` from its raw bytes alone (no object dtype, nothing sized by the pickle)."""

    def __init__(self) -> None:
        self.raw: bytes | None = None
        self.order = "<"

    def __setstate__(self, state: Any) -> None:
        if type(state) is not tuple or len(state) != 5:
            raise ValueError("an array with a malformed state")
        version, shape, dtype, fortran, raw = state
        if version != 1 or shape != (_MT_WORDS,) or type(dtype) is not _DType:
            raise ValueError(f"an array of shape {shape!r:.40}, not the {_MT_WORDS}-word key")
        if type(fortran) is not bool or type(raw) is not bytes or len(raw) != 4 * _MT_WORDS:
            raise ValueError("an array whose data is not 624 uint32 words")
        self.raw, self.order = raw, dtype.order

    def key(self) -> np.ndarray:
        if self.raw is None:
            raise ValueError("an array without data")
        return np.frombuffer(self.raw, dtype=np.dtype(f"{self.order}u4")).astype(np.uint32)


def _reconstruct(cls: Any, shape: Any, kind: Any) -> _Array:
    if cls is not _ArrayType or shape != (0,) or kind != b"b":
        raise ValueError("an array reconstruction NumPy does not pickle")
    return _Array()


class _RNGUnpickler(pickle.Unpickler):
    """Loads RNG states only: any other global (a callable an attacker could name) is refused.

    The bytes come from a checkpoint root, which is untrusted ground: a checksum proves they
    are what the manifest says, not that the manifest's author meant well. Even NumPy's own
    array reconstruction is not called: an object-dtype array crashes NumPy from 111 bytes,
    and a 31-byte one can ask for gigabytes, so stand-ins check the one array an RNG state
    holds (``_Array``) before NumPy sees its bytes.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _RECONSTRUCT:
            return _reconstruct
        if (module, name) == _NDARRAY:
            return _ArrayType
        if (module, name) == _DTYPE:
            return _DType
        raise pickle.UnpicklingError(f"{module}.{name} is not part of an RNG state")


def _python_state(obj: Any) -> Any:
    """``obj`` if it is what ``random.getstate()`` returns (version 3: 625 words, a gauss)."""
    if (
        type(obj) is tuple
        and len(obj) == 3
        and obj[0] == 3
        and type(obj[1]) is tuple
        and len(obj[1]) == 625
        and all(type(w) is int and 0 <= w < 1 << 32 for w in obj[1][:624])
        and type(obj[1][624]) is int
        and (obj[2] is None or type(obj[2]) is float)
    ):
        return obj
    raise ValueError("not the state random.getstate() returns")


def _numpy_state(obj: Any) -> Any:
    """The tuple ``np.random.set_state`` takes, if ``obj`` is what ``np.random.get_state()``
    pickles: ('MT19937', 624-word key, position, has_gauss, cached_gaussian)."""
    if type(obj) is tuple and len(obj) == 5 and obj[0] == "MT19937" and type(obj[1]) is _Array:
        _, key, pos, has_gauss, gauss = obj
        if (
            type(pos) is int
            and 0 <= pos <= _MT_WORDS
            and type(has_gauss) is int
            and has_gauss in (0, 1)
            and type(gauss) is float
        ):
            return ("MT19937", key.key(), pos, has_gauss, gauss)
    raise ValueError("not the state np.random.get_state() returns")


def _load_rng(data: Any, which: str) -> Any:
    """The ``which`` ('python' or 'numpy') RNG state pickled in ``data``: a global other
    than NumPy's array reconstruction is ``UnsafePickleError``; anything else that is not
    exactly such a state (an object array, a key of another shape or size, a malformed
    pickle) is ``CorruptCheckpointError``: nothing of it reaches NumPy or ``random``."""
    try:
        obj = _RNGUnpickler(io.BytesIO(bytes(data))).load()
        return _python_state(obj) if which == "python" else _numpy_state(obj)
    except pickle.UnpicklingError as exc:
        if "is not part of an RNG state" not in str(exc):
            raise _malformed(which, exc) from None
        raise UnsafePickleError(
            f"the saved {which} RNG state is not a plain RNG state ({exc}); it was not "
            "unpickled. The checkpoint was not written by RNGState.state_dict(): restore "
            "without RNGState, or from a checkpoint you trust"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is the same refusal
        raise _malformed(which, exc) from None


def _malformed(which: str, exc: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"the saved {which} RNG state is malformed ({type(exc).__name__}: {str(exc)[:160]}); "
        "it was not loaded. The checkpoint is damaged: restore the previous one."
    )


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
    states only (``UnsafePickleError`` for any other global, ``CorruptCheckpointError``
    for a malformed state), both before either is set. The CUDA states are set only
    when CUDA is available here.
    """
    python = _load_rng(states["python"], "python")  # both checked before either is set
    numpy = _load_rng(states["numpy"], "numpy")
    random.setstate(python)
    np.random.set_state(numpy)
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(states["cuda"]))


class RNGState:
    """Per-rank RNG states as a DCP ``Stateful``: put it in the state dict next to the
    model and optimizer.

    Call order on restore (``CheckpointManager`` does it): ``expect_world_size(n)`` with
    the checkpoint's world size, then DCP calls ``state_dict()`` (to learn what to load)
    and ``load_state_dict()``, which ends the expectation: later ``state_dict()`` calls
    (saves) hold this rank's streams on the current world size. On the same world size
    every rank gets its exact streams back; on a different one every rank re-seeds
    deterministically from ``(seed, rank)`` and a warning says so.
    """

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
