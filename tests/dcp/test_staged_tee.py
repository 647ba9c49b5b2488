"""The tier writer writes each shard's tier copy and its upload at once, one process."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptstore.config import RetryConfig, TransferConfig, WriterOptions
from ckptstore.engine.committed import open_committed
from ckptstore.errors import StoreAccessError
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore
from ckptstore.tier.rules import local_copy_matches
from ckptstore.tier.tier_writer import TierWriter

FAST = RetryConfig(attempts=2, base_backoff_s=0.01, max_backoff_s=0.02, deadline_s=10)
PART = 64 * 1024


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {f"t{i}": torch.randn(40_000 + i, generator=g) for i in range(3)} | {"n": 7}


def shards(store: LocalStore) -> dict[str, bytes]:
    return {n: store.get(n) for n in store.find() if n.endswith(".distcp")}


@pytest.mark.parametrize("budget_parts", [8, 1], ids=["tee", "budget-for-one-part"])
def test_local_copy_and_upload_are_identical_and_the_tier_matches(tmp_path, budget_parts):
    """With a budget for one part only the local file is written first, then uploaded."""
    root = LocalStore(str(tmp_path / "root"))
    url = root.child("step_000000001")
    cfg = TransferConfig(part_size=PART, memory_budget=budget_parts * PART, retry=FAST)
    w = TierWriter(
        url, tier=str(tmp_path / "nvme"), options=WriterOptions(transfer=cfg), files_per_rank=2
    )
    dcp.save(state(), storage_writer=w, no_dist=True)
    remote = shards(url)
    assert len(remote) == 2 and remote == shards(w.local)
    assert local_copy_matches(w.local, open_committed(url))
    back = {
        k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state().items()
    }
    dcp.load(back, checkpoint_id=url.url, no_dist=True)
    assert all(torch.equal(back[k], v) for k, v in state().items() if k != "n")


def test_a_failed_upload_keeps_the_complete_local_copy(tmp_path):
    inner = LocalStore(str(tmp_path / "root" / "step_000000001"))
    url = FaultyStore(inner, [Fault("put_part", calls={2}, error=StoreAccessError("link down"))])
    cfg = TransferConfig(part_size=PART, memory_budget=8 * PART, retry=FAST)
    w = TierWriter(
        url, tier=str(tmp_path / "nvme"), options=WriterOptions(transfer=cfg), files_per_rank=2
    )
    with pytest.raises(BaseException, match="the complete tier copy is kept") as err:
        dcp.save(state(), storage_writer=w, no_dist=True)
    assert "link down" in str(err.value)
    local = shards(w.local)
    good = TierWriter(
        LocalStore(str(tmp_path / "ok" / "step_000000001")),
        tier=str(tmp_path / "nvme2"),
        options=WriterOptions(transfer=cfg),
        files_per_rank=2,
    )
    dcp.save(state(), storage_writer=good, no_dist=True)
    # both files were still written locally, in full: as long as a good save's
    assert sorted(map(len, local.values())) == sorted(map(len, shards(good.local).values()))
    assert inner.list_multipart() == []  # the failed upload was aborted
    assert not inner.exists("COMMITTED")
