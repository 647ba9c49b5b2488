"""Fuzz the node-local tier's job stamp parser (``tier.jobs.parse_stamp``): a stamp
is read from a directory anyone who can write the tier may have changed; only a
``TierJob`` or ``TierStampError`` comes out, and the root and run it returns are printable
text (safe in a message) that make the same stamp again."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ckptstore.errors import TierStampError
from ckptstore.tier.jobs import MAX_STAMP_BYTES, TierJob, parse_stamp

_GOOD = {"ckptstore_tier_job": 1, "root": "s3://bucket/run", "run": "slurm:42"}


def _check(data: bytes) -> None:
    try:
        job = parse_stamp(data, "fuzz")
    except TierStampError:
        return
    assert isinstance(job, TierJob)
    assert job.root.isprintable() and job.run.isprintable()
    assert parse_stamp(job.stamp(), "again") == job


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
@example(json.dumps(_GOOD).encode())
@example(json.dumps({**_GOOD, "root": "/x\x1b[31m"}).encode())
@example(json.dumps({**_GOOD, "root": "/x\u2028y"}).encode())
@example(json.dumps({**_GOOD, "run": "a b"}).encode())
@example(json.dumps({**_GOOD, "root": 7}).encode())
@example(json.dumps({**_GOOD, "ckptstore_tier_job": True}).encode())
@example(json.dumps({**_GOOD, "root": "/" * 5000}).encode())
@example(b"[" * 5000)
@example(b" " * (MAX_STAMP_BYTES + 1))
@example(b"\xff\xfe")
def test_parse_stamp_bytes(data: bytes) -> None:
    _check(data)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_GOOD)), _values))
def test_parse_stamp_documents(doc: dict) -> None:
    _check(json.dumps({**_GOOD, **doc}).encode())
