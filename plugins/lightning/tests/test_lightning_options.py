"""``CkptStoreIO`` takes the manager's options as ``CheckpointManager`` does (one
``ManagerOptions``, or its fields as keywords), so every option reaches the managers it
makes, a new one with no edit here, and a wrong or renamed keyword is refused the same way."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("lightning")

from ckptstore import KeepAll, KeepLast, ManagerOptions  # noqa: E402
from ckptstore.errors import ConfigError  # noqa: E402
from ckptstore_lightning import CkptStoreIO, io  # noqa: E402
from tests.plugins.util import (  # noqa: E402
    CADENCES,
    ManagerSpy,
    assert_refuses_wrong_options,
    every_manager_option,
)

ROOT = "s3://bucket/run"  # an object store: storage_options reach it (a path takes none)


@pytest.mark.parametrize("how", ["keywords", "options"])
def test_every_manager_option_reaches_the_manager(tmp_path, monkeypatch, how) -> None:
    monkeypatch.setattr(io, "CheckpointManager", ManagerSpy)
    values = every_manager_option(tmp_path)
    keep = values.pop("keep")  # the IO's own pruning; its manager keeps every step
    for name in CADENCES:  # refused: Lightning decides when to save
        with pytest.raises(ConfigError, match=name):
            CkptStoreIO(ROOT, **{name: values[name]})
        values[name] = getattr(ManagerOptions(), name)
    if how == "keywords":
        ckpt = CkptStoreIO(ROOT, keep=keep, **values)
    else:
        ckpt = CkptStoreIO(ROOT, ManagerOptions(**values), keep=keep)
    mgr = ckpt.manager()
    assert isinstance(mgr, ManagerSpy) and mgr.root == ROOT
    for field in dataclasses.fields(ManagerOptions):
        got = getattr(mgr.options, field.name)
        assert got == (KeepAll() if field.name == "keep" else values[field.name]), field.name
    assert ckpt.keep == keep
    assert CkptStoreIO(ROOT).keep == KeepLast(1)  # ModelCheckpoint alone decides


def test_a_local_root_gets_no_storage_options(monkeypatch) -> None:
    monkeypatch.setattr(io, "CheckpointManager", ManagerSpy)
    ckpt = CkptStoreIO("/tmp/ckpts", storage_options={"anon": True})
    assert ckpt.manager().options.storage_options is None
    assert ckpt.manager("s3://b/r").options.storage_options == {"anon": True}


def test_wrong_options_are_refused_as_the_manager_refuses_them() -> None:
    assert_refuses_wrong_options(lambda **keywords: CkptStoreIO(ROOT, **keywords))
    with pytest.raises(ConfigError, match="pass keep= to CkptStoreIO"):
        CkptStoreIO(ROOT, ManagerOptions(keep=KeepLast(5)))
