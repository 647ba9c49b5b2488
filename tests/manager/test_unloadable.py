"""A root whose committed steps cannot be loaded never becomes a silent fresh start, and
what a newer ckptstore or torch wrote is "newer", never "corrupt": a restore passes over
it naming it, retention and saves leave it as it is (trust rule 8)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptstore import (
    CheckpointStatus,
    ConfigError,
    CorruptCheckpointError,
    KeepLast,
    NewerFormatError,
    NoLoadableCheckpointError,
)
from ckptstore.engine.catalog import list_steps, newer_steps
from ckptstore.engine.checksum import crc32c, format_crc
from ckptstore.engine.manifest import FORMAT_VERSION, MANIFEST_NAME, MARKER_NAME, Marker
from ckptstore.engine.names import step_name
from ckptstore.manager import CheckpointManager
from ckptstore.manager.prune import plan_prune
from ckptstore.stores.local import LocalStore
from tests.dcp.test_metadata_layouts import pickled


def _state(v: float = 0.0) -> dict[str, Any]:
    return {"w": torch.full((2, 3), v)}


def _resign(step_dir: Path, doc: dict[str, Any], metadata: bytes | None = None) -> None:
    """Write manifest ``doc`` (and ``metadata``) over every copy; a marker committing it."""
    if metadata is not None:
        for p in step_dir.glob(".metadata*"):
            p.write_bytes(metadata)
        doc["files"][".metadata"] = {"size": len(metadata), "crc32c": format_crc(crc32c(metadata))}
    data = json.dumps(doc).encode()
    old = json.loads((step_dir / MARKER_NAME).read_bytes())
    for p in step_dir.glob("ckptstore.manifest*.json"):
        p.write_bytes(data)
    (step_dir / MARKER_NAME).write_bytes(
        Marker.for_manifest(data, old["step"], old["attempt"]).to_bytes()
    )


def newer_ckptstore(step_dir: Path) -> None:
    """Make ``step_dir`` a step a newer ckptstore committed (a manifest format from later)."""
    doc = json.loads((step_dir / MANIFEST_NAME).read_bytes())
    doc["version"] = FORMAT_VERSION + 1
    doc["ckptstore_version"] = "9.0.0"
    _resign(step_dir, doc)


def newer_torch(step_dir: Path) -> None:
    """Make ``step_dir``'s ``.metadata`` a layout of a torch release from later (a seventh
    field in each tensor's properties), its manifest saying that torch wrote it."""
    from ckptstore.dcp.metadata import load_metadata

    md = load_metadata((step_dir / ".metadata").read_bytes(), "x")
    data = pickled(md, {"w": ((3, 1), "a field of torch 9.1")})
    doc = json.loads((step_dir / MANIFEST_NAME).read_bytes())
    doc["torch_version"] = "9.1.0"
    _resign(step_dir, doc, data)


def _saved(root: Path, steps: tuple[int, ...]) -> None:
    with CheckpointManager(str(root), async_save=False, keep=KeepLast(10)) as mgr:
        for s in steps:
            mgr.save(s, _state(float(s)))


def _damage(step_dir: Path) -> None:
    for p in step_dir.glob("ckptstore.manifest*.json"):  # every copy: none to fall back to
        p.write_bytes(b"{not json")


def test_committed_steps_none_loadable_raise_with_each_reason(tmp_path) -> None:
    root = tmp_path / "root"
    _saved(root, (1, 2, 3))
    newer_ckptstore(root / step_name(3))
    newer_torch(root / step_name(2))
    _damage(root / step_name(1))
    out = _state()
    with CheckpointManager(str(root), async_save=False) as mgr:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(NoLoadableCheckpointError) as info:
                mgr.restore(out)
    assert [s for s, _ in info.value.refused] == [3, 2, 1]
    message = str(info.value)
    assert "3 committed step(s) and none could be restored" in message
    assert "format version 2 (written by ckptstore 9.0.0)" in message
    assert "written by torch 9.1.0" in message and f"this torch is {torch.__version__}" in message
    assert "damaged" in message and 'on_unloadable="fresh"' in message
    assert torch.equal(out["w"], torch.zeros(2, 3))  # nothing loaded


def test_on_unloadable_fresh_starts_over_and_says_so(tmp_path) -> None:
    root = tmp_path / "root"
    _saved(root, (1,))
    _damage(root / step_name(1))
    with CheckpointManager(str(root), async_save=False) as mgr:
        with pytest.warns(RuntimeWarning, match="starting from scratch.*on_unloadable"):
            assert mgr.restore(_state(), on_unloadable="fresh") is None
        with pytest.raises(ConfigError, match="on_unloadable"):
            mgr.restore(_state(), on_unloadable="ignore")


def test_an_empty_root_is_a_fresh_start(tmp_path) -> None:
    with CheckpointManager(str(tmp_path / "root"), async_save=False) as mgr:
        assert mgr.restore(_state()) is None


@pytest.mark.parametrize("make_newer", [newer_ckptstore, newer_torch])
def test_a_newer_step_is_passed_over_and_left_as_it_is(tmp_path, make_newer) -> None:
    root = tmp_path / "root"
    _saved(root, (1, 2))
    make_newer(root / step_name(2))
    before = {p.name: p.read_bytes() for p in (root / step_name(2)).iterdir()}
    out = _state()
    with CheckpointManager(str(root), async_save=False, keep=KeepLast(3)) as mgr:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "step 2 could not be restored" (a newer torch's)
            assert mgr.restore(out) == 1
        assert torch.equal(out["w"], torch.full((2, 3), 1.0))
        mgr.save(3, _state(3.0))  # retention runs after it: step 2 is no damaged leftover
    after = {p.name: p.read_bytes() for p in (root / step_name(2)).iterdir()}
    assert after == before  # neither replaced nor deleted nor counted damaged


def test_saving_over_a_newer_ckptstores_step_fails_and_keeps_it(tmp_path) -> None:
    root = tmp_path / "root"
    _saved(root, (1, 2))
    newer_ckptstore(root / step_name(2))
    before = (root / step_name(2) / MARKER_NAME).read_bytes()
    with CheckpointManager(str(root), async_save=False) as mgr:
        with pytest.raises(NewerFormatError, match="newer than this ckptstore"):
            mgr.save(2, _state(2.0))
    assert (root / step_name(2) / MARKER_NAME).read_bytes() == before


def test_a_newer_step_is_listed_as_newer_and_pruning_keeps_it(tmp_path) -> None:
    root = tmp_path / "root"
    _saved(root, (1, 2, 3))
    newer_ckptstore(root / step_name(1))
    store = LocalStore(str(root))
    assert [(e.step, e.status) for e in list_steps(store)] == [
        (1, CheckpointStatus.NEWER),
        (2, CheckpointStatus.COMMITTED),
        (3, CheckpointStatus.COMMITTED),
    ]
    (newer,) = newer_steps(store)  # the committed step committed_steps leaves out
    assert newer[0] == 1 and "format version 2 (written by ckptstore 9.0.0)" in newer[1]
    plan = plan_prune(store, KeepLast(1))
    decision = {d.step: (d.action, d.reason) for d in plan.steps}
    assert decision[1] == ("keep", "written by a newer ckptstore: left alone (upgrade it)")
    assert decision[2][0] == "delete"
    assert not isinstance(NewerFormatError("x"), CorruptCheckpointError)


def test_the_error_names_ten_steps_and_counts_the_rest() -> None:
    import pickle

    refused = [(s, f"damaged {s}.") for s in range(15, 0, -1)]
    error = NoLoadableCheckpointError.of("root", refused)
    assert "step 6: damaged 6; and 5 more" in str(error) and "step 5:" not in str(error)
    again = pickle.loads(pickle.dumps(error))  # as a rank's error crosses processes
    assert again.refused == refused and str(again) == str(error)


def test_a_hostile_ckptstore_version_is_quoted(tmp_path) -> None:
    root = tmp_path / "root"
    _saved(root, (1,))
    step = root / step_name(1)
    doc = json.loads((step / MANIFEST_NAME).read_bytes())
    doc["version"] = FORMAT_VERSION + 1
    doc["ckptstore_version"] = "9.0\x1b[2J\nforged line" + "x" * 200
    _resign(step, doc)
    (newer,) = newer_steps(LocalStore(str(root)))
    assert "\x1b" not in newer[1] and "\n" not in newer[1] and "x" * 60 not in newer[1]
