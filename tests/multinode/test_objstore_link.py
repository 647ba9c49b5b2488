"""Scenario 4: the object store unreachable from one node for a while.

The checkpoint root is a bucket on a real SeaweedFS; each node reaches it through a fault
proxy of its own (``harness.proxy``), as two machines reach a store over two links. Once
step 8 is committed everywhere, node 1's link resets every connection until two saves
have failed, then comes back. Every save fails or commits on all ranks alike (agreed by
the checkpoint's collective commit, not half the ranks), training goes on untouched (the
final state equals the uninterrupted run's bitwise), the first save after the link
returns commits, and every committed step verifies and holds the model it was saved with
(``harness.ckptcheck``); a failed step is never committed.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from examples.resilience.eventlog import tensor_crc
from harness.ckptcheck import audit_root
from harness.nodelog import goodput
from harness.proxy import FaultProxy, Rule
from tests.conftest import BUCKET
from tests.multinode.scenario import EVERY, STEPS, assert_same_final, job

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.server]

FAILED_SAVES = 2  # how many saves node 1's link stays down for


def test_store_unreachable_from_one_node_saves_fail_on_every_rank_and_training_goes_on(
    tmp_path, data, reference, seaweedfs
) -> None:
    d, root = str(tmp_path), f"s3://{BUCKET}/nodes-{uuid.uuid4().hex[:8]}"
    links = [FaultProxy(seaweedfs.port).start() for _ in range(2)]

    def node_args(i: int) -> list[str]:
        options = dict(seaweedfs.storage_options, endpoint_url=links[i].endpoint)
        return ["--storage-options", json.dumps(options)]

    extra = ("--lenient", "--retry-attempts", "2", "--step-delay", "0.2")
    try:
        with job(d, data, extra=extra, root=root, max_restarts=0, node_args=node_args) as nj:
            nj.start()
            nj.wait_commit(EVERY * 2)
            links[1].add(Rule("*", "reset"))  # node 1's link: every connection reset
            t_down = time.time()

            def failed_on_both() -> bool:
                failed = [e for e in nj.events("commit") if e["status"] == "failed"]
                return all(len([e for e in failed if e["node"] == n]) >= FAILED_SAVES
                           for n in (0, 1))  # fmt: skip

            nj.wait_until(f"{FAILED_SAVES} failed saves on both nodes", failed_on_both)
            links[1].clear()  # the link is back
            t_up = time.time()
            nj.wait()
    finally:
        for link in links:
            link.stop()

    assert_same_final(d, reference)  # the failed saves did not touch training
    commits = nj.events("commit")
    status = {(e["node"], e["step"]): e["status"] for e in commits}
    steps = sorted({s for _, s in status})
    assert steps == list(range(EVERY, STEPS + 1, EVERY))
    for step in steps:  # agreed: each save has one outcome on every rank
        assert status[(0, step)] == status[(1, step)], (step, status)
    failed = [s for s in steps if status[(0, s)] == "failed"]
    committed = [s for s in steps if status[(0, s)] == "committed"]
    assert len(failed) >= FAILED_SAVES and set(failed) | set(committed) == set(steps)
    after = [s for s in steps if s > max(failed)]
    assert after and status[(0, after[0])] == "committed"  # the next save after the outage
    saved_at = {e["step"]: e for e in nj.events("save") if e["node"] == 0}
    assert all(saved_at[s]["t1"] >= t_down - 5.0 for s in failed)
    audit = audit_root(
        root,
        storage_options=seaweedfs.storage_options,  # straight to the store
        expected={s: saved_at[s]["model_crc"] for s in committed},
        crc=tensor_crc,
    )
    assert audit.ok, audit.problems
    assert audit.committed == committed and audit.matched == committed
    assert not set(failed) & set(audit.committed)
    errors = {e["node"]: e["error"] for e in commits if e["status"] == "failed"}
    acct = goodput([nj], EVERY)
    print(f"link down {t_up - t_down:.2f} s; failed saves {failed}; errors: {errors}")
    print(f"torn prefixes left: {audit.torn}; verified {audit.bytes_verified} bytes")
    print(acct.format())
