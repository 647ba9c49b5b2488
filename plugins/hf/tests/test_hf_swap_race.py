"""Attacks on the Hugging Face plugin's local folders (issue #58 §2): every path below the
directory the framework was given is resolved from its descriptor, so a folder there
swapped for a link to an outside directory while a save or a restore runs takes no act
outside, and a FIFO planted in a checkpoint folder is refused (a save) or moved aside
unread (a restore) at once, never waited on.

The swap: a child process renames a folder away, puts a link to an outside directory in
its place and puts it back, thousands of times a second (``tests.adversarial.swap``),
while the plugin lists, reads, uploads, matches, moves aside and writes folders there. The
outside directory holds sentinel files at exactly the names the plugin reads, writes,
moves and removes. A FIFO: each call runs on a thread with a deadline
(``tests.adversarial.test_fifo._within``).
"""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import crc32c
import pytest

from ckptstore import KeepAll, step_name
from ckptstore.api import empty_state_dict
from ckptstore.errors import UnsafePathError
from ckptstore_hf._folder import INDEX_KEY, FolderCheckpoints
from ckptstore_hf._local import QUARANTINE, LocalFolder
from tests.adversarial.swap import SENTINEL, Escaped, Swapper, hammer, seed_outside, snapshot
from tests.adversarial.test_fifo import _plant, _within

SECONDS = 3.0
FILES = {"trainer_state.json": b'{"global_step": 5}', "sub/a.bin": b"a" * 300, "sub/b.bin": b""}
#: What a folder's own acts (and a restore writing it) may meet when someone else moves
#: the folder meanwhile: the file system's word for a name that is gone, taken, or not a
#: directory any more. (``save`` says it as a ``ConfigError``.)
_MOVED = (errno.ENOENT, errno.ENOTDIR, errno.EEXIST, errno.ENOTEMPTY)


def _folder(top: Path) -> Path:
    folder = top / "out" / "checkpoint-5"
    for rel, data in FILES.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return folder


def _fc(tmp_path: Path) -> FolderCheckpoints:
    return FolderCheckpoints(str(tmp_path / "root"), keep=KeepAll(), background="thread")


def _committed_files(fc: FolderCheckpoints) -> None:
    """Every committed step lists only ``FILES``, each with its own bytes' checksum:
    nothing outside the folder was uploaded. (A save that listed the folder while the
    swapper held ``sub`` away under ``sub.held.<n>`` uploaded it under that name.)"""
    want = {rel: crc32c.crc32c(data) for rel, data in FILES.items()}
    mgr = fc.manager
    for step in fc.steps():  # the index as stored (it names checkpoint-5, not the step)
        flat = empty_state_dict(mgr.root.child(step_name(step)), [INDEX_KEY])
        mgr.restore(flat, step=step)
        files = json.loads(bytes(flat[INDEX_KEY].numpy()))["files"]
        for rel, entry in files.items():
            name = re.sub(r"^sub\.held\.[0-9]+/", "sub/", rel)
            assert entry["crc32c"] == want.get(name), (step, rel)


@pytest.mark.processes
def test_a_folder_swapped_for_a_link_while_it_is_saved_is_never_read_outside(tmp_path) -> None:
    folder = _folder(tmp_path)
    outside = tmp_path / "outside"
    before = seed_outside(outside, ["a.bin", "b.bin", "only.bin"])
    local = LocalFolder(str(folder), base=str(folder))
    fc = _fc(tmp_path)
    steps = iter(range(1, 10**6))

    def listed() -> None:
        if any("only" in rel for rel in local.files()):
            raise Escaped("listed a file that is only outside")

    def read() -> None:
        if bytes(local.read("sub/a.bin").numpy()).startswith(SENTINEL):
            raise Escaped("read sub/a.bin outside the folder")

    ops = [listed, read, lambda: fc.save(next(steps), str(folder)), fc.wait]
    swapper = Swapper(folder / "sub", outside, SECONDS)
    try:
        calls, foreign = hammer(swapper, ops, errnos=_MOVED)
    finally:
        swaps = swapper.join()
    fc.wait()
    assert swaps > 100 and calls > 20, (swaps, calls)
    assert snapshot(outside) == before
    assert not foreign, f"not ckptstore errors: {foreign[:5]!r}"
    _committed_files(fc)
    fc.close()


@pytest.mark.processes
@pytest.mark.parametrize("swapped", ["checkpoint-5", QUARANTINE])
def test_a_folder_swapped_for_a_link_while_it_is_restored_takes_no_act_outside(
    tmp_path, swapped
) -> None:
    """The restored folder itself, or the quarantine folder, swapped while the plugin
    matches the folder, moves it aside and writes the committed copy in its place."""
    folder = _folder(tmp_path)
    out = folder.parent
    fc = _fc(tmp_path)
    assert fc.save(5, str(folder))
    fc.wait()
    (out / QUARANTINE).mkdir()
    outside = tmp_path / "outside"
    names = [*FILES, "only.bin", "checkpoint-5/sub/a.bin", "empty/"]
    before = seed_outside(outside, names)
    local = LocalFolder(str(folder), base=str(out))
    index = fc.index(5)

    def read() -> None:
        if bytes(local.read("sub/a.bin").numpy()).startswith(SENTINEL):
            raise Escaped("read sub/a.bin outside the output directory")

    ops = [
        lambda: fc.ensure_local(5, str(folder), index=index, base=str(out)),
        lambda: local.matches(index),
        read,
        lambda: local.quarantine(None),
    ]
    swapper = Swapper(out / swapped, outside, SECONDS)
    try:
        calls, foreign = hammer(swapper, ops, errnos=_MOVED)
    finally:
        swaps = swapper.join()
    assert swaps > 100 and calls > 20, (swaps, calls)
    assert snapshot(outside) == before, "the restore wrote, moved or removed outside"
    assert not foreign, f"not ckptstore errors: {foreign[:5]!r}"
    for leftover in out.glob(f"{swapped}.held.*"):  # where the swapper lost its own race
        leftover.rename(tmp_path / leftover.name)
    fc.ensure_local(5, str(folder), index=index, base=str(out))
    assert local.matches(index)
    fc.close()


def test_a_fifo_in_a_folder_being_saved_is_refused_at_once(tmp_path) -> None:
    folder = _folder(tmp_path)
    fifo = _plant(folder / "sub" / "pipe")
    fc = _fc(tmp_path)
    with pytest.raises(UnsafePathError, match=r"sub/pipe is not a regular file"):
        _within([fifo], lambda: fc.save(5, str(folder)))
    assert fc.steps() == []
    fc.close()


def test_a_fifo_in_a_folder_being_restored_is_moved_aside_unread(tmp_path) -> None:
    """A FIFO where a restored file is compared (the folder's ``sub/a.bin``): the folder
    does not match, is moved aside whole (the FIFO unread, unopened), and the committed
    copy is written in its place. A FIFO in the way in the quarantine folder goes as a
    name."""
    folder = _folder(tmp_path)
    out = folder.parent
    fc = _fc(tmp_path)
    assert fc.save(5, str(folder))
    fc.wait()
    fifo = _plant(folder / "sub" / "a.bin")
    (out / QUARANTINE).mkdir()
    in_the_way = _plant(out / QUARANTINE / "checkpoint-5")
    _within([fifo, in_the_way], lambda: fc.ensure_local(5, str(folder), base=str(out)))
    for rel, data in FILES.items():
        assert (folder / rel).read_bytes() == data
    moved = out / QUARANTINE / "checkpoint-5" / "sub" / "a.bin"
    assert moved.exists() and not moved.is_file()  # the FIFO, moved with its folder
    fc.close()
