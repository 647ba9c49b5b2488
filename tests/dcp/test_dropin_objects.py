"""Object items are not unpickled unless they load with ``weights_only=True`` (DCP's
default load planner would run any pickle with ``torch.load(weights_only=False)``);
``allow_pickle=True`` opts in. And ``use_collectives=False`` on several ranks (each rank
a checkpoint of its own in stock DCP) is refused at once on every rank."""

from __future__ import annotations

import io
import os
import pickle

import pytest
import torch

import ckptstore
from ckptstore.errors import ConfigError, UnsafePickleError
from harness.dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class _Payload:
    """Unpickling this creates a file (stands in for any code a tampered pickle runs)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.path, "w"))


def _tampered(tmp_path) -> tuple[str, str]:
    """A committed checkpoint whose object item ``cfg`` is a pickle that creates a file."""
    marker = str(tmp_path / "pwned")
    url = str(tmp_path / "step_000000001")
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf, pickle_protocol=pickle.DEFAULT_PROTOCOL)
    assert not os.path.exists(marker)
    # Saved through ckptstore as the writer of a tampered checkpoint would: its manifest
    # matches, so only the bytes' content can tell.
    ckptstore.save({"w": torch.ones(3), "cfg": _Opaque(buf.getvalue())}, url)
    return url, marker


class _Opaque:
    """An object whose DCP bytes are exactly ``data`` (the writer torch.saves objects)."""

    def __init__(self, data: bytes) -> None:
        self.data = data


@pytest.fixture
def tampered(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import default_planner

    real = default_planner.DefaultSavePlanner.resolve_data

    def resolve_data(self, write_item):  # type: ignore[no-untyped-def]
        obj = self.lookup_object(write_item.index)
        if isinstance(obj, _Opaque):
            return io.BytesIO(obj.data)
        return real(self, write_item)

    monkeypatch.setattr(default_planner.DefaultSavePlanner, "resolve_data", resolve_data)
    url, marker = _tampered(tmp_path)
    monkeypatch.undo()
    return url, marker


def test_a_tampered_object_item_is_not_unpickled(tampered) -> None:
    url, marker = tampered
    state = {"w": torch.zeros(3), "cfg": None}
    with pytest.raises(UnsafePickleError, match=r"'cfg'.*allow_pickle=True"):
        ckptstore.load(state, ckptstore.reader(url))
    assert not os.path.exists(marker)


def test_the_manager_refuses_it_too_and_does_not_fall_back(tampered) -> None:
    from ckptstore.manager import CheckpointManager

    url, marker = tampered
    with (
        CheckpointManager(os.path.dirname(url), background="thread") as mgr,
        pytest.raises(UnsafePickleError, match="'cfg'"),
    ):
        mgr.restore({"w": torch.zeros(3), "cfg": None})
    assert not os.path.exists(marker)


def test_allow_pickle_opts_in(tampered) -> None:
    url, marker = tampered
    state = {"w": torch.zeros(3), "cfg": None}
    ckptstore.load(state, ckptstore.reader(url, allow_pickle=True))
    assert os.path.exists(marker)  # the user trusted it: DCP unpickled it


def test_plain_objects_load_by_default(tmp_path) -> None:
    url = str(tmp_path / "step_000000002")
    saved = {"step": 5, "name": "run", "lr": 0.1, "sched": [1, 2, 3], "t": torch.ones(2)}
    ckptstore.save(dict(saved), url)
    got = {"step": 0, "name": "", "lr": 0.0, "sched": [0, 0, 0], "t": torch.zeros(2)}
    ckptstore.load(got, url)
    assert got["step"] == 5 and got["name"] == "run" and got["lr"] == 0.1
    assert got["sched"] == [1, 2, 3] and torch.equal(got["t"], saved["t"])


def _no_collectives(rank: int, world: int, url: str) -> str:
    import torch.distributed.checkpoint as dcp

    try:
        dcp.save(
            {f"r{rank}": torch.ones(4)}, storage_writer=ckptstore.writer(url), use_collectives=False
        )
    except ConfigError as exc:
        return str(exc)
    return "saved"


@pytest.mark.distributed
def test_use_collectives_false_is_refused_at_once_on_every_rank(tmp_path) -> None:
    url = str(tmp_path / "step_000000003")
    results = run_distributed(_no_collectives, 2, url)
    assert all("use_collectives=True" in r and "no_dist=True" in r for r in results), results
    assert not os.path.exists(url) or not os.listdir(url)
