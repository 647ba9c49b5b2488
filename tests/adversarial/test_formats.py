"""Hostile manifests, markers and ``.metadata``: every one is a CorruptCheckpointError.

The ``.metadata`` cases start from real ``Metadata`` pickles (stock ``FileSystemWriter``
and ckptstore's writer) and mutate fields; the fuzz tests throw Hypothesis-made bytes and
JSON structures at the parsers: nothing but Corrupt/IncompleteCheckpointError may escape.
"""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.filesystem import FileSystemWriter

import ckptstore
from ckptstore.dcp.metadata import check_metadata, load_metadata
from ckptstore.errors import CorruptCheckpointError

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def _state() -> dict[str, Any]:
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.ones(2, dtype=torch.bfloat16),
        "cl": torch.randn(1, 2, 2, 2).to(memory_format=torch.channels_last),
        "step": 7,
        "name": "run",
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("md")
    dcp.save(_state(), storage_writer=FileSystemWriter(str(root / "stock")), no_dist=True)
    dcp.save(_state(), storage_writer=ckptstore.writer(f"file://{root}/ck"), no_dist=True)
    return {"stock": root / "stock", "ck": root / "ck"}


def _sizes(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in d.iterdir()}


@pytest.mark.parametrize("kind", ["stock", "ck"])
def test_real_metadata_loads_and_checks(saved: dict[str, Path], kind: str) -> None:
    d = saved[kind]
    md = load_metadata((d / ".metadata").read_bytes(), "x")
    assert md == pickle.loads((d / ".metadata").read_bytes())
    check_metadata(md, _sizes(d), "x")


class _Boom:
    def __reduce__(self) -> Any:
        return (os.system, ("echo should-not-run",))


def test_foreign_global_is_refused_and_not_run(saved: dict[str, Path]) -> None:
    md = pickle.loads((saved["ck"] / ".metadata").read_bytes())
    md.planner_data = _Boom()
    with pytest.raises(CorruptCheckpointError, match="posix.system"):
        load_metadata(pickle.dumps(md), "src/.metadata")


def _mutations() -> list[tuple[str, Any]]:
    def storage(fn: Any) -> Any:
        def mutate(md: Any) -> None:
            info = next(iter(md.storage_data.values()))
            fn(info)

        return mutate

    def first_tensor(fn: Any) -> Any:
        def mutate(md: Any) -> None:
            fn(md.state_dict_metadata["w"])

        return mutate

    return [
        ("absolute", storage(lambda i: setattr(i, "relative_path", "/etc/passwd"))),
        ("dotdot", storage(lambda i: setattr(i, "relative_path", "../x.distcp"))),
        ("nul", storage(lambda i: setattr(i, "relative_path", "a\0b"))),
        ("path-int", storage(lambda i: setattr(i, "relative_path", 5))),
        ("neg-offset", storage(lambda i: setattr(i, "offset", -1))),
        ("neg-length", storage(lambda i: setattr(i, "length", -5))),
        ("float-length", storage(lambda i: setattr(i, "length", 1.5))),
        ("bool-offset", storage(lambda i: setattr(i, "offset", True))),
        ("extra-field", storage(lambda i: setattr(i, "evil", 1))),
        ("transforms", storage(lambda i: setattr(i, "transform_descriptors", [1]))),
        ("sdm-list", lambda md: setattr(md, "state_dict_metadata", [])),
        ("sdm-value", lambda md: md.state_dict_metadata.__setitem__("w", 3)),
        ("storage-list", lambda md: setattr(md, "storage_data", [1])),
        ("storage-value", lambda md: md.storage_data.__setitem__(next(iter(md.storage_data)), 1)),
        (
            "storage-key",
            lambda md: md.storage_data.__setitem__("k", next(iter(md.storage_data.values()))),
        ),
        ("neg-size", first_tensor(lambda t: setattr(t, "size", torch.Size([-1, 4])))),
        (
            "chunk-outside",
            first_tensor(lambda t: setattr(t.chunks[0], "offsets", torch.Size([2, 0]))),
        ),
        ("chunk-ndim", first_tensor(lambda t: setattr(t.chunks[0], "sizes", torch.Size([3])))),
        ("chunks-dict", first_tensor(lambda t: setattr(t, "chunks", {}))),
        ("dtype-str", first_tensor(lambda t: setattr(t.properties, "dtype", "float32"))),
        ("props", first_tensor(lambda t: setattr(t, "properties", None))),
        ("version", lambda md: setattr(md, "version", 3)),
        ("planner-deep", lambda md: setattr(md, "planner_data", _deep(100))),
        ("storage-meta", lambda md: setattr(md, "storage_meta", "x")),
        ("top", None),
    ]


_S = torch.Size


def _first_info(md: Any) -> Any:
    return next(iter(md.storage_data.values()))


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize(("name", "mutate"), _mutations(), ids=[m[0] for m in _mutations()])
def test_mutated_metadata_is_corrupt(saved: dict[str, Path], name: str, mutate: Any) -> None:
    md = pickle.loads((saved["ck"] / ".metadata").read_bytes())
    if mutate is None:
        md = {"not": "metadata"}
    else:
        mutate(md)
    with pytest.raises(CorruptCheckpointError, match="src/.metadata"):
        load_metadata(pickle.dumps(md), "src/.metadata")


@pytest.mark.parametrize(
    ("files", "match"),
    [({}, "lacks"), ({"__0_0.distcp": 3}, "past its end")],
)
def test_check_metadata_bounds(saved: dict[str, Path], files: dict[str, int], match: str) -> None:
    md = load_metadata((saved["ck"] / ".metadata").read_bytes(), "x")
    name = next(iter(md.storage_data.values())).relative_path
    files = {name if k == "__0_0.distcp" else k: v for k, v in files.items()}
    with pytest.raises(CorruptCheckpointError):
        check_metadata(md, files, "x")


def test_size_amplification_is_refused() -> None:
    # One memoised 100-element list handed to torch.Size 10**5 times would be 10**7 ints.
    big = pickle.dumps(torch.Size(range(100)))
    with pytest.raises(CorruptCheckpointError):
        load_metadata(big, "x")


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(data: bytes) -> None:
    with pytest.raises(CorruptCheckpointError):
        load_metadata(data, "x")


@FUZZ
@given(st.data())
def test_fuzz_pickle_bytes_mutated(saved: dict[str, Path], data: st.DataObject) -> None:
    raw = bytearray((saved["ck"] / ".metadata").read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    try:
        md = load_metadata(bytes(raw), "x")
    except CorruptCheckpointError:
        return
    check_metadata_or_corrupt(md, saved["ck"])


def check_metadata_or_corrupt(md: Any, d: Path) -> None:
    try:
        check_metadata(md, _sizes(d), "x")
    except CorruptCheckpointError:
        pass


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=3),
    st.just(torch.Size([2**40])),
    st.just(torch.float32),
)


@FUZZ
@given(st.data())
def test_fuzz_metadata_fields(saved: dict[str, Path], data: st.DataObject) -> None:
    md = pickle.loads((saved["ck"] / ".metadata").read_bytes())
    objs: list[Any] = [md, *md.state_dict_metadata.values(), *md.storage_data.values()]
    objs += [t.properties for t in md.state_dict_metadata.values() if hasattr(t, "properties")]
    objs += [c for t in md.state_dict_metadata.values() for c in getattr(t, "chunks", [])]
    target = data.draw(st.sampled_from(objs))
    field = data.draw(st.sampled_from(sorted(vars(target)) or ["x"]))
    object.__setattr__(target, field, data.draw(_VALUES))
    try:
        blob = pickle.dumps(md)
    except Exception:  # noqa: BLE001 - e.g. a TensorProperties state torch refuses to pickle
        return
    try:
        got = load_metadata(blob, "x")
    except CorruptCheckpointError:
        return
    check_metadata_or_corrupt(copy.deepcopy(got), saved["ck"])
