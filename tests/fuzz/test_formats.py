"""Fuzz the parsers of bytes from storage whose sizes must be bounded (trust rule 3): the
``COMMITTED`` marker, the manifest, DCP ``.metadata`` (with ``check_metadata``), the RNG
states ``RNGState`` unpickles, and the zstd codec's decode. Seeded with the crafted files of
``tests/adversarial/test_sizes.py``; only the documented errors may come out, and quickly.
"""

from __future__ import annotations

import functools
import json
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ckptstore
from ckptstore.dcp.metadata import load_metadata
from ckptstore.dcp.metadata_bounds import check_metadata
from ckptstore.engine.codec_registry import get_codec
from ckptstore.engine.manifest import MAX_MARKER_SIZE, Manifest, Marker
from ckptstore.errors import CorruptCheckpointError, NewerFormatError, UnsafePickleError
from ckptstore.manager.state import RNGState, _load_rng
from tests.adversarial.test_sizes import (
    rng_huge_void,
    rng_object_array,
    shared_planner_data,
    zstd_bomb,
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@functools.lru_cache(maxsize=1)
def _real() -> dict[str, Any]:
    """A real ckptstore checkpoint's marker, manifest, .metadata and file sizes."""
    with tempfile.TemporaryDirectory(prefix="ckptstore-fuzz-") as name:
        d = Path(name)
        state = {"w": torch.arange(12.0).reshape(3, 4), "n": 7}
        dcp.save(state, storage_writer=ckptstore.writer(f"file://{d}"), no_dist=True)
        return {
            "marker": (d / "COMMITTED").read_bytes(),
            "manifest": (d / "ckptstore.manifest.json").read_bytes(),
            "metadata": (d / ".metadata").read_bytes(),
            "files": {p.name: p.stat().st_size for p in d.iterdir()},
        }


def _metadata_with(change: str) -> bytes:
    md = pickle.loads(_real()["metadata"])
    if change == "shared":
        md.planner_data = {**md.planner_data, "w": shared_planner_data()}
    elif change == "petabyte":
        md.state_dict_metadata["w"].size = torch.Size([1 << 50, 4])
    return pickle.dumps(md)


REAL_MARKER = _real()["marker"]
REAL_MANIFEST = _real()["manifest"]
REAL_METADATA = _real()["metadata"]
SHARED_METADATA = _metadata_with("shared")
PETABYTE_METADATA = _metadata_with("petabyte")
_GOOD_RNG = RNGState().state_dict()["rank0"]
SMALL_BOMB = zstd_bomb(8 << 20)


def _mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for at, value in edits:
        if out:
            out[at % len(out)] = value
    return bytes(out)


_EDITS = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=6)


@FUZZ
@given(st.binary(max_size=600))
@example(REAL_MARKER)
@example(bytes(MAX_MARKER_SIZE + 1))
@example(b"{" + b" " * MAX_MARKER_SIZE + b"}")
@example(b'{"manifest_crc32c": "0", "manifest_size": 1099511627776}')
def test_marker(data: bytes) -> None:
    try:
        Marker.from_bytes(data, "COMMITTED")
    except CorruptCheckpointError:
        pass


@FUZZ
@given(_EDITS)
@example([])
def test_marker_mutated(edits: list[tuple[int, int]]) -> None:
    try:
        Marker.from_bytes(_mutate(REAL_MARKER, edits), "COMMITTED")
    except CorruptCheckpointError:
        pass


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)


@FUZZ
@given(_EDITS, st.sampled_from(["files", "ranges", "codec", "step", "version", "extra"]), _JSON)
@example([], "files", None)
def test_manifest(edits: list[tuple[int, int]], key: str, value: Any) -> None:
    doc = json.loads(REAL_MANIFEST)
    doc[key] = value
    for data in (json.dumps(doc).encode(), _mutate(REAL_MANIFEST, edits)):
        try:
            Manifest.from_bytes(data, "manifest")
        except (CorruptCheckpointError, NewerFormatError):  # a higher "version": a newer one's
            pass


def test_an_oversized_manifest_is_refused_before_parsing() -> None:
    from ckptstore.engine.manifest import MAX_MANIFEST_SIZE

    class Huge(bytes):
        def __len__(self) -> int:
            return MAX_MANIFEST_SIZE + 1

    with pytest.raises(CorruptCheckpointError, match="more than such a file can be"):
        Manifest.from_bytes(Huge(b"{}"), "manifest")


def _load_and_check(data: bytes) -> None:
    try:
        md = load_metadata(data, ".metadata")
        check_metadata(md, _real()["files"], ".metadata")
    except CorruptCheckpointError:
        pass


@FUZZ
@given(st.sampled_from([REAL_METADATA, SHARED_METADATA, PETABYTE_METADATA]), _EDITS)
@example(SHARED_METADATA, [])
@example(PETABYTE_METADATA, [])
def test_metadata(seed: bytes, edits: list[tuple[int, int]]) -> None:
    _load_and_check(_mutate(seed, edits))


def test_the_crafted_metadata_are_refused() -> None:
    for data, match in ((SHARED_METADATA, "more than once"), (PETABYTE_METADATA, "a tensor of")):
        with pytest.raises(CorruptCheckpointError, match=match):
            check_metadata(load_metadata(data, "x"), _real()["files"], "x")


_RNG_SEEDS = [
    ("numpy", _GOOD_RNG["numpy"]),
    ("python", _GOOD_RNG["python"]),
    ("numpy", rng_object_array()),
    ("numpy", rng_huge_void(1 << 40)),
]


@FUZZ
@given(st.sampled_from(_RNG_SEEDS), _EDITS)
@example(("numpy", rng_object_array()), [])
@example(("numpy", rng_huge_void(1 << 40)), [])
def test_rng_state(seed: tuple[str, bytes], edits: list[tuple[int, int]]) -> None:
    which, data = seed
    try:
        _load_rng(_mutate(data, edits), which)
    except (CorruptCheckpointError, UnsafePickleError):
        pass


@FUZZ
@given(_EDITS, st.none() | st.integers(0, 1 << 40), st.none() | st.integers(0, 1 << 20))
@example([], None, 1 << 20)
@example([], 100, None)
def test_zstd_decode(edits: list[tuple[int, int]], raw_length: Any, limit: Any) -> None:
    try:
        out = get_codec("zstd").decode(_mutate(SMALL_BOMB, edits), raw_length, limit=limit)
    except CorruptCheckpointError:
        return
    assert limit is None or len(out) <= limit
