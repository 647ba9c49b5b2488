"""A directory below a root swapped for a symlink while the volume store works in it
(issue #58, "Trust, round 4"): nothing outside the root is created, changed or deleted,
and every failure is a ckptstore error.

A child process renames the directory away, puts a link to an outside directory in its
place and puts the directory back, thousands of times a second, while the store writes,
reads, lists and deletes through that directory in a loop. The outside directory holds
sentinel files at exactly the names the store is asked to write and delete. A store that
checks a path and then uses it as a string loses this race within a second or two; one
that resolves each path from the root's descriptor (``stores._dirfd``) cannot.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptstore.stores.local import LocalStore
from tests.adversarial.swap import SENTINEL, Escaped, Swapper, hammer, seed_outside, snapshot

pytestmark = pytest.mark.processes

SECONDS = 4.0
#: Names the store is asked to write and delete, and ``only.bin`` and ``empty/``, which
#: only the outside directory holds: a store that reads, lists or prunes them escaped.
_NAMES = ["a.bin", "c.bin", "m.bin", "sub/x.bin", "sub/deep/y.bin", "COMMITTED", "only.bin"]
_NAMES += ["empty/", "sub/empty/"]


def _ops(store: LocalStore, d: str) -> list:
    """Every kind of volume path operation, on names the outside directory also holds."""
    pre = f"{d}/" if d else ""

    def multipart() -> None:
        up = store.begin_multipart(f"{pre}m.bin")
        try:
            part = store.put_part(up, 1, 0, b"m" * 5000)
            store.complete_multipart(up, [part])
        except BaseException:
            store.abort_multipart(up)
            raise

    def read(path: str) -> None:
        if store.get(path).startswith(SENTINEL):
            raise Escaped(f"read {path} outside the root")

    def absent(path: str) -> None:
        if store.exists(path):
            raise Escaped(f"found {path} outside the root")

    def listed(names: list[str]) -> None:
        if any("only.bin" in n or "empty" in n for n in names):
            raise Escaped(f"listed outside the root: {names}")

    return [
        lambda: store.put(f"{pre}a.bin", b"written by the store"),
        lambda: store.put_many([(f"{pre}sub/x.bin", b"x"), (f"{pre}sub/deep/y.bin", b"y")]),
        lambda: store.put_if_absent(f"{pre}COMMITTED", b"marker"),
        lambda: read(f"{pre}a.bin"),
        lambda: read(f"{pre}only.bin"),
        lambda: absent(f"{pre}only.bin"),
        multipart,
        lambda: listed(store.find(d)),
        lambda: listed([e.name for e in store.scan(d)]),
        lambda: listed(store.listdir(d)),
        lambda: listed([u.path for u in store.list_multipart(d)]),
        lambda: store.remove_empty_dirs(d),
        lambda: store.delete(f"{pre}a.bin"),
        lambda: store.delete(f"{pre}COMMITTED"),
        lambda: store.delete(f"{pre}m.bin"),
        lambda: store.delete_prefix(f"{pre}sub"),
        lambda: store.remove_empty_dirs(f"{pre}sub"),
        lambda: store.delete(f"{pre}c.bin"),
    ]


def _race(tmp_path: Path, store_of) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    before = seed_outside(outside, _NAMES)
    store, d = store_of(root)
    swapper = Swapper(root / "d", outside, SECONDS)
    try:
        calls, foreign = hammer(swapper, _ops(store, d))
    finally:
        swaps = swapper.join()
    assert swaps > 100 and calls > 100, (swaps, calls)
    assert snapshot(outside) == before, "the store wrote or deleted outside its root"
    assert not foreign, f"not ckptstore errors: {foreign[:5]!r}"


def test_a_directory_swapped_for_a_link_takes_no_act_outside_the_root(tmp_path) -> None:
    """Paths through ``d`` of a store rooted above it."""
    _race(tmp_path, lambda root: (LocalStore(str(root)), "d"))


def test_a_child_stores_own_directory_swapped_for_a_link_takes_no_act_outside(tmp_path) -> None:
    """A child store rooted at ``d`` (a step directory): its own root is swapped, and it
    resolves from the root it came from, so the link is refused there too."""
    _race(tmp_path, lambda root: (LocalStore(str(root)).child("d"), ""))
