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
from ckptstore.integrations import _folder, _folder_index  # noqa: E402
from ckptstore.integrations._codec import to_uint8  # noqa: E402
from ckptstore.integrations._folder import FILE_PREFIX, INDEX_KEY  # noqa: E402
from ckptstore.integrations.hf import CkptStoreAccelerate, CkptStoreCallback  # noqa: E402
from ckptstore.integrations.lightning import POINTER_FORMAT, CkptStoreIO  # noqa: E402
from ckptstore.manager import CheckpointManager  # noqa: E402
from ckptstore.manager.retention import KeepAll  # noqa: E402
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


def _pointer(root: str, step: int, follow: str = "step", **extra) -> bytes:
    doc = {"format": POINTER_FORMAT, "version": 1, "root": root, "step": step, "follow": follow}
    doc.update(extra)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("with_root", [True, False], ids=["configured-root", "no-root"])
def test_a_planted_pointer_never_prunes_another_runs_steps(tmp_path, with_root) -> None:
    """ModelCheckpoint's top-k removes a planted name: the run it points at keeps its steps."""
    other = tmp_path / "other-run"
    _run(other, tmp_path / "other-names", [1, 2, 3])
    names = tmp_path / "names"
    io = CkptStoreIO(str(tmp_path / "mine") if with_root else None, async_save=False)
    io.save_checkpoint(_ckpt(7), names / "s7.ckpt")
    (names / "epoch=0-step=1.ckpt").write_bytes(_pointer(str(other), 1))
    with pytest.warns(RuntimeWarning, match="neither its own directory nor the configured"):
        io.remove_checkpoint(names / "epoch=0-step=1.ckpt")
    assert committed(str(other)) == [1, 2, 3]
    assert sorted(os.listdir(names)) == (
        ["s7.ckpt"] if with_root else ["s7.ckpt", "step_000000007"]
    )
    io.teardown()


def test_a_planted_pointer_to_another_root_is_never_loaded(tmp_path) -> None:
    other = tmp_path / "other-run"
    _run(other, tmp_path / "other-names", [1, 2, 3])
    root, names = tmp_path / "mine", tmp_path / "names"
    _run(root, names, [5])
    io = CkptStoreIO(str(root))
    (names / "best.ckpt").write_bytes(_pointer(str(other), 3))
    with pytest.raises(UnsafePathError, match="other-run.*not followed"):
        io.load_checkpoint(names / "best.ckpt")
    # A "last" name means the newest committed step of the configured root, whatever it says.
    (names / "last.ckpt").write_bytes(_pointer(str(other), 3, "newest"))
    with pytest.warns(RuntimeWarning, match="newest committed step under .*mine"):
        assert io.load_checkpoint(names / "last.ckpt")["global_step"] == 5
    io.teardown()


_GOOD = json.loads(_pointer(".", 2))
MALFORMED_POINTERS = {
    "not-json": b"{not json",
    "not-utf8": b'{"format": "\xff\xfe"}',
    "a-list": b'[{"format": "ckptstore.lightning-pointer"}]',
    "another-format": json.dumps({**_GOOD, "format": "other"}).encode(),
    "missing-step": json.dumps({k: v for k, v in _GOOD.items() if k != "step"}).encode(),
    "missing-root": json.dumps({k: v for k, v in _GOOD.items() if k != "root"}).encode(),
    "extra-key": json.dumps({**_GOOD, "x": 1}).encode(),
    "step-a-string": json.dumps({**_GOOD, "step": "1"}).encode(),
    "step-a-bool": json.dumps({**_GOOD, "step": True}).encode(),
    "step-negative": json.dumps({**_GOOD, "step": -1}).encode(),
    "step-huge": json.dumps({**_GOOD, "step": 10**40}).encode(),
    "step-a-float": json.dumps({**_GOOD, "step": 1.0}).encode(),
    "root-a-number": json.dumps({**_GOOD, "root": 5}).encode(),
    "root-empty": json.dumps({**_GOOD, "root": ""}).encode(),
    "root-control-char": json.dumps({**_GOOD, "root": "/tmp/\x00x"}).encode(),
    "follow-unknown": json.dumps({**_GOOD, "follow": "all"}).encode(),
    "version-2": json.dumps({**_GOOD, "version": 2}).encode(),
    "deep-nesting": b"{" + b'"a":[' * 5000 + b"]" * 5000 + b"}",
    "oversized": b'{"format": "ckptstore.lightning-pointer", "pad": "' + b"x" * 70_000 + b'"}',
}


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


def test_a_damaged_name_beside_ours_stops_pruning_instead_of_guessing(tmp_path) -> None:
    """A name that cannot be read may have named any step: the prune deletes nothing."""
    root, names = tmp_path / "root", tmp_path / "names"
    io = CkptStoreIO(str(root), async_save=False)
    for step in (1, 2):
        io.save_checkpoint(_ckpt(step), names / f"s{step}.ckpt")
    bad = {k: v for k, v in json.loads(_pointer(str(root), 1)).items() if k != "step"}
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


def _index(step: int, name: str, path: str, files: dict[str, bytes]) -> dict:
    from ckptstore.engine.checksum import crc32c

    listing = {rel: {"size": len(b), "crc32c": crc32c(b) if b else 0} for rel, b in files.items()}
    return {"format": "ckptstore.folder", "version": 1, "name": name, "path": path,
            "files": listing, "extra": {}}  # fmt: skip


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
    _plant(root, 2, _index(2, name, str(tmp_path / "x_2"), files), files)
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
    _plant(root, 2, _index(2, "thesis_2", str(user), files), files)
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


def _mutations() -> dict[str, tuple[object, dict[str, bytes]]]:
    files = {"trainer_state.json": b"{}"}
    good = _index(2, "checkpoint-2", "/tmp/out/checkpoint-2", files)

    def m(**change: object) -> dict:
        return {**good, **change}

    entry = good["files"]["trainer_state.json"]
    return {
        "not-json": (b"{oops", files),
        "a-list": (b"[1, 2]", files),
        "another-format": (m(format="x"), files),
        "version-2": (m(version=2), files),
        "name-a-number": (m(name=2), files),
        "name-with-slash": (m(name="a/checkpoint-2"), files),
        "name-another-step": (m(name="checkpoint-3"), files),
        "name-hidden": (m(name=".ckptstore-uncommitted-2"), files),
        "path-relative": (m(path="out/checkpoint-2"), files),
        "path-not-normalised": (m(path="/tmp/x/../checkpoint-2"), files),
        "files-a-list": (m(files=["trainer_state.json"]), files),
        "files-missing": ({k: v for k, v in good.items() if k != "files"}, files),
        "file-escapes": (m(files={"../evil": entry}), {"../evil": b"{}"}),
        "file-absolute": (m(files={"/etc/evil": entry}), files),
        "file-size-a-string": (m(files={"trainer_state.json": {**entry, "size": "2"}}), files),
        "file-size-negative": (m(files={"trainer_state.json": {**entry, "size": -1}}), files),
        "file-size-lies": (m(files={"trainer_state.json": {**entry, "size": 1}}), files),
        "file-crc-too-big": (m(files={"trainer_state.json": {**entry, "crc32c": 2**40}}), files),
        "file-and-dir": (
            m(files={"a": entry, "a/b": entry}),
            {"a": b"{}", "a/b": b"{}"},
        ),
        "extra-a-string": (m(extra="x"), files),
    }


MALFORMED_INDEXES = _mutations()


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
    index = _index(2, "checkpoint-2", str(out / "checkpoint-2"), files)
    index["extra"] = {"pad": "y" * 4096}
    _plant(root, 2, index, files)
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
