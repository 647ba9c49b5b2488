"""The root rule in the Hugging Face plugin: every folder index it reads back is untrusted.

The Trainer and Accelerate plugins keep a JSON index of each uploaded folder. Whoever can
write the checkpoint root can plant or damage one. These tests plant them, on a real volume
root, and drive the plugins as a resume does (``prepare_resume``):

* an index never writes outside the local directory, and never moves a user's directory;
* a malformed index is a ``CorruptCheckpointError`` and the restore falls back to the
  previous good step.
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hf_inputs import MALFORMED_INDEXES, index_doc  # noqa: E402

from ckptstore import CheckpointManager, KeepAll  # noqa: E402
from ckptstore.errors import ConfigError  # noqa: E402
from ckptstore_hf import CkptStoreAccelerate, CkptStoreCallback, _folder, _folder_index  # noqa: E402
from ckptstore_hf._folder import FILE_PREFIX, INDEX_KEY  # noqa: E402


def _bytes(data: bytes) -> torch.Tensor:
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )


def _good_step(root: str, out, step: int) -> None:
    """A real upload: ``out/checkpoint-<step>`` saved through FolderCheckpoints."""
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    fc = _folder.FolderCheckpoints(root, keep=KeepAll(), background="thread")
    fc.save(step, str(folder))
    fc.close()


def _plant(root: str, step: int, index: dict | bytes, files: dict[str, bytes]) -> None:
    """A crafted step, committed: as a writer of the root (re-signed files) would make it."""
    data = index if isinstance(index, bytes) else json.dumps(index).encode()
    flat = {INDEX_KEY: _bytes(data)}
    flat.update({FILE_PREFIX + rel: _bytes(b) for rel, b in files.items()})
    mgr = CheckpointManager(root, keep=KeepAll(), async_save=False)
    assert mgr.save(step, flat)
    mgr.close()


def _accelerate(project) -> CkptStoreAccelerate:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(project)))
    return CkptStoreAccelerate(str(project / "root"), keep=KeepAll(), background="thread").register(
        acc
    )


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
    cb = CkptStoreCallback(root, background="thread")
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
    monkeypatch.setattr(_folder_index, "INDEX_MAX", 1024)
    loads: list[int] = []
    real = CheckpointManager.restore

    def counting(self, state, step=None, **kw):  # the index item must never be read
        loads.append(step)
        return real(self, state, step=step, **kw)

    monkeypatch.setattr(CheckpointManager, "restore", counting)
    cb = CkptStoreCallback(root, background="thread")
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
    cb = CkptStoreCallback(root, background="thread")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cb.prepare_resume(str(out)) == str(out / "checkpoint-1")
    assert os.path.islink(out / "checkpoint-9")
    cb.close()
