"""open_committed parses a manifest it read lately once, and hands every caller its own."""

from __future__ import annotations

from pathlib import Path

import torch

from ckptstore.engine import committed
from ckptstore.engine.catalog import step_name
from ckptstore.engine.committed import open_committed
from ckptstore.engine.manifest import Manifest
from ckptstore.manager import CheckpointManager
from ckptstore.stores.local import LocalStore


def test_a_manifest_read_again_is_parsed_once_and_each_open_gets_its_own(
    tmp_path: Path, monkeypatch
) -> None:
    with CheckpointManager(str(tmp_path), async_save=False) as mgr:
        for step in (1, 2):
            mgr.save(step, {"w": torch.arange(4.0) + step})
    parsed: list[str] = []
    parse = Manifest.from_bytes.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Manifest], data: bytes, where: str) -> Manifest:
        parsed.append(where)
        return parse(cls, data, where)

    monkeypatch.setattr(Manifest, "from_bytes", classmethod(counting))
    committed._PARSED.clear()
    root = LocalStore(str(tmp_path))
    one = root.child(step_name(1))
    a, b = open_committed(one), open_committed(one)
    assert len(parsed) == 1  # the same bytes: parsed once
    assert a.manifest == b.manifest and a.manifest is not b.manifest
    a.manifest.ranges.clear()  # a caller changing its copy changes nobody else's
    a.manifest.files.clear()
    a.manifest.extra["mine"] = True
    assert open_committed(one).manifest == b.manifest
    assert open_committed(root.child(step_name(2))).manifest.step == 2
    assert len(parsed) == 2  # other bytes: parsed
    for step in range(3, 3 + committed._PARSED_COUNT + 2):  # never more than the count held
        committed._parse_manifest(
            b.manifest_bytes.replace(b'"step": 1', f'"step": {step}'.encode()), "x"
        )
    assert len(committed._PARSED) == committed._PARSED_COUNT
