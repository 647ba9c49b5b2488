"""StockCheckpointWarning names the caller's line, whichever way the reader was opened."""

from __future__ import annotations

import warnings

import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.dcp.reader import StockCheckpointWarning


def test_the_stock_checkpoint_warning_points_at_the_callers_line(tmp_path) -> None:
    path = str(tmp_path / "stock")
    dcp.save({"w": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    state = {"w": torch.zeros(3)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckptstore.load(state, path)
        ckptstore.reader(path)
    stock = [w for w in caught if issubclass(w.category, StockCheckpointWarning)]
    assert len(stock) == 2
    assert all(w.filename == __file__ for w in stock), [w.filename for w in stock]
    assert torch.equal(state["w"], torch.ones(3))
