"""Crafted folder indexes: the attack inputs of test_hf_untrusted.py and the seeds of
test_hf_fuzz.py. No framework is imported here (the fuzz tests stay fast)."""

from __future__ import annotations

import crc32c

__all__ = ["index_doc", "MALFORMED_INDEXES"]


def index_doc(step: int, name: str, path: str, files: dict[str, bytes]) -> dict:
    """A folder index as ``FolderCheckpoints.save`` writes it, listing ``files``."""
    listing = {
        rel: {"size": len(b), "crc32c": crc32c.crc32c(b) if b else 0} for rel, b in files.items()
    }
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
