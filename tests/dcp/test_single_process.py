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
        mgr = ckptstore.CheckpointManager(str(tmp_path / "run"), background="thread")
        assert mgr.save(3, {"w": torch.ones(2)})
        mgr.close()
        back = {"w": torch.zeros(2)}
        mgr = ckptstore.CheckpointManager(str(tmp_path / "run"), background="thread")
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


def test_a_process_group_of_one_rank_sends_nothing_through_its_collectives(
    tmp_path, monkeypatch
) -> None:
    """With an initialised group of one rank, DCP's collectives have no one to talk to:
    ckptstore's save and load (and the manager's) run DCP's steps without them (each
    would pickle every item's write result, the plans and the Metadata through gloo and
    back), and write what stock ``dcp.load`` reads."""
    import torch.distributed as dist

    calls: list[str] = []
    for name in (
        "gather_object",
        "scatter_object_list",
        "broadcast_object_list",
        "all_gather_object",
        "all_reduce",
        "barrier",
    ):
        real = getattr(dist, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(dist, name, spy)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        url = str(tmp_path / "step_000000001")
        ckptstore.save({"w": torch.arange(6.0), "c": Counter(7)}, url)
        out = {"w": torch.zeros(6), "c": Counter(0)}
        ckptstore.load(out, url)
        assert calls == []
        mgr = ckptstore.CheckpointManager(str(tmp_path / "run"), background="thread")
        assert mgr.save(1, {"w": torch.ones(2)})
        mgr.wait()
        first = len(calls)
        for step in (2, 3, 4):
            assert mgr.save(step, {"w": torch.full((2,), float(step))})
            mgr.wait()
        per_save = calls[first:]
        mgr.close()
        # per save, only the manager's own agreement (a MAX of one number) runs
        assert per_save == ["all_reduce"] * 3, per_save
    finally:
        dist.destroy_process_group()
    assert torch.equal(out["w"], torch.arange(6.0)) and out["c"].value == 7
    stock = {"w": torch.zeros(2)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(stock, storage_reader=ckptstore.reader(str(tmp_path / "run" / "step_000000004")))
    assert torch.equal(stock["w"], torch.full((2,), 4.0))
