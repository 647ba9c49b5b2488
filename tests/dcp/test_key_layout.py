"""key_layout="spread": shard files under 256 sub-prefixes, loadable by every reader."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.config import WriterOptions
from ckptstore.dcp.writer import shard_prefix
from ckptstore.engine.committed import open_committed
from ckptstore.errors import ConfigError
from ckptstore.stores.local import LocalStore

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(128, 32, generator=g), "meta": {"step": 3}}


def test_shard_prefix_spreads_ranks_evenly_and_stably() -> None:
    assert shard_prefix(7, "flat") == "__7_"
    spread = [shard_prefix(r, "spread") for r in range(4096)]
    assert all(
        p[2] == "/" and int(p[:2], 16) < 256 and p.endswith(f"__{r}_") for r, p in enumerate(spread)
    )
    heads = [p[:2] for p in spread]
    assert len(set(heads)) == 256  # every sub-prefix used
    assert max(heads.count(h) for h in set(heads)) <= 3 * 4096 // 256  # none is hot
    assert shard_prefix(7, "spread") == shard_prefix(7, "spread")
    with pytest.raises(ConfigError, match="key_layout"):
        shard_prefix(0, "hashed")
    with pytest.raises(ConfigError, match="key_layout"):
        ckptstore.writer("/tmp/never-written", WriterOptions(key_layout="random"))


def test_spread_checkpoint_round_trips_and_loads_with_stock_reader(tmp_path) -> None:
    path = str(tmp_path / "step_000000003")
    ckptstore.save(state(), ckptstore.writer(path, WriterOptions(key_layout="spread")))
    manifest = open_committed(LocalStore(path)).manifest
    shards = [name for name in manifest.files if name.endswith(".distcp")]
    assert shards and all(name.startswith(shard_prefix(0, "spread")) for name in shards)
    assert os.path.isfile(os.path.join(path, shards[0]))
    for load in (
        lambda out: ckptstore.load(out, path),
        lambda out: dcp.load(out, storage_reader=dcp.FileSystemReader(path), no_dist=True),
    ):
        out = {"w": torch.zeros(128, 32), "meta": {"step": 0}}
        load(out)
        assert torch.equal(out["w"], state()["w"]) and out["meta"] == {"step": 3}


def test_manager_with_spread_layout_keeps_and_deletes_whole_steps(tmp_path) -> None:
    root = str(tmp_path / "run")
    with ckptstore.CheckpointManager(
        root,
        keep=ckptstore.KeepLast(1),
        async_save=False,
        writer=WriterOptions(key_layout="spread"),
    ) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, state())
        assert mgr.steps() == [3]
    assert sorted(os.listdir(root)) == ["step_000000003"]
    out = {"w": torch.zeros(128, 32), "meta": {"step": 0}}
    with ckptstore.CheckpointManager(
        root, writer=WriterOptions(key_layout="spread"), background="thread"
    ) as mgr:
        assert mgr.restore(out) == 3
    assert torch.equal(out["w"], state()["w"])


def test_two_managers_in_one_process_keep_their_own_layouts(tmp_path) -> None:
    """The manager caches DCP's save plan (which carries the shard prefixes): a second
    manager saving the same state with another key_layout gets its own plan, not the
    first manager's."""
    from ckptstore import CheckpointManager, ManagerOptions

    for layout in ("flat", "spread", "flat"):
        opts = ManagerOptions(writer=WriterOptions(key_layout=layout), async_save=False)
        with CheckpointManager(str(tmp_path / layout), options=opts) as mgr:
            mgr.save(1, state())
        files = open_committed(LocalStore(str(tmp_path / layout / "step_000000001"))).manifest.files
        shards = [n for n in files if n.endswith(".distcp")]
        assert shards and all(n.startswith(shard_prefix(0, layout)) for n in shards), shards
