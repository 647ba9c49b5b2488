"""Crafted Lightning pointers and folder indexes: the attack inputs of
tests/adversarial/test_integrations.py and the seeds of tests/fuzz/test_integrations.py.
No framework is imported here (the fuzz tests stay fast)."""

from __future__ import annotations

import json

from ckptstore.engine.checksum import crc32c
from ckptstore.integrations._lightning_names import POINTER_FORMAT

__all__ = ["pointer", "index_doc", "MALFORMED_POINTERS", "MALFORMED_INDEXES"]


def pointer(root: str, step: int, follow: str = "step", **extra) -> bytes:
    doc = {"format": POINTER_FORMAT, "version": 1, "root": root, "step": step, "follow": follow}
    doc.update(extra)
    return json.dumps(doc).encode()


_GOOD = json.loads(pointer(".", 2))
MALFORMED_POINTERS = {
    "not-json": b"{not json",
    "not-utf8": b'{"format": "\xff\xfe"}',
    "a-list": b'[{"format": "ckptstore.lightning-pointer"}]',
    "another-format": json.dumps({**_GOOD, "format": "other"}).encode(),
    "missing-step": json.dumps({k: v for k, v in _GOOD.items() if k != "step"}).encode(),
    "missing-root": json.dumps({k: v for k, v in _GOOD.items() if k != "root"}).encode(),
    "extra-key": json.dumps({**_GOOD, "x": 1}).encode(),
    "step-a-string": json.dumps({**_GOOD, "step": "1"}).encode(),
    "step-a-bool": json.dumps({**_GOOD, "step": True}).encode(),
    "step-negative": json.dumps({**_GOOD, "step": -1}).encode(),
    "step-huge": json.dumps({**_GOOD, "step": 10**40}).encode(),
    "step-a-float": json.dumps({**_GOOD, "step": 1.0}).encode(),
    "root-a-number": json.dumps({**_GOOD, "root": 5}).encode(),
    "root-empty": json.dumps({**_GOOD, "root": ""}).encode(),
    "root-control-char": json.dumps({**_GOOD, "root": "/tmp/\x00x"}).encode(),
    "follow-unknown": json.dumps({**_GOOD, "follow": "all"}).encode(),
    "version-2": json.dumps({**_GOOD, "version": 2}).encode(),
    "deep-nesting": b'{"a":' + b"[" * 30_000 + b"]" * 30_000 + b"}",  # RecursionError
    "oversized": b'{"format": "ckptstore.lightning-pointer", "pad": "' + b"x" * 70_000 + b'"}',
}


def index_doc(step: int, name: str, path: str, files: dict[str, bytes]) -> dict:
    """A folder index as ``FolderCheckpoints.save`` writes it, listing ``files``."""
    listing = {rel: {"size": len(b), "crc32c": crc32c(b) if b else 0} for rel, b in files.items()}
    return {"format": "ckptstore.folder", "version": 1, "name": name, "path": path,
            "files": listing, "extra": {}}  # fmt: skip


def _mutations() -> dict[str, tuple[object, dict[str, bytes]]]:
    files = {"trainer_state.json": b"{}"}
    good = index_doc(2, "checkpoint-2", "/tmp/out/checkpoint-2", files)

    def m(**change: object) -> dict:
        return {**good, **change}

    entry = good["files"]["trainer_state.json"]
    return {
        "not-json": (b"{oops", files),
        "a-list": (b"[1, 2]", files),
        "another-format": (m(format="x"), files),
        "version-2": (m(version=2), files),
        "name-a-number": (m(name=2), files),
        "name-with-slash": (m(name="a/checkpoint-2"), files),
        "name-another-step": (m(name="checkpoint-3"), files),
        "name-hidden": (m(name=".ckptstore-uncommitted-2"), files),
        "path-relative": (m(path="out/checkpoint-2"), files),
        "path-not-normalised": (m(path="/tmp/x/../checkpoint-2"), files),
        "files-a-list": (m(files=["trainer_state.json"]), files),
        "files-missing": ({k: v for k, v in good.items() if k != "files"}, files),
        "file-escapes": (m(files={"../evil": entry}), {"../evil": b"{}"}),
        "file-absolute": (m(files={"/etc/evil": entry}), files),
        "file-size-a-string": (m(files={"trainer_state.json": {**entry, "size": "2"}}), files),
        "file-size-negative": (m(files={"trainer_state.json": {**entry, "size": -1}}), files),
        "file-size-lies": (m(files={"trainer_state.json": {**entry, "size": 1}}), files),
        "file-crc-too-big": (m(files={"trainer_state.json": {**entry, "crc32c": 2**40}}), files),
        "file-and-dir": (
            m(files={"a": entry, "a/b": entry}),
            {"a": b"{}", "a/b": b"{}"},
        ),
        "extra-a-string": (m(extra="x"), files),
    }


MALFORMED_INDEXES = _mutations()
