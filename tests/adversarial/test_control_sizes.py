"""Round 3's size rule, kept everywhere (issue #58 §5): every control file is capped before
it is read, by the size the store reports and again by the read.

A marker re-signed to commit a 1 GiB manifest (beside a planted sparse 1 GiB manifest)
made ``ls``, ``verify`` and a restore falling back past it peak at 2.1-2.4 GB; now the
marker is refused (its ``manifest_size`` is over ``MAX_MANIFEST_SIZE``) and the manifest
never read. A 1 GiB step lease, owner file or stock ``.metadata`` costs a stat. Each load
runs in a child process (``test_sizes.in_child``) that reports its peak RSS growth; a
manifest naming an unknown codec is named by ``inspect``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.engine.lease import lease_name
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, MAX_MANIFEST_SIZE, Marker
from ckptstore.engine.names import OWNER_NAME
from tests.adversarial.clirun import run_cli_text
from tests.adversarial.test_sizes import (
    assert_bounded,
    assert_cli_corrupt,
    assert_corrupt,
    assert_fell_back,
    in_child,
    two_steps,
)


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as f:
        f.truncate(size)  # no disk: every byte a read would return is a zero


def test_the_manifest_cap_is_what_a_large_job_writes_not_a_gib() -> None:
    # ~200 bytes a range, 4,096 ranks x 300 tensors: ~230 MB fits; 1 GiB does not.
    assert 4096 * 300 * 200 < MAX_MANIFEST_SIZE < 1 << 30


@pytest.mark.processes
def test_a_marker_committing_a_1_gib_manifest_is_refused_unread(tmp_path: Path) -> None:
    step_dir = two_steps(tmp_path / "root")
    for p in step_dir.glob("ckptstore.manifest*.json"):
        _sparse(p, 1 << 30)
    doc = json.loads((step_dir / MARKER_NAME).read_bytes())
    doc["manifest_size"] = 1 << 30  # re-signed by whoever planted the manifest
    (step_dir / MARKER_NAME).write_text(json.dumps(doc))
    root = str(tmp_path / "root")
    reader, restore, ls, verify = in_child(
        [
            ("reader", f"file://{step_dir}"),
            ("restore", {"root": root}),
            ("cli", ["ls", root]),
            ("cli", ["verify", str(step_dir)]),
        ]
    )
    assert_corrupt(reader, "not a valid commit marker")
    assert_fell_back(restore)
    assert_cli_corrupt(ls)
    assert_cli_corrupt(verify)


@pytest.mark.processes
def test_a_manifest_of_another_size_than_its_marker_commits_is_not_read(tmp_path: Path) -> None:
    """Within the cap: a marker committing 512 MiB (the cap) beside 1 GiB manifests is
    refused by the size the store reports, before a byte of either copy is read."""
    step_dir = two_steps(tmp_path / "root")
    for p in step_dir.glob("ckptstore.manifest*.json"):
        _sparse(p, 1 << 30)
    doc = json.loads((step_dir / MARKER_NAME).read_bytes())
    doc["manifest_size"] = MAX_MANIFEST_SIZE
    (step_dir / MARKER_NAME).write_text(json.dumps(doc))
    root = str(tmp_path / "root")
    reader, restore, verify = in_child(
        [
            ("reader", f"file://{step_dir}"),
            ("restore", {"root": root}),
            ("cli", ["verify", str(step_dir)]),
        ]
    )
    assert_corrupt(reader, "does not match")
    assert_fell_back(restore)
    assert_cli_corrupt(verify)
    for res in (reader, restore, verify):
        assert res["growth_mb"] < 50, res  # a stat, not 512 MiB


@pytest.mark.processes
def test_1_gib_leases_and_owner_files_cost_a_stat(tmp_path: Path) -> None:
    root = tmp_path / "root"
    step_dir = two_steps(root)
    incomplete = root / "step_000000003"
    incomplete.mkdir()
    _sparse(incomplete / lease_name("ab12"), 1 << 30)  # a "save in flight"
    _sparse(step_dir / lease_name("cd34"), 1 << 30)
    _sparse(root / OWNER_NAME, 1 << 30)
    gc, repair, restore = in_child(
        [
            ("cli", ["gc", str(root), "--keep-last", "1", "--dry-run"]),
            ("cli", ["gc", str(root), "--repair"]),
            ("restore", {"root": str(root)}),
        ]
    )
    assert gc.get("result") == 0, gc
    assert repair.get("result") == 0, repair
    assert restore.get("result") == [2, 2], restore
    for res in (gc, repair, restore):
        assert_bounded(res)
        assert res["growth_mb"] < 50, res


@pytest.mark.processes
def test_a_2_gib_stock_metadata_is_refused_unread(tmp_path: Path) -> None:
    d = tmp_path / "stock"
    dcp.save({"w": torch.ones(4)}, checkpoint_id=str(d), no_dist=True)
    _sparse(d / ".metadata", 2 << 30)
    reader, inspect = in_child([("reader", f"file://{d}"), ("cli", ["inspect", str(d)])])
    assert_corrupt(reader, "larger than")
    assert_bounded(inspect)
    assert inspect["growth_mb"] < 50, inspect


def test_inspect_names_the_codec_it_refuses(tmp_path: Path, capsys) -> None:
    d = tmp_path / "step_000000001"
    ckptstore.save({"w": torch.ones(8)}, str(d))
    doc = json.loads((d / MANIFEST_NAME).read_bytes())
    doc["codec"] = "lz9/3"  # a codec (version) this ckptstore does not know
    data = json.dumps(doc).encode()
    for p in d.glob("ckptstore.manifest*.json"):
        p.write_bytes(data)
    old = json.loads((d / MARKER_NAME).read_bytes())
    (d / MARKER_NAME).write_bytes(Marker.for_manifest(data, old["step"], old["attempt"]).to_bytes())
    rc, text = run_cli_text(capsys, ["inspect", str(d)])
    assert "'lz9/3'" in text and "does not know" in text and "cannot be decoded" in text, text
    assert rc == 0, text  # a newer writer's codec is not damage (trust rule 8)
