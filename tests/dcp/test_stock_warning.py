"""StockCheckpointWarning names the caller's line, whichever way the reader was opened."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.dcp.reader import StockCheckpointWarning
from ckptstore.errors import CorruptCheckpointError


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


@pytest.mark.parametrize("garbage", [b"s", b"\x80\x02}(\xff", b"\x00"])
def test_a_stock_shard_of_garbage_is_a_corrupt_checkpoint(tmp_path, garbage: bytes) -> None:
    """Nothing verifies a stock checkpoint's shards: whatever torch.load raises on their
    bytes (the weights-only unpickler's IndexError on an empty stack, EOFError, ...)
    becomes one CorruptCheckpointError naming the item."""
    path = tmp_path / "stock"
    dcp.save({"w": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    for shard in path.glob("*.distcp"):  # the same size, other bytes
        size = shard.stat().st_size
        shard.write_bytes((garbage * size)[:size])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StockCheckpointWarning)
        with pytest.raises(CorruptCheckpointError, match="item w of .* is not a tensor record"):
            ckptstore.load({"w": torch.zeros(3)}, str(path))
