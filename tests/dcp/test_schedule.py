"""CkptWriter's one hook: a WriteSchedule groups and orders a rank's shard files."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptstore.dcp.schedule import PlainSchedule
from ckptstore.dcp.writer import CkptWriter
from ckptstore.errors import ConfigError
from ckptstore.stores.local import LocalStore


class Recording(PlainSchedule):
    """One file per tensor, in reverse name order; records every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.order: list[str] = []

    def set_up(self) -> None:
        self.calls.append("set_up")

    def group(self, items, resolve, files_per_rank):
        self.calls.append(f"group({files_per_rank})")
        groups = sorted(([i] for i in items), key=lambda g: g[0].index.fqn, reverse=True)
        self.order = [g[0].index.fqn for g in groups]
        return groups

    def before_file(self, index: int) -> None:
        self.calls.append(f"before({index})")

    def after_file(self, index: int) -> None:
        self.calls.append(f"after({index})")

    def end(self) -> None:
        self.calls.append("end")


def state() -> dict:
    return {f"t{i}": torch.full((100,), float(i)) for i in range(3)}


def test_the_schedule_is_called_in_its_documented_order_and_groups_the_files(tmp_path):
    url = LocalStore(str(tmp_path / "step_000000001"))
    schedule = Recording()
    dcp.save(state(), storage_writer=CkptWriter(url, schedule=schedule), no_dist=True)
    assert schedule.calls == [
        "set_up", "group(1)", "before(0)", "after(0)", "before(1)", "after(1)",
        "before(2)", "after(2)", "end",
    ]  # fmt: skip
    assert schedule.order == ["t2", "t1", "t0"]
    files = sorted(n for n in url.find() if n.endswith(".distcp"))
    assert [n.split(".")[0] for n in files] == ["__0_0", "__0_1", "__0_2"]
    back = {k: torch.zeros(100) for k in state()}
    dcp.load(back, checkpoint_id=url.url, no_dist=True)
    assert all(torch.equal(back[k], v) for k, v in state().items())


def test_a_schedule_that_refuses_at_set_up_writes_nothing(tmp_path):
    class Refusing(PlainSchedule):
        def set_up(self) -> None:
            raise ConfigError("not this rank")

    url = LocalStore(str(tmp_path / "step_000000001"))
    with pytest.raises(BaseException, match="not this rank"):
        dcp.save(state(), storage_writer=CkptWriter(url, schedule=Refusing()), no_dist=True)
    assert url.find() == []
