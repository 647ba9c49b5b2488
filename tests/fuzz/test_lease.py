"""Fuzz the lease parser (``engine.lease.parse_lease``): bytes read from a step's or a
root's lease are untrusted; only a ``LeaseInfo`` or ``CorruptCheckpointError`` comes out,
and every string it returns is plain printable ASCII (safe in a message)."""

from __future__ import annotations

import json
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ckptstore.engine.lease import MAX_LEASE_BYTES, LeaseInfo, parse_lease
from ckptstore.errors import CorruptCheckpointError

_GOOD = {
    "ckptstore_lease": 1,
    "run": "job-1",
    "host": "node-17",
    "pid": 4242,
    "node": "boot:1",
    "token": "abc",
    "time": 1.7e9,
    "attempt": "feedbeef",
}
_PLAIN = re.compile(r"^[\x21-\x7e]*$")


def _check(data: bytes) -> None:
    try:
        info = parse_lease(data, "fuzz")
    except CorruptCheckpointError:
        return
    assert isinstance(info, LeaseInfo)
    for text in (info.run, info.host, info.node, info.token, info.attempt):
        assert _PLAIN.match(text)
    assert 0 <= info.pid < 1 << 32 and 0 <= info.time < 1e11


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
@example(json.dumps(_GOOD).encode())
@example(json.dumps({**_GOOD, "run": "bad\x1b[31mrun"}).encode())
@example(json.dumps({**_GOOD, "pid": True}).encode())
@example(json.dumps({**_GOOD, "time": float("nan")}).encode().replace(b"NaN", b"NaN"))
@example(json.dumps({**_GOOD, "time": 1e300}).encode())
@example(json.dumps({**_GOOD, "attempt": "../x"}).encode())
@example(b"[" * 5000)
@example(b" " * (MAX_LEASE_BYTES + 1))
@example(b"\xff\xfe")
def test_parse_lease_bytes(data: bytes) -> None:
    _check(data)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_GOOD)), _values, max_size=8))
def test_parse_lease_fields(fields: dict) -> None:
    _check(json.dumps({**_GOOD, **fields}).encode())
