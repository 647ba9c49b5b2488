"""ckptstore.launch: ranks agree on a per-attempt namespace through a store that still
holds an earlier attempt's keys (as torchrun's shared store does after a restart)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from ckptstore.errors import ConfigError
from ckptstore.launch import BASE, _agree


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
