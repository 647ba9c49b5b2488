"""A save that one rank cannot check the root for fails on every rank, and training goes on.

Two gloo ranks save to a bucket on a real SeaweedFS, each through a fault proxy of its
own (its link). With rank 1's link resetting every connection, ``save`` fails on both
ranks at once (the step's marker check is agreed): a failed record and a warning on each,
no rank left waiting in a collective; the next save after the link returns commits. With
``strict=True`` both ranks raise.
"""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import pytest

from harness.dist import run_distributed
from tests.conftest import BUCKET

pytestmark = [pytest.mark.distributed, pytest.mark.server, pytest.mark.slow]


def _body(rank: int, world_size: int, port: int, options: dict[str, Any], url: str) -> Any:
    import torch

    from ckptstore import CheckpointManager, KeepAll
    from ckptstore.config import RetryConfig, TransferConfig
    from ckptstore.errors import CkptStoreError
    from harness.proxy import FaultProxy, Rule

    link = FaultProxy(port).start()  # this rank's own link to the store
    mgr = CheckpointManager(
        url,
        storage_options=dict(options, endpoint_url=link.endpoint),
        keep=KeepAll(),
        async_save=False,
        config=TransferConfig(retry=RetryConfig(attempts=1)),
    )
    state = {"w": torch.arange(8.0)}
    out: dict[str, Any] = {"first": mgr.save(1, state)}
    if rank == 1:
        link.add(Rule("*", "reset"))  # the link goes down
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["down"] = mgr.save(2, state)
    out["record"] = (str(mgr.records[-1].status), mgr.records[-1].error)
    out["warned"] = [str(w.message) for w in caught if w.category is RuntimeWarning]
    if rank == 1:
        link.clear()  # back
    out["back"] = mgr.save(3, state)
    mgr._failures.strict = True  # from here on as if made with strict=True
    if rank == 1:
        link.add(Rule("*", "reset"))
    try:
        mgr.save(4, state)
        out["strict"] = "no error"
    except CkptStoreError as exc:
        out["strict"] = type(exc).__name__
    if rank == 1:
        link.clear()
    out["statuses"] = [(r.step, str(r.status)) for r in mgr.records]
    mgr.close()
    link.stop()
    return out


def test_one_rank_cannot_reach_the_root_the_save_fails_on_every_rank(seaweedfs) -> None:
    from ckptstore.engine.catalog import committed_steps
    from ckptstore.stores import open_store

    url = f"s3://{BUCKET}/unreachable-{uuid.uuid4().hex[:8]}"
    got = run_distributed(_body, 2, seaweedfs.port, seaweedfs.storage_options, url, timeout=120)
    for out in got:
        assert out["first"] and out["back"] and not out["down"], out
        assert out["statuses"] == [(1, "committed"), (2, "failed"), (3, "committed"),
                                   (4, "failed")], out  # fmt: skip
        assert out["record"][0] == "failed" and len(out["warned"]) == 1, out
        assert "step 2" in out["record"][1] or "step_000000002" in out["record"][1], out
        assert out["strict"] != "no error", out
    assert got[1]["record"][1].startswith("TransferError"), got[1]  # its own error
    assert "another rank could not reach" in got[0]["record"][1], got[0]
    assert list(committed_steps(open_store(url, seaweedfs.storage_options))) == [1, 3]
