"""Fuzz the Lightning plugin's parsers of bytes read back from storage.

``parse_pointer`` (a Lightning checkpoint name) and ``confine`` (its root) may only return
what they document or raise a ``CorruptCheckpointError``; nothing they accept can name a
step out of range or another root. Seeded with the crafted inputs of
test_lightning_untrusted.py (lightning_inputs.py).
"""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st
from lightning_inputs import MALFORMED_POINTERS

from ckptstore.errors import CorruptCheckpointError
from ckptstore_lightning._names import POINTER_FORMAT, Pointer, confine, parse_pointer
from tests.plugins.fuzzing import SETTINGS, json_values, seeded

_json = json_values

PARENT = "/runs/names"
HOME = "/runs/root"

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


@SETTINGS
@given(_pointer_bytes)
@seeded(list(MALFORMED_POINTERS.values()))
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
