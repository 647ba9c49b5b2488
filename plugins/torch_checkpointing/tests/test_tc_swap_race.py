"""torch_checkpointing's ``Storage`` on a volume with a directory below its root swapped
for a symlink to an outside directory and back, thousands of times a second (issue #58,
"Trust, round 4": ``delete``, ``rmdir`` and ``write`` escaped the root within 10 s when
they checked a path and then used the string). Nothing outside the root is created,
changed or deleted; every failure is a ckptstore error or the ``OSError`` the table of
``Storage`` documents for an occupied or missing name."""

from __future__ import annotations

import errno

import pytest

pytest.importorskip("torch_checkpointing")

from ckptstore_tc import CkptStoreStorageConfig  # noqa: E402
from tests.adversarial.swap import Swapper, hammer, seed_outside, snapshot  # noqa: E402

pytestmark = pytest.mark.processes

_NAMES = ["x.bin", "gone.bin", "sub/y.bin", "sub/deep/z.bin", "moved/w.bin", "keep/", "made/"]
#: The errors the Storage contract raises for honest reasons: the name is missing, taken,
#: or a parent is not a directory (the directory is away mid-swap).
_EXPECTED = (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR)


def test_storage_acts_never_leave_a_volume_root_under_a_swap(tmp_path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    before = seed_outside(outside, _NAMES)
    storage = CkptStoreStorageConfig(str(root)).create_storage()
    d = root / "d"
    ops = [
        lambda: storage.write(d / "x.bin", b"written"),
        lambda: storage.mkdir(d / "sub/deep"),
        lambda: storage.write(d / "sub/deep/z.bin", b"z"),
        lambda: storage.mkdir(d / "made", recursive=False),
        lambda: storage.ls(d),
        lambda: storage.exists(d / "x.bin"),
        lambda: storage.isdir(d / "sub"),
        lambda: storage.getsize(d / "x.bin"),
        lambda: storage.stream_read(d / "x.bin").read(),
        lambda: storage.rename(d / "x.bin", d / "moved.bin"),
        lambda: storage.rename(d / "sub", d / "moved", is_directory=True),
        lambda: storage.delete(d / "gone.bin"),
        lambda: storage.delete(d / "moved.bin"),
        lambda: storage.rmdir(d / "moved"),
        lambda: storage.rmdir(d / "sub"),
        lambda: storage.rmdir(d / "made"),
    ]
    swapper = Swapper(d, outside, 4.0)
    try:
        calls, foreign = hammer(swapper, ops, _EXPECTED)
    finally:
        swaps = swapper.join()
    assert swaps > 100 and calls > 100, (swaps, calls)
    assert snapshot(outside) == before, "the storage wrote or deleted outside its root"
    assert not foreign, f"unexpected errors: {foreign[:5]!r}"
