"""``NodeJob.kill_all`` leaves no process of a job behind: not the agents, not workers that
have not logged their start yet (torchrun gives each worker a session of its own, so
killing an agent's process group misses them), not what the workers started."""

from __future__ import annotations

import time

import pytest

from harness.nodes import _marked
from tests.multinode.scenario import job

pytestmark = [pytest.mark.distributed, pytest.mark.processes]


def test_kill_all_right_after_the_workers_started_leaves_no_process(tmp_path, data) -> None:
    with job(str(tmp_path), data) as nj:
        nj.start()
        # The agents have started their workers (each node: agent + worker processes),
        # which are still importing torch: none has logged its start.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            len(_marked(node.mark)) >= 2 for node in nj.nodes
        ):
            time.sleep(0.05)
        workers = {node.index: _marked(node.mark) for node in nj.nodes}
        assert all(len(pids) >= 2 for pids in workers.values()), workers
        nj.kill_all()  # raises NodeError if any of them were left
        assert not any(_marked(node.mark) for node in nj.nodes)
