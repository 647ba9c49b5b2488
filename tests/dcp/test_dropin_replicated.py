"""Fully replicated state (plain DDP: the same key and tensor on every rank): DCP's dedup
leaves a rank with an empty plan, which is normal on every path: the thread writer, the
staged writer (``local_tier_dir``), the manager's writer process, on a volume and on S3.
Each save is loaded bitwise on 2 ranks and on 1."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore.engine.committed import open_committed
from ckptstore.stores import open_store
from ckptstore.tier.tier_writer import TierWriter
from harness.dist import run_distributed

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def _replicated() -> dict[str, Any]:
    """One tensor, the same on every rank: one rank writes it, the other nothing."""
    return {"w": torch.arange(3000.0).reshape(60, 50)}


def _empty() -> dict[str, Any]:
    return {"w": torch.zeros(60, 50)}


def _same(got: dict[str, Any]) -> bool:
    return torch.equal(got["w"], _replicated()["w"])


def _save_and_load(rank: int, world: int, url: str, mode: str, tmp: str, options: Any) -> bool:
    if mode == "thread":
        ckptstore.save(_replicated(), ckptstore.writer(url, storage_options=options))
    elif mode.startswith("staged"):
        staging = os.path.join(tmp, "staging")
        if mode == "staged-coordinator-empty":  # the coordinator is the rank with nothing
            import warnings

            import torch.distributed.checkpoint as dcp

            w = TierWriter(url, tier=staging, storage_options=options)
            with warnings.catch_warnings():  # dcp.save has no coordinator_rank; this still does
                warnings.simplefilter("ignore", FutureWarning)
                dcp.save_state_dict(_replicated(), storage_writer=w, coordinator_rank=1)
            return _loaded(url, options)
        ckptstore.save(_replicated(), TierWriter(url, tier=staging, storage_options=options))
    else:  # the manager's writer process (writer_process.write_step), staged locally
        from ckptstore.manager import CheckpointManager

        root = url.rsplit("/", 1)[0]
        staging = os.path.join(tmp, "staging")
        with CheckpointManager(
            root, storage_options=options, local_tier_dir=staging, background="process", strict=True
        ) as mgr:
            mgr.save(5, _replicated())
            mgr.wait()
    return _loaded(url, options)


def _loaded(url: str, options: Any) -> bool:
    got = _empty()
    ckptstore.load(got, ckptstore.reader(url, storage_options=options))
    return _same(got)


def _check(url: str, options: Any, tmp: str, mode: str) -> list[str]:
    assert run_distributed(_save_and_load, 2, url, mode, tmp, options, daemon=False) == [True] * 2
    manifest = open_committed(open_store(url, options)).manifest
    assert manifest.world_size == 2
    shards = [n for n in manifest.files if n.endswith(".distcp")]
    assert len(shards) == 1  # one rank wrote
    got = _empty()
    ckptstore.load(got, ckptstore.reader(url, storage_options=options))  # on 1 rank
    assert _same(got)
    return shards


@pytest.mark.parametrize("mode", ["thread", "staged", "staged-coordinator-empty", "process"])
def test_replicated_state_on_a_volume(tmp_path, mode: str) -> None:
    shards = _check(str(tmp_path / "root" / "step_000000005"), None, str(tmp_path), mode)
    if mode == "staged-coordinator-empty":
        assert shards[0].startswith("__0_")  # rank 0 wrote; the coordinator (1) had nothing


@pytest.mark.server
@pytest.mark.parametrize("mode", ["thread", "staged"])
def test_replicated_state_on_s3(seaweedfs: Any, tmp_path, mode: str) -> None:
    from tests.conftest import BUCKET
    from tests.stores.conftest import unique

    url = f"s3://{BUCKET}/{unique('repl')}/step_000000005"
    _check(url, seaweedfs.storage_options, str(tmp_path), mode)
