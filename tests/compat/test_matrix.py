"""The compatibility matrix: checkpoints written under each tested torch release (by
ckptstore's writer, its manager and stock ``dcp.save``: ``make_fixtures.py``, committed
under ``fixtures/``) read under the running one, by ckptstore's reader and manager and by
stock ``FileSystemReader``. ``make test-torch`` runs this on every tested release, so
every cell of writer release x reader release is a test.

What stock cannot do is asserted too: torch 2.13 / 2.14 cannot unpickle the ``.metadata``
torch 2.15's stock ``dcp.save`` writes (a sixth field, ``TensorProperties.strides``);
ckptstore's reader reads it there, and ckptstore's own writers write the oldest layout
(``ckptstore.dcp.metadata.dump_metadata``), so stock readers load theirs everywhere.
"""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.manager import CheckpointManager
from tests.compat.make_fixtures import FIXTURES, WRITERS, empty_state, expected_state, release
from tests.test_torch_range import TESTED

RELEASES = sorted(os.listdir(FIXTURES))


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release(version).split(".")[:2])


def _equal(got: dict, want: dict) -> bool:
    return got.keys() == want.keys() and all(
        torch.equal(got[k], want[k]) if isinstance(want[k], torch.Tensor) else got[k] == want[k]
        for k in want
    )


def _fixture(tmp_path, written: str, writer: str) -> str:
    """A copy of the fixture (a load may leave files in a root: the fixtures stay as made)."""
    src = os.path.join(FIXTURES, written, writer)
    dst = str(tmp_path / writer)
    shutil.copytree(src, dst)
    return dst


def test_every_tested_release_has_fixtures() -> None:
    assert RELEASES == [f"torch-{v}" for v in sorted(TESTED, key=_key)], (
        "run tests/compat/make_fixtures.py under each tested torch release"
    )


@pytest.mark.parametrize("written", RELEASES)
@pytest.mark.parametrize("writer", ["writer", "stock"])
def test_ckptstores_reader_loads_it(tmp_path, written: str, writer: str) -> None:
    path = _fixture(tmp_path, written, writer)
    out = empty_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a stock checkpoint: "without integrity verification"
        ckptstore.load(out, path)
    assert _equal(out, expected_state())


@pytest.mark.parametrize("written", RELEASES)
def test_the_manager_restores_it(tmp_path, written: str) -> None:
    root = _fixture(tmp_path, written, "manager")
    out = empty_state()
    with CheckpointManager(root, async_save=False) as mgr:
        assert mgr.restore(out) == 1
    assert _equal(out, expected_state())


@pytest.mark.parametrize("written", RELEASES)
@pytest.mark.parametrize("writer", WRITERS)
def test_stocks_reader_loads_it_where_stock_can(tmp_path, written: str, writer: str) -> None:
    path = _fixture(tmp_path, written, writer)
    if writer == "manager":
        path = os.path.join(path, "step_000000001")
    out = empty_state()
    newer_stock = writer == "stock" and _key(written[len("torch-") :]) > _key(torch.__version__)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ..."
        if newer_stock and _key(written[len("torch-") :]) >= (2, 15):
            # torch 2.15's stock layout does not unpickle before 2.15 (stock's own limit;
            # ckptstore's reader loads it: test_ckptstores_reader_loads_it)
            with pytest.raises(BaseException, match="too many values to unpack|metadata"):
                dcp.load(out, checkpoint_id=path, no_dist=True)
            return
        dcp.load(out, checkpoint_id=path, no_dist=True)
    assert _equal(out, expected_state())


@pytest.mark.parametrize("written", RELEASES)
@pytest.mark.parametrize("writer", ["writer", "manager"])
def test_inspect_names_the_releases_that_wrote_it(tmp_path, capsys, written, writer) -> None:
    from ckptstore.cli.main import main

    path = _fixture(tmp_path, written, writer)
    if writer == "manager":
        path = os.path.join(path, "step_000000001")
    assert main(["inspect", path]) == 0
    shown = capsys.readouterr().out
    assert f"by torch {written[len('torch-') :]}" in shown and ", ckptstore 0." in shown
