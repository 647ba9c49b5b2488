"""A ckptstore checkpoint that stock ``dcp.save`` later overwrote in place: stock readers
load the new state, so ``ckptstore.reader`` must not silently load the old one (its
attempt-named copies are still there); it refuses the directory and says why."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.engine.committed import checkpoint_status
from ckptstore.errors import CorruptCheckpointError
from ckptstore.stores.local import LocalStore

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def test_a_directory_stock_dcp_overwrote_is_refused_not_loaded_stale(tmp_path) -> None:
    url = str(tmp_path / "step_000000001")
    dcp.save({"w": torch.zeros(4)}, storage_writer=ckptstore.writer(url), no_dist=True)
    dcp.save({"w": torch.ones(4)}, storage_writer=dcp.FileSystemWriter(url), no_dist=True)
    stock = {"w": torch.empty(4)}
    dcp.load(stock, storage_reader=dcp.FileSystemReader(url), no_dist=True)
    assert torch.equal(stock["w"], torch.ones(4))
    with pytest.raises(CorruptCheckpointError, match="another writer"):
        ckptstore.reader(url)
    assert checkpoint_status(LocalStore(url)) == "corrupt"  # ls and restore skip it


def test_a_commit_cut_short_before_its_canonical_copies_still_opens(tmp_path) -> None:
    """The legitimate case the rule must not catch: the canonical .metadata is ours but the
    canonical manifest is not written yet (a crash inside step 4)."""
    url = str(tmp_path / "step_000000002")
    dcp.save({"w": torch.arange(4.0)}, storage_writer=ckptstore.writer(url), no_dist=True)
    store = LocalStore(url)
    store.delete("ckptstore.manifest.json")
    out = {"w": torch.empty(4)}
    dcp.load(out, storage_reader=ckptstore.reader(url), no_dist=True)
    assert torch.equal(out["w"], torch.arange(4.0))
