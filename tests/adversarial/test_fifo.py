"""A FIFO planted where ckptstore reads a small file (a step's ``COMMITTED``, its manifest,
the root's ``ckptstore.owner.json``) is refused at once, never waited on (issue #58,
"Trust, round 4"): only regular files are opened for reading (``O_NONBLOCK``, then
``fstat``).

Each call runs on a thread with a deadline: a regression fails the test instead of hanging
the suite (the thread stuck in ``open`` is then released by opening the FIFO for writing).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME
from ckptstore.engine.names import OWNER_NAME
from ckptstore.errors import CkptStoreError, UnsafePathError
from ckptstore.manager import CheckpointManager
from ckptstore.stores.local import LocalStore

DEADLINE_S = 20.0


def _within(fifos: list[Path], fn: Callable[[], Any]) -> Any:
    """``fn()``'s result (or its exception, raised here) if it ends within ``DEADLINE_S``;
    else the test fails, and the FIFOs are opened for writing to release the thread."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised on the test's thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    t.start()
    t.join(DEADLINE_S)
    if t.is_alive():
        while t.is_alive():  # a reader blocked in open() returns once a writer opens
            for fifo in fifos:
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            t.join(0.1)
        pytest.fail(f"hung on a FIFO for more than {DEADLINE_S} s")
    assert time.monotonic() - started < DEADLINE_S
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _plant(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


def _saved(root: Path, steps: tuple[int, ...]) -> None:
    with CheckpointManager(str(root), background="thread") as mgr:
        for n in steps:
            mgr.save(n, {"w": torch.full((4,), float(n))})


def _step(root: Path, n: int) -> Path:
    return root / f"step_{n:09d}"


def test_the_store_refuses_to_read_a_fifo_socket_or_directory(tmp_path) -> None:
    import socket

    fifo = _plant(tmp_path / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "dir").mkdir()
    store = LocalStore(str(tmp_path))
    try:
        with pytest.raises(UnsafePathError, match="FIFO"):
            _within([fifo], lambda: store.get("pipe"))
        with pytest.raises(UnsafePathError, match="FIFO"):
            _within([fifo], lambda: store.get_into("pipe", 0, memoryview(bytearray(8))))
        with pytest.raises(UnsafePathError, match="socket"):
            store.get("sock")
        with pytest.raises(UnsafePathError, match="directory"):
            store.get("dir")
        assert not store.exists("pipe")  # not a file: exists says no, as before
    finally:
        sock.close()


@pytest.mark.parametrize(
    "name, restored",
    # A FIFO at the canonical manifest leaves the attempt's own copy, which the marker
    # names and vouches for: step 2 is still whole. At the marker, step 2 is damaged.
    [(MARKER_NAME, 1), (MANIFEST_NAME, 2)],
)
def test_a_fifo_in_a_step_is_refused_by_ls_gc_and_restore(tmp_path, capsys, name, restored) -> None:
    from ckptstore.cli.main import main

    root = tmp_path / "run"
    _saved(root, (1, 2))
    fifo = _plant(_step(root, 2) / name)
    assert _within([fifo], lambda: main(["ls", str(root)])) in (0, 1)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert restored == 2 or "FIFO" in out.out + out.err
    state = {"w": torch.zeros(4)}
    with CheckpointManager(str(root), background="thread") as mgr:
        assert _within([fifo], lambda: mgr.restore(state)) == restored
        assert torch.equal(state["w"], torch.full((4,), float(restored)))
        _within([fifo], lambda: mgr.save(3, {"w": torch.full((4,), 3.0)}))
        _within([fifo], mgr.wait)
    assert _within([fifo], lambda: main(["gc", str(root), "--keep-last", "1"])) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err
    assert (_step(root, 3) / MARKER_NAME).is_file()
    if restored == 1:
        assert fifo.exists()  # a damaged step's FIFO marker: left alone
    else:  # a committed step retention removes, the FIFO at one of its names unlinked
        assert not _step(root, 2).exists()


def test_a_fifo_at_the_owner_lease_is_refused_by_save_and_ls(
    tmp_path, capsys, caplog, monkeypatch
) -> None:
    from ckptstore.cli.main import main

    # the claim watches an owner file that is no lease for PROBE_S (15 s) before refusing
    # it; refused, not hung, is the property: 1 s of watching shows it
    monkeypatch.setattr("ckptstore.engine.owner.PROBE_S", 1.0)
    root = tmp_path / "run"
    _saved(root, (1,))
    fifo = _plant(root / OWNER_NAME)
    assert _within([fifo], lambda: main(["ls", str(root)])) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err

    def save() -> None:
        with CheckpointManager(str(root), background="thread") as mgr:
            mgr.save(2, {"w": torch.full((4,), 2.0)})

    refused = ""
    with caplog.at_level(logging.WARNING, logger="ckptstore"):
        try:
            _within([fifo], save)
        except CkptStoreError as exc:  # refusing the root is what it must do; a hang is not
            refused = str(exc)
    assert "FIFO" in refused, caplog.text
    state = {"w": torch.zeros(4)}
    with CheckpointManager(str(root), background="thread") as mgr:
        assert _within([fifo], lambda: mgr.restore(state)) in (1, 2)
