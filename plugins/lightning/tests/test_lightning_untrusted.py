"""The root rule in the Lightning plugin: every pointer it reads back is untrusted.

Lightning's checkpoint names are JSON pointers to steps. Whoever can write the names
directory or the checkpoint root can plant or damage them. These tests plant them, on a
real volume root, and drive the plugin as Lightning does (``remove_checkpoint`` is what
``ModelCheckpoint``'s top-k calls):

* a pointer naming another root is refused: never loaded, never pruned through;
* a malformed pointer is a ``CorruptCheckpointError`` and "last" falls back to the newest
  committed step.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("lightning")

from lightning_inputs import MALFORMED_POINTERS, pointer  # noqa: E402

from ckptstore import KeepAll  # noqa: E402
from ckptstore.errors import CorruptCheckpointError, UnsafePathError  # noqa: E402
from ckptstore_lightning import CkptStoreIO  # noqa: E402
from tests.plugins.util import committed  # noqa: E402


def _ckpt(step: int) -> dict:
    return {"global_step": step, "state_dict": {"w": torch.full((4, 4), float(step))}}


def _run(root, names, steps: list[int]) -> None:
    """A finished run: ``steps`` committed under ``root``, each named ``s<step>.ckpt``."""
    io = CkptStoreIO(str(root), async_save=False, keep=KeepAll())
    for step in steps:
        io.save_checkpoint(_ckpt(step), names / f"s{step}.ckpt")
    io.teardown()


@pytest.mark.parametrize("with_root", [True, False], ids=["configured-root", "no-root"])
def test_a_planted_pointer_never_prunes_another_runs_steps(tmp_path, with_root) -> None:
    """ModelCheckpoint's top-k removes a planted name: the run it points at keeps its steps."""
    other = tmp_path / "other-run"
    _run(other, tmp_path / "other-names", [1, 2, 3])
    names = tmp_path / "names"
    io = CkptStoreIO(str(tmp_path / "mine") if with_root else None, async_save=False)
    io.save_checkpoint(_ckpt(7), names / "s7.ckpt")
    (names / "epoch=0-step=1.ckpt").write_bytes(pointer(str(other), 1))
    with pytest.warns(RuntimeWarning, match="neither its own directory nor the configured"):
        io.remove_checkpoint(names / "epoch=0-step=1.ckpt")
    assert committed(str(other)) == [1, 2, 3]
    expected = ["s7.ckpt"] if with_root else ["s7.ckpt", "step_000000007"]
    # with no root, the names' folder is the root: its live owner's lease is there too
    assert [n for n in sorted(os.listdir(names)) if n != "ckptstore.owner.json"] == expected
    io.teardown()
    assert sorted(os.listdir(names)) == expected  # the owner's lease goes at teardown


def test_a_planted_pointer_to_another_root_is_never_loaded(tmp_path) -> None:
    other = tmp_path / "other-run"
    _run(other, tmp_path / "other-names", [1, 2, 3])
    root, names = tmp_path / "mine", tmp_path / "names"
    _run(root, names, [5])
    io = CkptStoreIO(str(root), background="thread")
    (names / "best.ckpt").write_bytes(pointer(str(other), 3))
    with pytest.raises(UnsafePathError, match="other-run.*not followed"):
        io.load_checkpoint(names / "best.ckpt")
    # A "last" name means the newest committed step of the configured root, whatever it says.
    (names / "last.ckpt").write_bytes(pointer(str(other), 3, "newest"))
    with pytest.warns(RuntimeWarning, match="newest committed step under .*mine"):
        assert io.load_checkpoint(names / "last.ckpt")["global_step"] == 5
    io.teardown()


@pytest.mark.parametrize("data", MALFORMED_POINTERS.values(), ids=MALFORMED_POINTERS.keys())
def test_a_malformed_pointer_is_a_ckptstore_error_and_last_falls_back(tmp_path, data) -> None:
    root, names = tmp_path / "root", tmp_path / "names"
    _run(root, names, [1, 2])
    io = CkptStoreIO(str(root), keep=KeepAll(), background="thread")
    (names / "epoch=0-step=2.ckpt").write_bytes(data)
    with pytest.raises(CorruptCheckpointError, match="not followed|not read|not a valid"):
        io.load_checkpoint(names / "epoch=0-step=2.ckpt")
    (names / "last.ckpt").write_bytes(data)
    with pytest.warns(RuntimeWarning, match="newest committed step under"):
        assert io.load_checkpoint(names / "last.ckpt")["global_step"] == 2
    # Top-k removing the damaged name deletes that name only: no step is pruned through it.
    with pytest.warns(RuntimeWarning, match="removed the name only"):
        io.remove_checkpoint(names / "epoch=0-step=2.ckpt")
    assert not (names / "epoch=0-step=2.ckpt").exists()
    assert committed(str(root)) == [1, 2]
    io.teardown()


def test_a_symlinked_name_is_never_followed_and_only_the_link_is_removed(tmp_path) -> None:
    other_names = tmp_path / "other-names"
    _run(tmp_path / "other-run", other_names, [1, 2])
    root, names = tmp_path / "mine", tmp_path / "names"
    _run(root, names, [5])
    os.symlink(other_names / "s1.ckpt", names / "best.ckpt")
    io = CkptStoreIO(str(root))
    with pytest.raises(CorruptCheckpointError, match="symlink"):
        io.load_checkpoint(names / "best.ckpt")
    with pytest.warns(RuntimeWarning, match="removed the name only"):
        io.remove_checkpoint(names / "best.ckpt")
    assert not os.path.lexists(names / "best.ckpt")
    assert (other_names / "s1.ckpt").is_file()
    assert committed(str(tmp_path / "other-run")) == [1, 2]
    io.teardown()


def test_a_damaged_name_beside_ours_stops_pruning_instead_of_guessing(tmp_path) -> None:
    """A name that cannot be read may have named any step: the prune deletes nothing."""
    root, names = tmp_path / "root", tmp_path / "names"
    io = CkptStoreIO(str(root), async_save=False)
    for step in (1, 2):
        io.save_checkpoint(_ckpt(step), names / f"s{step}.ckpt")
    bad = {k: v for k, v in json.loads(pointer(str(root), 1)).items() if k != "step"}
    (names / "damaged.ckpt").write_text(json.dumps(bad))
    io.remove_checkpoint(names / "s1.ckpt")  # step 1 is named by nothing we can read
    assert committed(str(root)) == [1, 2]
    os.remove(names / "damaged.ckpt")
    io.remove_checkpoint(names / "s2.ckpt")  # now the names are clear: the prune runs
    assert committed(str(root)) == [2]  # the newest always stays
    io.teardown()


def test_a_stock_lightning_file_is_still_loaded_as_before(tmp_path) -> None:
    path = tmp_path / "stock.ckpt"
    torch.save(_ckpt(3), path)
    assert CkptStoreIO(str(tmp_path / "root")).load_checkpoint(path)["global_step"] == 3
