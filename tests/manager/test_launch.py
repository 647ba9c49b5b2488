"""ckptstore.launch: ranks agree on a per-attempt namespace through a store that still
holds an earlier attempt's keys (as torchrun's shared store does after a restart)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from ckptstore import launch
from ckptstore.errors import ConfigError
from ckptstore.launch import BASE, _agree

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _attempt(master: dist.TCPStore, world: int, order: list[int]) -> list[str]:
    """Every rank of one attempt runs _agree on its own client; ranks start in ``order``."""
    tokens: dict[int, str] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        client = dist.TCPStore("127.0.0.1", master.port, is_master=False)
        try:
            tokens[r] = _agree(client, r, world, timedelta(seconds=20))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return [tokens[r] for r in range(world)]


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0]], ids=["rank0-first", "rank0-last"])
def test_every_attempt_gets_one_token_of_its_own_despite_stale_keys(order):
    master = _store()
    first = _attempt(master, 3, order)
    assert len(set(first)) == 1
    # the next attempt starts with the first one's join and joined keys still there
    assert master.check([f"{BASE}/join/1", f"{BASE}/{first[0]}/joined/2"])
    second = _attempt(master, 3, order)
    assert len(set(second)) == 1 and second[0] != first[0]


def test_a_rank_that_hears_nothing_from_rank_0_gets_a_clear_error():
    master = _store()
    client = dist.TCPStore("127.0.0.1", master.port, is_master=False)
    with pytest.raises(ConfigError, match="heard nothing from rank 0"):
        _agree(client, 1, 2, timedelta(seconds=0.3))


def test_rank_0_names_the_ranks_that_never_joined():
    master = _store()
    with pytest.raises(ConfigError, match=r"ranks \[1\] did not join"):
        _agree(master, 0, 2, timedelta(seconds=0.3))


@pytest.mark.parametrize(
    ("agent", "env", "want"),
    [
        (["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "t.py"], {}, "c10d"),
        (["python", "-m", "torch.distributed.run", "--rdzv_backend=c10d", "t.py"], {}, "c10d"),
        (["torchrun", "--rdzv-backend", "ckptstore-c10d", "t.py"], {}, "ckptstore-c10d"),
        (["torchrun", "t.py", "--rdzv-backend", "c10d"], {}, None),  # the script's own
        (["torchrun", "t.py"], {"PET_RDZV_BACKEND": "c10d"}, "c10d"),  # torchrun's env form
        (["torchrun", "--rdzv-backend=etcd", "t.py"], {"PET_RDZV_BACKEND": "c10d"}, "etcd"),
    ],
)
def test_the_agents_rendezvous_backend_is_read_as_torchrun_reads_it(agent, env, want) -> None:
    assert launch.rendezvous_backend(agent, env) == want


@pytest.mark.parametrize(
    ("backend", "nodes", "warned"),
    [("c10d", "2", True), ("ckptstore-c10d", "2", False), ("c10d", "1", False)],
)
def test_stock_c10d_on_several_nodes_is_warned_once(
    monkeypatch, caplog, backend, nodes, warned
) -> None:
    """A worker of a two-node job whose agent (here: this test's parent, which names no
    backend) runs with PET_RDZV_BACKEND: rank 0 warns once, naming the backend to use."""
    monkeypatch.setattr(launch, "_CHECKED", [])
    for name, value in {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "GROUP_WORLD_SIZE": nodes,
        "RANK": "0",
        "PET_RDZV_BACKEND": backend,
    }.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="ckptstore.launch"):
        launch.check_rendezvous()
        launch.check_rendezvous()
    lines = [r.getMessage() for r in caplog.records if r.name == "ckptstore.launch"]
    assert len(lines) == (1 if warned else 0)
    if warned:
        assert "--rdzv-backend ckptstore-c10d" in lines[0]


EXIT_SCRIPT = """
import atexit, os, sys
import torch, torch.distributed as dist
import ckptstore

out = sys.argv[1]
# registered first, so it runs after the hook init_process_group registers (LIFO)
atexit.register(lambda: open(f"{out}/{os.environ['RANK']}", "w").write(str(dist.is_initialized())))
ckptstore.launch.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
assert t.tolist() == [2.0] * 4
if sys.argv[2] == "destroy":
    dist.destroy_process_group()
if sys.argv[2] == "raise":
    raise RuntimeError("the program fails")
"""


@pytest.mark.distributed
@pytest.mark.parametrize("end", ["left-alive", "destroy", "raise"])
def test_a_group_it_made_is_destroyed_at_exit_if_the_program_did_not(tmp_path, end) -> None:
    """A program that ends its work with init_process_group's gloo group alive can abort at
    interpreter teardown (SIGABRT after its work succeeded, as CI saw once on the README's
    loop): the group is destroyed by an exit hook before then; one the program destroyed
    itself is left alone (no error at exit); a program that died of an exception exits
    without waiting on its group (its peers may be gone, its launcher waits for the exit)."""
    fails = end == "raise"
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run(
        [torchrun, "--nproc-per-node", "2", str(script), str(tmp_path), end],
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode != 0) == fails, proc.stderr[-3000:]
    assert [(tmp_path / r).read_text() for r in "01"] == [str(fails)] * 2  # still alive?
    assert ("Traceback" in proc.stderr) == fails
