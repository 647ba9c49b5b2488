"""An object item of a class torch's weights-only allowlist lacks: refused with a message
naming both fixes; allowed once the user adds the class with torch's own allowlist."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import ckptstore
from ckptstore.errors import UnsafePickleError


@dataclasses.dataclass
class Schedule:
    warmup: int


def test_the_refusal_names_add_safe_globals_and_ckptstore_honours_it(tmp_path) -> None:
    path = str(tmp_path / "step_000000001")
    ckptstore.save({"w": torch.ones(4), "sched": Schedule(7)}, path)
    out = {"w": torch.zeros(4), "sched": None}
    with pytest.raises(UnsafePickleError, match=r"add_safe_globals.*allow_pickle=True"):
        ckptstore.load(out, path)
    with torch.serialization.safe_globals([Schedule]):  # what add_safe_globals does, scoped
        ckptstore.load(out, path)
    assert out["sched"] == Schedule(7) and torch.equal(out["w"], torch.ones(4))
