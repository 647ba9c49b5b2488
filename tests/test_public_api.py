"""The top-level ``ckptstore`` names: all resolve, and the exported errors are one list."""

from __future__ import annotations

import ckptstore
from ckptstore import errors


def test_every_name_in_all_resolves() -> None:
    assert [n for n in ckptstore.__all__ if not hasattr(ckptstore, n)] == []
    assert len(set(ckptstore.__all__)) == len(ckptstore.__all__)
    assert set(ckptstore.__all__) <= set(dir(ckptstore))


def test_exported_errors_are_errors_checkpoint_errors() -> None:
    exported = [n for n in ckptstore.__all__ if n.endswith("Error")]
    assert exported == errors.CHECKPOINT_ERRORS
    for name in exported:
        assert getattr(ckptstore, name) is getattr(errors, name)
        assert issubclass(getattr(errors, name), errors.CkptStoreError)
    assert not hasattr(ckptstore, "CacheTooSmallError")  # the data layer's stay in errors
