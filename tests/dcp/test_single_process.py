"""ckptstore's own DCP calls in one process: the same result as dcp.save/load, no torch warning."""

from __future__ import annotations

import warnings

import torch
import torch.distributed.checkpoint as dcp

import ckptstore


class Counter:
    """A DCP Stateful that records how it was called."""

    def __init__(self, value: int) -> None:
        self.value, self.loaded = value, False

    def state_dict(self) -> dict:
        return {"value": torch.tensor([self.value])}

    def load_state_dict(self, sd: dict) -> None:
        self.value, self.loaded = int(sd["value"][0]), True


def test_save_load_and_manager_without_process_group_warn_nothing(tmp_path) -> None:
    url = str(tmp_path / "step_000000001")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning, torch's "distributed is disabled" included
        ckptstore.save({"w": torch.arange(6.0), "c": Counter(7)}, url)
        out = {"w": torch.zeros(6), "c": Counter(0)}
        ckptstore.load(out, url)
        mgr = ckptstore.CheckpointManager(str(tmp_path / "run"))
        assert mgr.save(3, {"w": torch.ones(2)})
        mgr.close()
        back = {"w": torch.zeros(2)}
        mgr = ckptstore.CheckpointManager(str(tmp_path / "run"))
        assert mgr.restore(back) == 3
        mgr.close()
    assert torch.equal(out["w"], torch.arange(6.0)) and out["c"].value == 7 and out["c"].loaded
    assert torch.equal(back["w"], torch.ones(2))
    # stock dcp.load reads what ckptstore.save wrote the same way (and does warn, being torch)
    stock = {"w": torch.zeros(6), "c": Counter(0)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(stock, storage_reader=ckptstore.reader(url))
    assert torch.equal(stock["w"], out["w"]) and stock["c"].value == 7
