"""Fuzz the integrations' parsers of bytes read back from storage.

``parse_pointer`` (a Lightning checkpoint name), ``confine`` (its root), ``parse_index``
(a Hugging Face folder index) and ``confined`` (a local path an index names) may only
return what they document or raise a ``CorruptCheckpointError``; nothing they accept can
name a file outside its folder or a step out of range. Seeded with the crafted inputs of
tests/adversarial/test_integrations.py.
"""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ckptstore.engine.paths import is_safe_name  # noqa: E402
from ckptstore.errors import CorruptCheckpointError  # noqa: E402
from ckptstore.integrations._folder_index import confined, parse_index  # noqa: E402
from ckptstore.integrations._lightning_names import (  # noqa: E402
    POINTER_FORMAT,
    Pointer,
    confine,
    parse_pointer,
)
from tests.adversarial.integration_inputs import (  # noqa: E402
    MALFORMED_INDEXES,
    MALFORMED_POINTERS,
)

SETTINGS = settings(
    max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
PARENT = "/runs/names"
HOME = "/runs/root"

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
_pointer_doc = st.fixed_dictionaries(
    {
        "format": st.just(POINTER_FORMAT) | st.text(max_size=8),
        "version": st.just(1) | _json,
        "root": st.sampled_from([".", HOME, "/elsewhere", "s3://b/r/", ""]) | _json,
        "step": st.integers(-5, 10**10) | _json,
        "follow": st.sampled_from(["step", "newest"]) | _json,
    },
    optional={"extra": _json},
)
_pointer_bytes = (
    st.binary(max_size=300)
    | _pointer_doc.map(lambda d: json.dumps(d).encode())
    | _json.map(lambda d: json.dumps(d).encode())
)


def _seeded(examples):
    def deco(fn):
        for value in examples:
            fn = example(value)(fn)
        return fn

    return deco


@SETTINGS
@given(_pointer_bytes)
@_seeded(list(MALFORMED_POINTERS.values()))
@example(json.dumps({"format": POINTER_FORMAT, "version": 1, "root": ".", "step": 3,
                     "follow": "step"}).encode())  # fmt: skip
def test_parse_pointer_returns_a_bounded_pointer_or_a_corrupt_error(data: bytes) -> None:
    try:
        ptr = parse_pointer(data, PARENT)
    except CorruptCheckpointError:
        return
    if ptr is None:  # not a pointer at all: a stock .ckpt never starts like JSON
        assert data.lstrip(b" \t\r\n")[:1] not in (b"{", b"[")
        return
    assert isinstance(ptr, Pointer)
    assert type(ptr.step) is int and 0 <= ptr.step <= 999_999_999
    assert isinstance(ptr.newest, bool) and isinstance(ptr.root, str) and ptr.root
    try:
        kept = confine(ptr, PARENT, HOME)
    except CorruptCheckpointError:
        assert ptr.root not in (PARENT, HOME)
        return
    assert kept.root in (PARENT, HOME)


_rel = st.text(st.sampled_from("ab./\\\x00"), min_size=0, max_size=8)
_entry = st.fixed_dictionaries(
    {"size": st.integers(-2, 2**60) | _json, "crc32c": st.integers(-1, 2**40) | _json}
)
_index_doc = st.fixed_dictionaries(
    {
        "format": st.just("ckptstore.folder") | _json,
        "version": st.just(1) | _json,
        "name": st.sampled_from(["checkpoint-2", "../x", "..", "x_2", ".h_2"]) | _json,
        "path": st.sampled_from(["/o/checkpoint-2", "o/checkpoint-2", "/o/../checkpoint-2"])
        | _json,
        "files": st.dictionaries(_rel, _entry | _json, max_size=4) | _json,
    },
    optional={"extra": _json},
)
_index_bytes = st.binary(max_size=300) | _index_doc.map(lambda d: json.dumps(d).encode())


def _index_seed(value: object) -> bytes:
    return value if isinstance(value, bytes) else json.dumps(value).encode()


@SETTINGS
@given(_index_bytes)
@_seeded([_index_seed(index) for index, _files in MALFORMED_INDEXES.values()])
def test_parse_index_accepts_only_names_that_stay_inside(data: bytes) -> None:
    try:
        index = parse_index(data, 2)
    except CorruptCheckpointError:
        return
    name = index["name"]
    assert is_safe_name(name) and "/" not in name and not name.startswith(".")
    assert os.path.isabs(index["path"]) and os.path.basename(index["path"]) == name
    for rel, want in index["files"].items():
        assert is_safe_name(rel)
        assert type(want["size"]) is int and want["size"] >= 0
        assert type(want["crc32c"]) is int and 0 <= want["crc32c"] < 2**32


_path = st.text(st.sampled_from("ab./\x00"), max_size=12)


@SETTINGS
@given(_path)
@example("../x")
@example("/etc/passwd")
@example("a/../../x")
@example("")
@example("link/x")
def test_confined_keeps_every_accepted_path_below_the_base(tmp_path, path: str) -> None:
    base = tmp_path / "base"
    base.mkdir(exist_ok=True)
    if not (base / "link").exists():
        os.symlink(tmp_path, base / "link")
    try:
        got = confined(path if os.path.isabs(path) else os.path.join(base, path), str(base))
    except CorruptCheckpointError:
        return
    real = os.path.realpath(base)
    assert got.startswith(real + os.sep)
    assert os.path.realpath(got) == got  # no link on the way, no '..'
