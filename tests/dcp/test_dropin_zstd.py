"""zstd both ways: ckptstore's ``WriterOptions(codec="zstd")`` checkpoints load in stock readers
(they use DCP's own ``ZStandard`` stream format and name it in ``.metadata``), and stock
checkpoints written with ``FileSystemWriter(_extensions=[ZStandard()])`` load in
``ckptstore.reader``."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._extension import ZStandard

import ckptstore
from ckptstore.config import WriterOptions
from ckptstore.dcp.reader import StockCheckpointWarning
from ckptstore.engine.committed import open_committed
from ckptstore.errors import CorruptCheckpointError
from ckptstore.stores.local import LocalStore

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _state() -> dict:
    return {
        "big": torch.arange(100_000, dtype=torch.float32).reshape(100, 1000),  # > direct-read
        "small": torch.tensor([1.5, -2.0]),
        "step": 12,
        "name": "run-a",
    }


def _blank() -> dict:
    return {"big": torch.zeros(100, 1000), "small": torch.zeros(2), "step": 0, "name": ""}


def _equal(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], v) if torch.is_tensor(v) else a[k] == v for k, v in b.items())


def test_ckptstore_zstd_checkpoint_loads_in_a_stock_reader(tmp_path) -> None:
    url = str(tmp_path / "step_000000012")
    ckptstore.save(_state(), ckptstore.writer(url, WriterOptions(codec="zstd")))
    assert open_committed(LocalStore(url)).manifest.codec == "zstd"
    stock = _blank()
    dcp.load(stock, storage_reader=dcp.FileSystemReader(url))
    assert _equal(stock, _state())
    ours = _blank()
    ckptstore.load(ours, url)
    assert _equal(ours, _state())


def test_stock_zstd_extension_checkpoint_loads_in_ckptstore(tmp_path) -> None:
    path = str(tmp_path / "stock")
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(path, _extensions=[ZStandard()]))
    got = _blank()
    with pytest.warns(StockCheckpointWarning):
        ckptstore.load(got, ckptstore.reader(path))
    assert _equal(got, _state())


def test_unknown_stream_transform_is_named(tmp_path) -> None:
    class Rot13(ZStandard):  # any transform ckptstore does not know
        @staticmethod
        def registry_name() -> str:
            return "stream.rot13"

    path = str(tmp_path / "stock")
    dcp.save({"t": torch.ones(3)}, storage_writer=dcp.FileSystemWriter(path, _extensions=[Rot13()]))
    with (
        pytest.warns(StockCheckpointWarning),
        pytest.raises(CorruptCheckpointError, match=r"stream\.rot13/1.*stream\.zstd/1"),
    ):
        ckptstore.load({"t": torch.zeros(3)}, ckptstore.reader(path))


def test_transcoded_checkpoints_load_in_stock_readers(tmp_path) -> None:
    from ckptstore.dcp.transcode import transcode
    from ckptstore.engine.transfer import TransferEngine

    src = str(tmp_path / "stock")
    dcp.save(_state(), storage_writer=dcp.FileSystemWriter(src, _extensions=[ZStandard()]))
    with TransferEngine() as engine, pytest.warns(StockCheckpointWarning):
        transcode(LocalStore(src), LocalStore(str(tmp_path / "zstd")), engine, codec="zstd")
    with TransferEngine() as engine:
        transcode(LocalStore(str(tmp_path / "zstd")), LocalStore(str(tmp_path / "raw")), engine)
    for name in ("zstd", "raw"):
        stock = _blank()
        dcp.load(stock, storage_reader=dcp.FileSystemReader(str(tmp_path / name)))
        assert _equal(stock, _state()), name
