"""Containment: no name from a caller, manifest, marker, ``.metadata`` or listing reads,
writes or deletes outside the root, on every store; symlinks are never followed.

Crafted checkpoints are real ones whose manifest (re-signed: a new marker matching it) or
``.metadata`` was rewritten the way an attacker with write access to the bucket would.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import warnings
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptstore.engine.catalog import SkippedEntryWarning, scan_root
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.committed import open_committed
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, FileEntry, Manifest, Marker
from ckptstore.engine.store import Multipart, Store
from ckptstore.errors import CorruptCheckpointError, UnsafePathError
from ckptstore.stores.local import LocalStore
from tests.cli.conftest import (
    Backend,
    sample_state,
    save_ckpt,
)
from tests.stores.conftest import STORE_FACTORIES

BAD_NAMES = [
    "../x",
    "a/../../x",
    "/etc/passwd",
    "a//b",
    "./a",
    "a/./b",
    "..",
    "a\\..\\b",
    "a\x00b",
    "a/b/",
    "",
]
BAD_PREFIXES = ["../x", "/abs", "a/../..", "a//b", "..", "a\x00"]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.server), "fsspec-memory"])
def any_store(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    factory, _ = STORE_FACTORIES[request.param]
    return factory(request, tmp_path)


def test_every_store_refuses_unsafe_names(any_store: Store) -> None:
    store = any_store
    store.put("ok/inside.bin", b"x")
    up = Multipart("../escape.bin", "id")
    buf = memoryview(bytearray(4))
    for name in BAD_NAMES:
        for method, args in (
            ("put", (name, b"evil")),
            ("put_if_absent", (name, b"evil")),
            ("get", (name,)),
            ("get_into", (name, 0, buf)),
            ("size", (name,)),
            ("exists", (name,)),
            ("delete", (name,)),
            ("delete_many", (["ok/inside.bin", name],)),
            ("begin_multipart", (name,)),
        ):
            with pytest.raises(UnsafePathError, match="refusing"):
                getattr(store, method)(*args)
    for prefix in BAD_PREFIXES:
        for method in ("child", "find", "listdir", "scan", "delete_prefix", "list_multipart"):
            with pytest.raises(UnsafePathError, match="refusing prefix"):
                getattr(store, method)(prefix)
    for method, args in (
        ("put_part", (up, 1, 0, b"x")),
        ("complete_multipart", (up, [])),
        ("abort_multipart", (up,)),
    ):
        with pytest.raises(UnsafePathError, match="escape"):
            getattr(store, method)(*args)
    # the refused delete_many deleted nothing, not even its safe name
    assert store.find() == ["ok/inside.bin"]
    # a child is contained too, and a safe prefix with a trailing '/' is the same prefix
    child = store.child("ok/")
    with pytest.raises(UnsafePathError):
        child.get("../inside.bin")
    assert child.get("inside.bin") == b"x" and store.find("ok/") == ["ok/inside.bin"]


def test_local_store_never_writes_outside_its_root(tmp_path) -> None:
    root = LocalStore(str(tmp_path / "root"))
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name in ("../victim", str(victim), "x/../../victim"):
        with pytest.raises(UnsafePathError):
            root.put(name, b"evil")
        with pytest.raises(UnsafePathError):
            root.delete(name)
    assert victim.read_bytes() == b"precious"
    # an upload id naming a file outside is not ours to touch
    with pytest.raises(UnsafePathError):
        root.abort_multipart(Multipart("a.bin", str(victim)))
    assert victim.read_bytes() == b"precious"
    # a store rooted at a file holds nothing: emptying it leaves the file
    on_file = LocalStore(str(victim))
    assert on_file.find() == []
    on_file.delete_prefix("")
    assert victim.read_bytes() == b"precious"


# -- crafted checkpoints ---------------------------------------------------------------
def resign(store: Store, mutate: Any, opens: bool = True) -> None:
    """Rewrite the committed manifest with ``mutate(manifest)`` and a marker matching it.

    ``opens=False``: the manifest names a file outside its step, which the manifest's own
    validation refuses (``CorruptCheckpointError``) before any store is asked for it."""
    committed = open_committed(store)
    manifest = Manifest.from_bytes(committed.manifest.to_bytes(), "test")
    mutate(manifest)
    data = manifest.to_bytes()
    store.put(MANIFEST_NAME, data)
    store.delete(MARKER_NAME)
    store.put(MARKER_NAME, Marker.for_manifest(data, manifest.step, "").to_bytes())
    if opens:
        assert open_committed(store).manifest.files == manifest.files  # it does open
    else:
        with pytest.raises(CorruptCheckpointError, match="not a relative name inside the step"):
            open_committed(store)


def test_cp_of_a_manifest_naming_dotdot_writes_and_deletes_nothing_outside(
    backend: Backend, root_url: str, cli: Any, tmp_path: Any
) -> None:
    src_url = save_ckpt(backend, f"{root_url}/src/step_000000001")
    src = backend.open(src_url)
    payload = b"attacker payload"
    backend.open(f"{root_url}/src").put("payload", payload)  # beside the step: ../payload
    dst_root = backend.open(f"{root_url}/dst")
    dst_root.put("victim", b"precious")  # DST/../victim

    def evil(m: Manifest) -> None:
        m.files["../payload"] = FileEntry(len(payload), crc32c(payload))
        m.files["../victim"] = FileEntry(3, 0)  # the copy of this one fails: cleanup runs

    good = {name: src.get(name) for name in (MANIFEST_NAME, MARKER_NAME)}
    resign(src, evil, opens=False)
    dst_url = f"{root_url}/dst/step_000000001"
    r = cli("cp", src_url, dst_url)
    assert r.rc == 1 and "'../payload'" in r.err and "Traceback" not in r.err
    assert dst_root.get("victim") == b"precious"
    assert not dst_root.exists("payload")
    assert backend.open(dst_url).find() == []
    # an absolute name: same refusal, and nothing written where it points
    target = tmp_path / "abs-target"

    def absolute(m: Manifest) -> None:
        m.files[str(target)] = FileEntry(3, 0)

    for name, data in good.items():  # back to the good manifest, then the next tamper
        src.put(name, data)
    resign(src, absolute, opens=False)
    r = cli("cp", src_url, dst_url)
    assert r.rc == 1 and repr(str(target)) in r.err and "Traceback" not in r.err
    assert not target.exists() and backend.open(dst_url).find() == []


def test_verify_never_reads_a_dotdot_entry_and_fails_the_checkpoint(
    backend: Backend, root_url: str, cli: Any
) -> None:
    url = save_ckpt(backend, f"{root_url}/step_000000001")
    store = backend.open(url)
    payload = b"outside the checkpoint"
    backend.open(root_url).put("payload", payload)
    assert cli("verify", url).rc == 0
    entry = FileEntry(len(payload), crc32c(payload))  # main counted it as a good file
    resign(store, lambda m: m.files.__setitem__("../payload", entry), opens=False)
    r = cli("verify", url, "--json")
    assert r.rc == 1, r.err
    assert "../payload" in r.out + r.err and "Traceback" not in r.err


def stock_with_absolute_item(backend: Backend, url: str, outside: str) -> None:
    """A stock DCP checkpoint whose ``.metadata`` points its first item at ``outside``."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sample_state(), storage_writer=dcp.FileSystemWriter(tmp), no_dist=True)
        with open(os.path.join(tmp, ".metadata"), "rb") as f:
            metadata = pickle.load(f)
        first = next(iter(metadata.storage_data))
        info = metadata.storage_data[first]
        info.relative_path = outside
        store = backend.open(url)
        for name in os.listdir(tmp):
            if name != ".metadata":
                with open(os.path.join(tmp, name), "rb") as f:
                    store.put(name, f.read())
        store.put(".metadata", pickle.dumps(metadata))


def test_convert_of_stock_metadata_naming_an_absolute_path_stays_inside(
    backend: Backend, root_url: str, cli: Any, tmp_path: Any
) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"S" * 4096)
    src_url = f"{root_url}/stock"
    stock_with_absolute_item(backend, src_url, str(secret))
    dst_url = f"{root_url}/dst"
    before = set(os.listdir(tmp_path))
    r = cli("convert", src_url, dst_url, "--to", "dcp")
    assert r.rc != 0 and "Traceback" not in r.err
    assert str(secret) in r.err
    assert set(os.listdir(tmp_path)) == before  # nothing written beside the secret
    assert secret.read_bytes() == b"S" * 4096
    assert backend.open(dst_url).find() == []  # the failed output was removed


# -- symlinks (volumes) ------------------------------------------------------------------
def _committed_root(tmp_path: Any, steps: tuple[int, ...]) -> tuple[str, Backend]:
    backend = Backend("volume", str(tmp_path / "store"))
    root = backend.url("run")
    for n in steps:
        save_ckpt(backend, f"{root}/step_{n:09d}", sample_state(step=n))
    return root, backend


def _tree(path: str) -> dict[str, bytes]:
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), path)] = fh.read()
    return out


def test_a_symlinked_step_is_skipped_never_followed(tmp_path, capsys) -> None:
    from ckptstore.cli.main import main
    from ckptstore.manager import CheckpointManager
    from ckptstore.manager.retention import KeepLast

    root, backend = _committed_root(tmp_path, (1, 2, 3))
    elsewhere = tmp_path / "elsewhere"
    save_ckpt(backend, str(elsewhere))  # ckptstore-named files a careless gc would take
    (elsewhere / "notes.txt").write_text("mine")
    before = _tree(str(elsewhere))
    os.symlink(elsewhere, os.path.join(root, "step_000000000"))
    with pytest.warns(SkippedEntryWarning, match="symlink"):
        listing = scan_root(LocalStore(root)).skipped
        from ckptstore.engine.catalog import list_steps

        assert [e.step for e in list_steps(LocalStore(root))] == [1, 2, 3]
    assert [s.name for s in listing] == ["step_000000000"]
    assert main(["ls", root]) == 0
    out = capsys.readouterr().out
    assert "step_000000000: skipped (a symlink" in out
    assert main(["gc", root, "--keep-last", "1"]) == 0
    out = capsys.readouterr().out
    assert "step_000000000: a symlink" in out
    assert _tree(str(elsewhere)) == before
    assert os.path.islink(os.path.join(root, "step_000000000"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedEntryWarning)
        with CheckpointManager(root, keep=KeepLast(1), background="thread") as mgr:
            mgr.save(4, {"w": torch.ones(3)})
        assert CheckpointManager(root, background="thread").steps() == [4]
    assert _tree(str(elsewhere)) == before
    # reading through the link is refused at the store
    with pytest.raises(UnsafePathError, match="symlink"):
        LocalStore(root).get("step_000000000/COMMITTED")
    with pytest.raises(UnsafePathError, match="symlink"):
        LocalStore(root).child("step_000000000").find()


def test_symlinks_inside_a_step_are_neither_read_nor_followed_on_delete(tmp_path, capsys) -> None:
    from ckptstore.cli.main import main

    root, _ = _committed_root(tmp_path, (1, 2))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "__0_0.distcp").write_bytes(b"not yours")
    (outside / "keep.bin").write_bytes(b"keep")
    step1 = os.path.join(root, "step_000000001")
    shard = next(n for n in os.listdir(step1) if n.endswith(".distcp"))
    os.remove(os.path.join(step1, shard))
    os.symlink(outside / "__0_0.distcp", os.path.join(step1, shard))  # a linked file
    os.symlink(outside, os.path.join(step1, "ab"))  # a linked dir (spread-layout name)
    store = LocalStore(step1)
    with pytest.raises(UnsafePathError, match="symlink"):
        store.get(shard)
    with pytest.raises(UnsafePathError, match="symlink"):
        store.size(shard)
    with pytest.raises(UnsafePathError, match="symlink"):
        store.get("ab/__0_0.distcp")
    assert shard not in store.find() and "ab/__0_0.distcp" not in store.find()
    r = main(["verify", step1])
    assert r != 0 and "Traceback" not in capsys.readouterr().err
    assert main(["gc", root, "--keep-last", "1"]) == 0
    assert _tree(str(outside)) == {"__0_0.distcp": b"not yours", "keep.bin": b"keep"}
    # our files went, marker first; the links themselves were not ours to delete
    assert sorted(os.listdir(step1)) == sorted([shard, "ab"])
