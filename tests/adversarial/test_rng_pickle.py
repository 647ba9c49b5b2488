"""An RNG state in a checkpoint is untrusted bytes: only a plain RNG state is unpickled."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

import ckptstore
from ckptstore.errors import UnsafePickleError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.state import RNGState


class _Evil:
    """Unpickling this runs ``os.system`` — what a hostile checkpoint would carry."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_rng_pickle_in_a_committed_checkpoint_is_refused(tmp_path) -> None:
    marker = str(tmp_path / "pwned")
    good = RNGState().state_dict()["rank0"]
    hostile = {**good, "python": pickle.dumps(_Evil(marker))}
    root = str(tmp_path / "root")
    # Another tool wrote a valid, committed checkpoint whose RNG entry is a hostile pickle.
    ckptstore.save(
        {"w": torch.ones(4), "rng": {"world_size": 1, "rank0": hostile}},
        f"{root}/step_000000005",
    )
    state = {"w": torch.zeros(4), "rng": RNGState()}
    with (
        CheckpointManager(root, background="thread") as mgr,
        pytest.raises(UnsafePickleError, match="python RNG"),
    ):
        mgr.restore(state)
    assert not os.path.exists(marker)  # nothing ran


def test_numpy_and_python_states_round_trip_through_the_restricted_unpickler() -> None:
    import random

    import numpy as np

    rng = RNGState()
    saved = rng.state_dict()
    a, b = random.random(), np.random.rand()
    rng.load_state_dict(saved)
    assert (random.random(), np.random.rand()) == (a, b)
