"""The one-job-per-root rule cannot be switched off by a planted owner file (issue #58 §4).

Whatever holds ``<root>/ckptstore.owner.json`` without being a valid lease (a symlink, a
directory, a FIFO, a 1 GiB file, garbage, a JSON object that is no lease) is watched like
a live holder and then refused with ``OwnerFileError`` (a ``RootInUseError``) naming the
file and ``ckptstore-tool gc ROOT --repair``: never taken over, never written through,
never a bare ``IsADirectoryError``, never a hang. Through the library (``claim_root``),
the manager (a save refused, nothing written) and the CLI (``gc --repair``: a dry run,
``--apply`` removes a link as a link, a directory is left for a human).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from ckptstore.engine import owner
from ckptstore.engine.names import OWNER_NAME
from ckptstore.engine.owner import claim_root, read_owner
from ckptstore.errors import OwnerFileError, RootInUseError
from ckptstore.manager import CheckpointManager
from tests.adversarial.clirun import run_cli_text
from tests.cli.conftest import Backend

KINDS = ["symlink", "directory", "fifo", "oversize", "not-json", "not-a-lease"]
#: What each kind's refusal says it is.
SAYS = {
    "symlink": "symlink",
    "directory": "directory",
    "fifo": "FIFO",
    "oversize": "larger than the 4096 bytes",
    "not-json": "not JSON",
    "not-a-lease": "not a version-1 ckptstore lease",
}


def _lease(run: str, age_s: float = 0.0) -> bytes:
    """An owner lease of ``run`` held on another machine (its pid cannot be checked)."""
    doc = {
        "ckptstore_lease": 1,
        "run": run,
        "host": "node-17",
        "pid": 4242,
        "node": "another-boot:1",
        "token": "abc",
        "time": time.time() - age_s,
        "attempt": "",
    }
    return json.dumps(doc).encode()


def plant(backend: Backend, root_url: str, kind: str, tmp_path: Path) -> None:
    """Put a ``kind`` where the owner lease goes (a fresh root otherwise)."""
    store = backend.open(root_url)
    store.put("keep.txt", b"so the root exists")
    if kind in ("symlink", "directory", "fifo"):
        if backend.name != "volume":
            pytest.skip(f"a {kind} exists only on a volume")
        path = os.path.join(root_url, OWNER_NAME)
        if kind == "symlink":  # to a valid-looking lease elsewhere: still never followed
            target = tmp_path / "elsewhere.json"
            target.write_bytes(_lease("the-planter", age_s=3600))
            os.symlink(target, path)
        elif kind == "directory":
            os.mkdir(path)
        else:
            os.mkfifo(path)
    elif kind == "oversize":
        store.put(OWNER_NAME, b" " * (8 << 20))
    elif kind == "not-json":
        store.put(OWNER_NAME, b"{oops")
    else:
        store.put(OWNER_NAME, json.dumps({"ckptstore_lease": 2, "run": "x"}).encode())


@pytest.mark.timeout(60)  # a FIFO opened for reading would block: fail, never hang
@pytest.mark.parametrize("kind", KINDS)
def test_claim_refuses_an_owner_file_that_is_not_a_lease(
    backend: Backend, root_url: str, kind: str, tmp_path: Path
) -> None:
    plant(backend, root_url, kind, tmp_path)
    root = backend.open(root_url)
    t0 = time.monotonic()
    with pytest.raises(OwnerFileError) as info:
        claim_root(root, "job-2", probe_s=1.0)
    assert 0.9 < time.monotonic() - t0 < 20  # watched like a live holder, then refused
    text = str(info.value)
    for part in (OWNER_NAME, SAYS[kind], "Nothing was saved"):
        assert part in text, text
    if kind == "directory":
        assert "by hand" in text, text
    else:
        assert "gc" in text and "--repair" in text, text
    assert isinstance(info.value, RootInUseError) and isinstance(info.value, RuntimeError)
    assert read_owner(root) is None  # not taken over: nothing of ours was written there
    if kind == "symlink":  # the link is still a link, its target untouched
        assert os.path.islink(os.path.join(root_url, OWNER_NAME))
        assert json.loads((tmp_path / "elsewhere.json").read_bytes())["run"] == "the-planter"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
def test_a_manager_save_is_refused_and_writes_nothing(
    backend: Backend, root_url: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner, "PROBE_S", 1.0)
    plant(backend, root_url, kind, tmp_path)
    mgr = CheckpointManager(
        root_url, storage_options=backend.options or None, background="thread", run_id="job-2"
    )
    try:
        with pytest.raises(OwnerFileError, match="--repair|by hand"):
            mgr.save(1, {"w": torch.ones(4)})
        assert not backend.open(root_url).find("step_000000001")
    finally:
        mgr.close()


@pytest.mark.timeout(60)
def test_a_live_holder_rewriting_an_invalid_file_is_refused_as_a_live_job(
    backend: Backend, root_url: str, tmp_path: Path
) -> None:
    """An invalid file a live holder's heartbeat replaces within the watch: the claim
    meets that holder, and refuses it by name (plain ``RootInUseError``)."""
    plant(backend, root_url, "not-json", tmp_path)
    root = backend.open(root_url)
    stop = threading.Event()

    def beat() -> None:
        time.sleep(0.3)
        while not stop.is_set():
            root.put(OWNER_NAME, _lease("job-1"))
            stop.wait(0.3)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        with pytest.raises(RootInUseError) as info:
            claim_root(root, "job-2", probe_s=3.0)
    finally:
        stop.set()
        t.join()
    assert not isinstance(info.value, OwnerFileError)
    assert "'job-1'" in str(info.value)


# -- gc --repair ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "directory"])
def test_gc_repair_is_a_dry_run_then_removes_what_is_not_a_lease(
    backend: Backend, root_url: str, kind: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    plant(backend, root_url, kind, tmp_path)
    root = backend.open(root_url)
    rc, text = run_cli_text(capsys, ["gc", root_url, "--repair", *backend.opts])
    assert rc == 0, text
    assert "would remove" in text and "--apply" in text, text
    assert any(e.name == OWNER_NAME for e in root.scan())  # a dry run changed nothing
    rc, text = run_cli_text(capsys, ["gc", root_url, "--repair", "--apply", *backend.opts])
    assert rc == 0 and "removed" in text, text
    assert not any(e.name == OWNER_NAME for e in root.scan())
    if kind == "symlink":  # the link went, never what it pointed to
        assert (tmp_path / "elsewhere.json").exists()
    monkeypatch.setattr(owner, "PROBE_S", 1.0)
    with CheckpointManager(
        root_url, storage_options=backend.options or None, background="thread", run_id="job-2"
    ) as mgr:  # the root is usable again
        assert mgr.save(1, {"w": torch.ones(4)})
        mgr.wait()


def test_gc_repair_leaves_a_directory_for_a_human(
    backend: Backend, root_url: str, tmp_path: Path, capsys
) -> None:
    plant(backend, root_url, "directory", tmp_path)
    (Path(root_url) / OWNER_NAME / "theirs.txt").write_text("not ckptstore's")
    for extra in ([], ["--apply"]):
        rc, text = run_cli_text(capsys, ["gc", root_url, "--repair", *extra, *backend.opts])
        assert rc == 1 and "by hand" in text and "Traceback" not in text, text
    assert (Path(root_url) / OWNER_NAME / "theirs.txt").exists()


def test_gc_repair_never_removes_a_live_jobs_lease_and_removes_a_stale_one(
    backend: Backend, root_url: str, capsys
) -> None:
    root = backend.open(root_url)
    root.put(OWNER_NAME, _lease("job-1"))
    rc, text = run_cli_text(capsys, ["gc", root_url, "--repair", *backend.opts])
    assert rc == 0 and "nothing to do" in text and "live job" in text, text
    rc, text = run_cli_text(capsys, ["gc", root_url, "--repair", "--apply", *backend.opts])
    assert rc == 2 and "nothing was removed" in text and "Traceback" not in text, text
    assert read_owner(root) is not None and read_owner(root).run == "job-1"  # type: ignore[union-attr]
    root.put(OWNER_NAME, _lease("job-1", age_s=3600))
    rc, text = run_cli_text(capsys, ["gc", root_url, "--repair", "--apply", *backend.opts])
    assert rc == 0 and "removed" in text and "stale" in text, text
    assert not root.exists(OWNER_NAME)


def test_gc_repair_usage(backend: Backend, root_url: str, capsys) -> None:
    backend.open(root_url).put("keep.txt", b"x")
    rc, text = run_cli_text(capsys, ["gc", root_url, "--repair", "--keep-last", "2"])
    assert rc == 2 and "no retention policy" in text, text
    rc, text = run_cli_text(capsys, ["gc", root_url, "--apply", "--keep-last", "2"])
    assert rc == 2 and "--repair" in text, text
    rc, text = run_cli_text(capsys, ["gc", "--help"])
    assert rc == 0 and "--repair" in text and "--apply" in text, text
