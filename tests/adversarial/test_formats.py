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
from ckptstore.dcp.metadata import load_metadata
from ckptstore.dcp.metadata_bounds import check_metadata
from ckptstore.errors import CorruptCheckpointError, NewerFormatError

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


# -- manifest and marker ---------------------------------------------------------------
import json  # noqa: E402

from ckptstore.engine.committed import open_committed  # noqa: E402
from ckptstore.engine.manifest import (  # noqa: E402
    MANIFEST_NAME,
    MARKER_NAME,
    Manifest,
    Marker,
)
from ckptstore.errors import IncompleteCheckpointError  # noqa: E402
from ckptstore.manager import CheckpointManager  # noqa: E402
from ckptstore.stores.local import LocalStore  # noqa: E402


def _resign(step_dir: Path, manifest_bytes: bytes) -> None:
    """Write ``manifest_bytes`` as the canonical manifest and a marker that commits it
    (what an attacker who can write the bucket can do)."""
    old = json.loads((step_dir / MARKER_NAME).read_bytes())
    (step_dir / MANIFEST_NAME).write_bytes(manifest_bytes)
    marker = Marker.for_manifest(manifest_bytes, old["step"], old["attempt"])
    (step_dir / MARKER_NAME).write_bytes(marker.to_bytes())


@pytest.fixture
def two_steps(tmp_path: Path) -> Path:
    with CheckpointManager(str(tmp_path), background="thread") as mgr:
        for step in (1, 2):
            mgr.save(step, {"w": torch.full((64,), float(step)), "n": step})
    return tmp_path


def _doc(step_dir: Path) -> dict[str, Any]:
    return json.loads((step_dir / MANIFEST_NAME).read_bytes())  # type: ignore[no-any-return]


def _shard_range(doc: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in doc["ranges"] if r["file"].endswith(".distcp"))


def _bad_manifests(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    def with_range(**kw: Any) -> dict[str, Any]:
        d = copy.deepcopy(doc)
        _shard_range(d).update(kw)
        return d

    def with_file(name: str, entry: Any) -> dict[str, Any]:
        d = copy.deepcopy(doc)
        d["files"][name] = entry
        return d

    return [
        ("list", []),
        ("files-list", {**doc, "files": []}),
        ("ranges-dict", {**doc, "ranges": {}}),
        ("range-str", {**doc, "ranges": ["x"]}),
        ("huge-length", with_range(length=2**40)),
        ("neg-offset", with_range(offset=-8)),
        ("neg-length", with_range(length=-1)),
        ("float-offset", with_range(offset=1.5)),
        ("past-end", with_range(offset=10**6)),
        ("raw-huge", with_range(raw_length=2**40)),
        ("span-past", with_range(span={"offset": 0, "length": 2**40, "crc32c": "00000000"})),
        ("span-list", with_range(span=[1])),
        ("abs-range-file", with_range(file="/etc/passwd")),
        ("crc-neg", with_range(crc32c="-1")),
        ("crc-int", with_range(crc32c=5)),
        ("abs-file", with_file("/etc/passwd", {"size": 1, "crc32c": "00000000"})),
        ("dotdot-file", with_file("../x", {"size": 1, "crc32c": "00000000"})),
        ("size-neg", with_file("a", {"size": -1, "crc32c": "00000000"})),
        ("size-str", with_file("a", {"size": "1", "crc32c": "00000000"})),
        ("entry-list", with_file("a", [])),
        ("step-str", {**doc, "step": "2"}),
        ("world-neg", {**doc, "world_size": -1}),
        ("extra-list", {**doc, "extra": []}),
        ("codec-int", {**doc, "codec": 3}),
    ]


def test_every_bad_manifest_is_corrupt_and_restore_falls_back(two_steps: Path) -> None:
    step_dir = two_steps / "step_000000002"
    original = (step_dir / MANIFEST_NAME).read_bytes()
    marker = (step_dir / MARKER_NAME).read_bytes()
    for name, doc in _bad_manifests(json.loads(original)):
        data = json.dumps(doc).encode()
        with pytest.raises(CorruptCheckpointError):
            Manifest.from_bytes(data, "m")
        _resign(step_dir, data)
        # the attempt's own manifest still matches the old marker only: the re-signed one is
        # what the marker names now, so the checkpoint is the crafted one
        with pytest.raises(CorruptCheckpointError):
            open_committed(LocalStore(str(step_dir)))
        out = {"w": torch.zeros(64), "n": 0}
        with CheckpointManager(str(two_steps), background="thread") as mgr:
            assert mgr.restore(out) == 1, name
        assert out["n"] == 1 and torch.equal(out["w"], torch.full((64,), 1.0))
        (step_dir / MANIFEST_NAME).write_bytes(original)
        (step_dir / MARKER_NAME).write_bytes(marker)


@pytest.mark.parametrize(
    "data",
    [
        b"[]",
        b"null",
        b'{"manifest_crc32c": 5, "manifest_size": 1}',
        b'{"manifest_crc32c": "zz", "manifest_size": 1}',
        b'{"manifest_crc32c": "00000001", "manifest_size": -1}',
        b'{"manifest_crc32c": "00000001", "manifest_size": 1, "attempt": "../../x"}',
        b'{"manifest_crc32c": "00000001", "manifest_size": 1, "attempt": 7}',
        b'{"manifest_crc32c": "00000001", "manifest_size": 1, "step": "x"}',
        b"\xff\xfe",
        b"[" * 100_000,
    ],
)
def test_bad_marker_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptCheckpointError):
        Marker.from_bytes(data, "COMMITTED")


def test_real_manifest_and_marker_parse(two_steps: Path) -> None:
    step_dir = two_steps / "step_000000002"
    m = Manifest.from_bytes((step_dir / MANIFEST_NAME).read_bytes(), "m")
    assert m.step == 2 and m.files and m.ranges
    assert Marker.from_bytes((step_dir / MARKER_NAME).read_bytes(), "c").step == 2


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(obj: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*at, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*at, i))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    obj[path[0]] = _set(obj[path[0]], path[1:], value)
    return obj


@FUZZ
@given(st.data())
def test_fuzz_manifest_structure(two_steps: Path, data: st.DataObject) -> None:
    step_dir = two_steps / "step_000000002"
    doc = _doc(step_dir)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(doc)))
        doc = _set(doc, path, data.draw(_JSON))
    try:
        Manifest.from_bytes(json.dumps(doc).encode(), "m")
    except (CorruptCheckpointError, NewerFormatError):  # a drawn "format": 2 is a newer one
        pass


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_resigned_manifest_through_the_reader(two_steps: Path, data: st.DataObject) -> None:
    """A crafted, re-signed manifest: the reader and load end in a checkpoint error."""
    step_dir = two_steps / "step_000000002"
    original = (step_dir / MANIFEST_NAME).read_bytes()
    marker = (step_dir / MARKER_NAME).read_bytes()
    doc = json.loads(original)
    r = _shard_range(doc)
    field = data.draw(st.sampled_from(["offset", "length", "raw_length", "file", "crc32c"]))
    r[field] = data.draw(_JSON | st.sampled_from([2**40, -1, 0, 10**6]))
    _resign(step_dir, json.dumps(doc).encode())
    try:
        ckptstore.load({"w": torch.zeros(64), "n": 0}, f"file://{step_dir}")
    except (CorruptCheckpointError, IncompleteCheckpointError):
        pass
    finally:
        (step_dir / MANIFEST_NAME).write_bytes(original)
        (step_dir / MARKER_NAME).write_bytes(marker)


@FUZZ
@given(st.binary(max_size=200) | _JSON.map(lambda v: json.dumps(v).encode()))
def test_fuzz_marker_bytes(data: bytes) -> None:
    try:
        Marker.from_bytes(data, "COMMITTED")
    except CorruptCheckpointError:
        pass


def _resign_metadata(step_dir: Path, metadata_bytes: bytes) -> None:
    """Replace ``.metadata`` and re-sign the manifest and marker to match it."""
    from ckptstore.engine.checksum import crc32c, format_crc

    doc = _doc(step_dir)
    doc["files"][".metadata"] = {
        "size": len(metadata_bytes),
        "crc32c": format_crc(crc32c(metadata_bytes)),
    }
    (step_dir / ".metadata").write_bytes(metadata_bytes)
    _resign(step_dir, json.dumps(doc).encode())


@pytest.mark.parametrize("what", ["global", "absolute", "huge", "negative"])
def test_resigned_hostile_metadata_is_refused_and_restore_falls_back(
    two_steps: Path, what: str
) -> None:
    step_dir = two_steps / "step_000000002"
    md = pickle.loads((step_dir / ".metadata").read_bytes())
    info = next(i for i in md.storage_data.values())
    if what == "global":
        md.planner_data = _Boom()
    elif what == "absolute":
        info.relative_path = str(step_dir.parent / "step_000000001" / "COMMITTED")
    elif what == "huge":
        info.length = 2**40
    else:
        info.offset = -4
    _resign_metadata(step_dir, pickle.dumps(md))
    with pytest.raises(CorruptCheckpointError, match=r"\.metadata"):
        ckptstore.reader(f"file://{step_dir}")
    out = {"w": torch.zeros(64), "n": 0}
    with (
        CheckpointManager(str(two_steps), background="thread") as mgr,
        pytest.warns(RuntimeWarning, match="step 2"),
    ):
        assert mgr.restore(out) == 1
    assert out["n"] == 1


def test_stock_checkpoint_with_hostile_metadata_is_refused(saved: dict[str, Path]) -> None:
    import shutil

    d = saved["stock"].parent / "stock-hostile"
    shutil.copytree(saved["stock"], d)
    md = pickle.loads((d / ".metadata").read_bytes())
    next(iter(md.storage_data.values())).relative_path = "../../etc/passwd"
    (d / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(CorruptCheckpointError, match="not a name inside"):
        ckptstore.reader(f"file://{d}")
