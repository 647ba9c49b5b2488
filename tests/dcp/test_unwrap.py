"""unwrap_checkpoint_exception: the first rank's ckptstore error, as a copy naming the rank."""

import pickle
import traceback
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from ckptstore.api import unwrap_checkpoint_exception as public
from ckptstore.dcp.save_load import unwrap_checkpoint_exception
from ckptstore.errors import IncompleteCheckpointError, StagingMemoryError, StorageFullError


def _failures(**by_rank: BaseException) -> dict[int, Any]:
    """DCP's failures dict: rank -> (exception, stack) as DCP builds it."""
    return {int(k[1:]): (e, traceback.extract_stack()) for k, e in by_rank.items()}


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - the exception, with its traceback
        return caught


def test_the_first_ranks_error_names_its_rank_and_the_original_is_untouched() -> None:
    full = _raised(StorageFullError(28, "no space left"))
    full.__notes__ = ["a note"]  # what add_note (Python 3.11+) keeps
    full.hint = "free some space"  # type: ignore[attr-defined]
    missing = IncompleteCheckpointError("no marker")
    wrapped = CheckpointException("save failed", _failures(r1=missing, r0=full))

    got = unwrap_checkpoint_exception(wrapped)

    assert public is unwrap_checkpoint_exception  # the facade re-exports the dcp layer's
    assert type(got) is StorageFullError and got is not full
    assert str(got) == "[Errno 28] no space left (rank 0)" and got.errno == 28
    assert got.hint == "free some space" and got.__notes__ == ["a note"]  # type: ignore[attr-defined]
    assert got.__traceback__ is full.__traceback__
    assert full.args == (28, "no space left")  # the caller's exception is not changed
    assert str(unwrap_checkpoint_exception(wrapped)) == str(got)  # twice: the same text
    back = pickle.loads(pickle.dumps(got))  # it travels from a writer process
    assert type(back) is StorageFullError and str(back) == str(got)
    bare: dict[int, Any] = {1: missing, 0: RuntimeError("gloo")}  # no stack: also understood
    only_missing = CheckpointException("load failed", bare)
    got = unwrap_checkpoint_exception(only_missing)
    assert type(got) is IncompleteCheckpointError and got.args == ("no marker (rank 1)",)
    assert missing.args == ("no marker",)


def test_a_memory_error_is_named_too() -> None:
    """MemoryError's own __new__ refuses a subclass whose first base is CkptStoreError."""
    oom = StagingMemoryError("could not allocate 64 bytes")
    got = unwrap_checkpoint_exception(CheckpointException("save failed", _failures(r1=oom)))
    assert type(got) is StagingMemoryError and isinstance(got, MemoryError)
    assert str(got) == "could not allocate 64 bytes (rank 1)" and str(oom).endswith("bytes")


def test_an_exception_without_a_ckptstore_error_comes_back_as_it_is() -> None:
    other = CheckpointException("save failed", _failures(r0=RuntimeError("gloo")))
    assert unwrap_checkpoint_exception(other) is other
    plain = ValueError("x")
    assert unwrap_checkpoint_exception(plain) is plain
