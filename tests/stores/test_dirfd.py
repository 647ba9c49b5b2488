"""``stores._dirfd``: volume paths resolved from the root's descriptor. Links below the
base are refused at every component, the base itself may be one, only regular files are
opened for reading, and no descriptor is left open by any call, failing ones included."""

from __future__ import annotations

import os

import pytest

from ckptstore.errors import CkptStoreError, StoreNotFoundError, UnsafePathError
from ckptstore.stores._dirfd import Anchor
from ckptstore.stores.local import LocalStore


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def tree(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "f.bin").write_bytes(b"f")
    outside.mkdir()
    (outside / "f.bin").write_bytes(b"outside")
    os.symlink(outside, root / "link")
    os.symlink(outside / "f.bin", root / "d" / "flink")
    os.mkfifo(root / "d" / "pipe")
    return root, outside


def test_a_link_at_any_component_below_the_base_is_refused(tree) -> None:
    root, outside = tree
    store = LocalStore(str(root))
    for act in (
        lambda: store.get("link/f.bin"),
        lambda: store.put("link/new.bin", b"x"),
        lambda: store.put_if_absent("link/new.bin", b"x"),
        lambda: store.delete("link/f.bin"),
        lambda: store.find("link"),
        lambda: store.scan("link"),
        lambda: store.begin_multipart("link/m.bin"),
        lambda: store.get("d/flink"),
        lambda: store.size("d/flink"),
        lambda: store.child("link").get("f.bin"),
        lambda: store.child("link").put("g.bin", b"x"),
    ):
        with pytest.raises(UnsafePathError, match="symlink"):
            act()
    assert sorted(os.listdir(outside)) == ["f.bin"]
    assert (outside / "f.bin").read_bytes() == b"outside"
    store.delete("d/flink")  # the link itself goes, never what it points to
    assert not os.path.lexists(root / "d" / "flink") and (outside / "f.bin").exists()


def test_the_base_as_given_may_be_a_link(tree, tmp_path) -> None:
    root, _ = tree
    os.symlink(root, tmp_path / "alias")
    store = LocalStore(str(tmp_path / "alias"))
    store.put("d/new.bin", b"n")
    assert store.get("d/new.bin") == b"n" and (root / "d" / "new.bin").exists()
    assert "d/e/f.bin" in store.find()


def test_listings_type_entries_without_following_links(tree) -> None:
    root, _ = tree
    store = LocalStore(str(root))
    kinds = {e.name: e.kind for e in store.scan("d")}
    assert kinds == {"e": "dir", "flink": "link", "pipe": "other"}
    assert store.find() == ["d/e/f.bin"]
    assert store.find("d/e/f.bin") == ["d/e/f.bin"]  # a prefix naming a file
    assert store.find("missing") == [] and store.scan("missing") == []


def test_missing_directories_are_made_and_empty_ones_removed(tmp_path) -> None:
    store = LocalStore(str(tmp_path / "new" / "root"))
    store.put("a/b/c.bin", b"c")
    assert (tmp_path / "new" / "root" / "a" / "b" / "c.bin").read_bytes() == b"c"
    (tmp_path / "new" / "root" / "a" / "x" / "y").mkdir(parents=True)
    store.delete("a/b/c.bin")
    store.remove_empty_dirs("a")
    assert not (tmp_path / "new" / "root" / "a").exists()


def test_a_path_component_that_leaves_its_directory_is_refused(tmp_path) -> None:
    anchor = Anchor(str(tmp_path))
    for bad in ("..", "a/../b", "a//b", "."):
        with pytest.raises(UnsafePathError):
            anchor.stat(bad)


def test_no_descriptor_is_left_open(tree) -> None:
    """A batch of every act, succeeding and failing (links, FIFO, missing, a file where a
    directory is expected), leaves exactly the descriptors it found."""
    root, _ = tree
    store = LocalStore(str(root))
    child = store.child("d")
    LocalStore(str(root)).get("d/e/f.bin")  # lazy imports and caches opened first
    before = _fds()
    for _ in range(3):
        store.put("d/a.bin", b"a")
        store.put_many([("d/b.bin", b"b"), ("d/e/c.bin", b"c")])
        store.put_if_absent("d/once.bin", b"1")
        store.put_if_absent("d/once.bin", b"1")
        up = store.begin_multipart("d/m.bin")
        store.complete_multipart(up, [store.put_part(up, 1, 0, b"m" * 100)])
        up = store.begin_multipart("d/gone.bin")
        store.abort_multipart(up)
        assert store.get("d/a.bin") == b"a" and child.get("m.bin") == b"m" * 100
        store.get_into("d/b.bin", 0, memoryview(bytearray(1)))
        store.size("d/a.bin")
        store.find(), store.scan("d"), store.listdir("d"), store.list_multipart()
        for failing in (
            lambda: store.get("link/f.bin"),
            lambda: store.get("d/pipe"),
            lambda: store.get("d/flink"),
            lambda: store.get("d/e"),
            lambda: store.get("d/missing"),
            lambda: store.get("d/a.bin/x"),
            lambda: store.put("d/a.bin/x", b"x"),
            lambda: store.put("link/x", b"x"),
            lambda up=up: store.put_part(up, 1, 0, b"x"),
            lambda: store.find("link"),
            lambda: store.child("link").find(),
            lambda: store.delete("d/e"),
            lambda: store.put_if_absent("d/e", b"x"),
        ):
            with pytest.raises(CkptStoreError):
                failing()
        store.delete("d/a.bin")
        store.delete("d/missing/a.bin")
        store.delete_prefix("d/e/none")
        store.remove_empty_dirs("d")
    assert _fds() - before == set()  # (others' threads may close theirs meanwhile)


def test_errors_are_ckptstore_errors_naming_what_is_there(tree) -> None:
    root, _ = tree
    store = LocalStore(str(root))
    with pytest.raises(UnsafePathError, match=r"d/pipe is a FIFO \(named pipe\), not a regular"):
        store.get("d/pipe")
    with pytest.raises(UnsafePathError, match="is a directory, not a regular file"):
        store.get("d/e")
    with pytest.raises(StoreNotFoundError):
        store.get("d/nothing")


def test_open_rw_creates_a_file_and_refuses_anything_but_one(tree) -> None:
    """``open_rw`` (a lock file, a ledger) creates a missing regular file or opens the one
    there; a link, FIFO or directory is refused at once, nothing written through it, and
    the base's name (``what``) is in the message."""
    root, outside = tree
    anchor = Anchor(str(root), what="cache directory")
    before = _fds()
    fd = anchor.open_rw("d/new.lock")
    try:
        os.pwrite(fd, b"12", 0)
        assert os.pread(fd, 2, 0) == b"12"
    finally:
        os.close(fd)
    fd = anchor.open_rw("d/new.lock")  # there now: opened as it is, not truncated
    try:
        assert os.pread(fd, 2, 0) == b"12"
    finally:
        os.close(fd)
    with pytest.raises(UnsafePathError, match=r"symlink; .* under a cache directory \("):
        anchor.open_rw("d/flink")
    with pytest.raises(UnsafePathError, match="symlink"):
        anchor.open_rw("link/new.lock")
    with pytest.raises(UnsafePathError, match="FIFO .* regular files under a cache directory"):
        anchor.open_rw("d/pipe")
    with pytest.raises(UnsafePathError, match="is a directory"):
        anchor.open_rw("d/e")
    with pytest.raises(FileNotFoundError):
        anchor.open_rw("d/missing/x.lock")
    assert _fds() - before == set()
    assert sorted(os.listdir(outside)) == ["f.bin"]
    assert (outside / "f.bin").read_bytes() == b"outside"
