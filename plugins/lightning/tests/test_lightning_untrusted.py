"""The root rule in the integrations: every pointer and index they read back is untrusted.

Lightning's checkpoint names are JSON pointers to steps; the Hugging Face / Accelerate
folder plugins keep a JSON index of each uploaded folder. Whoever can write the names
directory or the checkpoint root can plant or damage them. These tests plant them, on a
real volume root, and drive the plugins as the frameworks do (``remove_checkpoint`` is what
``ModelCheckpoint``'s top-k calls; ``prepare_resume`` is what a resume calls):

* a pointer naming another root is refused: never loaded, never pruned through;
* an index never writes outside the local directory, and never moves a user's directory;
* a malformed pointer or index is a ``CorruptCheckpointError`` and the restore falls back
  to the previous good step.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from ckptstore.errors import ConfigError, CorruptCheckpointError, UnsafePathError  # noqa: E402
from ckptstore.integrations import _folder  # noqa: E402
from ckptstore.integrations._codec import to_uint8  # noqa: E402
from ckptstore.integrations._folder import FILE_PREFIX, INDEX_KEY  # noqa: E402
from ckptstore.integrations.hf import CkptStoreAccelerate, CkptStoreCallback  # noqa: E402
from ckptstore.integrations.lightning import CkptStoreIO  # noqa: E402
from ckptstore.manager import CheckpointManager  # noqa: E402
from ckptstore.manager.retention import KeepAll  # noqa: E402
from tests.adversarial.integration_inputs import (  # noqa: E402
    MALFORMED_INDEXES,
    MALFORMED_POINTERS,
    index_doc,
    pointer,
)
from tests.plugins.util import committed  # noqa: E402

# -- Lightning pointers --------------------------------------------------------------------


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
    io = CkptStoreIO(str(root))
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
    io = CkptStoreIO(str(root), keep=KeepAll())
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


# -- Hugging Face / Accelerate folder indexes -------------------------------------------------


def _good_step(root: str, out, step: int) -> None:
    """A real upload: ``out/checkpoint-<step>`` saved through FolderCheckpoints."""
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    fc = _folder.FolderCheckpoints(root, keep=KeepAll())
    fc.save(step, str(folder))
    fc.close()


def _plant(root: str, step: int, index: dict | bytes, files: dict[str, bytes]) -> None:
    """A crafted step, committed: as a writer of the root (re-signed files) would make it."""
    data = index if isinstance(index, bytes) else json.dumps(index).encode()
    flat = {INDEX_KEY: to_uint8(data)}
    flat.update({FILE_PREFIX + rel: to_uint8(b) for rel, b in files.items()})
    mgr = CheckpointManager(root, keep=KeepAll(), async_save=False)
    assert mgr.save(step, flat)
    mgr.close()


def _accelerate(project) -> CkptStoreAccelerate:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(project)))
    return CkptStoreAccelerate(str(project / "root"), keep=KeepAll()).register(acc)


def _tree(top) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top) for f in fs}


@pytest.mark.parametrize("name", ["../x", "../x_2", "..", "a/../../x_2"])
def test_an_index_name_never_writes_outside_the_local_dir(tmp_path, name) -> None:
    project = tmp_path / "proj"
    root = str(project / "root")
    _good_step(root, tmp_path / "saved", 1)
    files = {"evil.txt": b"planted"}
    _plant(root, 2, index_doc(2, name, str(tmp_path / "x_2"), files), files)
    ckpt = _accelerate(project)
    local = project / "restore"
    before = _tree(tmp_path) - _tree(project / "root")
    with pytest.warns(RuntimeWarning, match="step 2 could not be restored.*folder name"):
        path = ckpt.prepare_resume(str(local))
    assert path == str(local / "checkpoint-1")  # the previous good step
    after = _tree(tmp_path) - _tree(project / "root")
    assert after - before == {"proj/restore/checkpoint-1/trainer_state.json"}
    assert not (tmp_path / "x").exists() and not (tmp_path / "x_2").exists()
    ckpt.close()


@pytest.mark.parametrize("inside", [True, False], ids=["inside-project", "outside-project"])
def test_an_index_path_never_moves_or_replaces_a_users_directory(tmp_path, inside) -> None:
    project = tmp_path / "proj"
    root = str(project / "root")
    user = (project if inside else tmp_path / "home") / "thesis_2"
    user.mkdir(parents=True)
    (user / "chapter1.tex").write_text("years of work")
    files = {"model.safetensors": b"attacker"}
    _plant(root, 2, index_doc(2, "thesis_2", str(user), files), files)
    ckpt = _accelerate(project)
    with pytest.raises(ConfigError, match="local_dir"):
        ckpt.prepare_resume()  # no local_dir: the index's own path
    assert _tree(user) == {"chapter1.tex"}
    assert (user / "chapter1.tex").read_text() == "years of work"
    assert not (project / ".ckptstore-uncommitted").exists()
    assert not any(p.name.startswith(".thesis_2") for p in user.parent.iterdir())
    ckpt.close()


def test_an_index_path_inside_the_project_is_restored_when_free(tmp_path) -> None:
    """The documented default still works: no local_dir, the folder it was saved from."""
    project = tmp_path / "proj"
    ckpt = _accelerate(project)
    folder = project / "ckpts" / "step_4"
    folder.mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"1234")
    ckpt.folders.save(4, str(folder))
    ckpt.wait()
    (folder / "a.bin").unlink()
    folder.rmdir()
    assert ckpt.prepare_resume() == str(folder)
    assert (folder / "a.bin").read_bytes() == b"1234"
    ckpt.close()


@pytest.mark.parametrize(
    "index, files", MALFORMED_INDEXES.values(), ids=list(MALFORMED_INDEXES.keys())
)
def test_a_malformed_index_falls_back_to_the_previous_good_step(tmp_path, index, files) -> None:
    root, out = str(tmp_path / "root"), tmp_path / "out"
    _good_step(root, tmp_path / "saved", 1)
    _plant(root, 2, index, files)
    cb = CkptStoreCallback(root)
    with pytest.warns(RuntimeWarning, match="step 2 could not be restored"):
        path = cb.prepare_resume(str(out))
    assert path == str(out / "checkpoint-1")
    assert _tree(out) == {"checkpoint-1/trainer_state.json"}
    assert not (tmp_path / "evil").exists()
    cb.close()


def test_an_oversized_index_is_refused_before_it_is_loaded(tmp_path, monkeypatch) -> None:
    root, out = str(tmp_path / "root"), tmp_path / "out"
    _good_step(root, tmp_path / "saved", 1)
    files = {"f": b"x"}
    index = index_doc(2, "checkpoint-2", str(out / "checkpoint-2"), files)
    index["extra"] = {"pad": "y" * 4096}
    _plant(root, 2, index, files)
    from ckptstore.integrations import _folder_index  # new with the cap

    monkeypatch.setattr(_folder_index, "INDEX_MAX", 1024)
    loads: list[int] = []
    real = CheckpointManager.restore

    def counting(self, state, step=None, **kw):  # the index item must never be read
        loads.append(step)
        return real(self, state, step=step, **kw)

    monkeypatch.setattr(CheckpointManager, "restore", counting)
    cb = CkptStoreCallback(root)
    with pytest.warns(RuntimeWarning, match="step 2 could not be restored.*over 1024"):
        assert cb.prepare_resume(str(out)) == str(out / "checkpoint-1")
    assert 2 not in loads
    cb.close()


def test_a_newer_local_checkpoint_that_is_a_symlink_is_not_moved(tmp_path) -> None:
    root, out = str(tmp_path / "root"), tmp_path / "out"
    _good_step(root, tmp_path / "saved", 1)
    target = tmp_path / "elsewhere"
    target.mkdir()
    out.mkdir()
    os.symlink(target, out / "checkpoint-9")
    cb = CkptStoreCallback(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cb.prepare_resume(str(out)) == str(out / "checkpoint-1")
    assert os.path.islink(out / "checkpoint-9")
    cb.close()
