"""Fuzz the data layer's parsers of bytes it did not write: shard footers (Parquet, Arrow
IPC), the cache ledger in ``budget.lock``, cache file names, and a loader's saved state.

Each may only return a checked value or raise its documented error (``ShardFormatError``,
``DataOrderError``; the ledger and the name predicate never raise); every read a footer
parser makes lies inside the file, and what it reads in all stays near the file's size.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ckptstore.data.cachefiles import cache_name, cache_paths, make_key
from ckptstore.data.cachelocks import Ledger, Lock
from ckptstore.data.formats import MAX_ROWS_PER_BYTE, inspect
from ckptstore.data.order import DataOrderError, OrderState
from ckptstore.errors import ShardFormatError
from tests.adversarial.test_data_layer import _arrow_claiming, _parquet_claiming

FUZZ = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _parquet() -> bytes:
    buf = io.BytesIO()
    table = pa.table({"id": np.arange(50, dtype=np.int64), "s": [str(i) for i in range(50)]})
    pq.write_table(table, buf, row_group_size=16)
    return buf.getvalue()


def _arrow() -> bytes:
    buf = io.BytesIO()
    table = pa.table({"id": np.arange(50, dtype=np.int64)})
    with ipc.new_file(buf, table.schema) as w:
        for b in table.to_batches(max_chunksize=16):
            w.write_batch(b)
    return buf.getvalue()


SEEDS = {"parquet": _parquet(), "arrow": _arrow()}


def _check_footer(fmt: str, data: bytes) -> None:
    size = len(data)
    total = [0]

    def read(off: int, n: int) -> bytes:
        assert 0 <= off and 0 <= n and off + n <= size, (off, n, size)
        total[0] += n
        return data[off : off + n]

    try:
        rows, digest, _schema = inspect(fmt, size, read)
    except ShardFormatError:
        return
    finally:
        assert total[0] <= 3 * size + 64 * 1024  # reads stay linear in the file
    assert all(isinstance(n, int) and n >= 0 for n in rows)
    assert sum(rows) <= MAX_ROWS_PER_BYTE * max(size, 1)
    assert isinstance(digest, str) and len(digest) == 64


def _mutate(seed: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    data = bytearray(seed)
    for pos, value in edits:
        data[pos % len(data)] = value
    return bytes(data[: max(0, len(data) - cut)])


_EDITS = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8)


@FUZZ
@given(edits=_EDITS, cut=st.integers(0, 40), tail=st.booleans())
@example(edits=[], cut=0, tail=True)
def test_fuzz_parquet_footer(edits, cut, tail) -> None:
    seed = SEEDS["parquet"]
    if tail:  # most edits land in the footer, where the parser looks
        flen = int.from_bytes(seed[-8:-4], "little")
        edits = [(len(seed) - 8 - flen + p % (flen + 8), v) for p, v in edits]
    _check_footer("parquet", _mutate(seed, edits, cut))


@FUZZ
@given(edits=_EDITS, cut=st.integers(0, 40))
@example(edits=[], cut=0)
def test_fuzz_arrow_footer(edits, cut) -> None:
    _check_footer("arrow", _mutate(SEEDS["arrow"], edits, cut))


@FUZZ
@given(fmt=st.sampled_from(["parquet", "arrow"]), data=st.binary(max_size=512))
@example(fmt="parquet", data=_parquet_claiming(1 << 50, real=10))
@example(fmt="parquet", data=_parquet_claiming(-5, real=10))
@example(fmt="arrow", data=_arrow_claiming(1 << 50, real=10))
@example(fmt="arrow", data=_arrow_claiming(-1, real=10))
@example(fmt="arrow", data=b"ARROW1\0\0" + b"\xff" * 8 + b"\0\0\0\0ARROW1")
@example(fmt="parquet", data=b"PAR1" + b"\x7f\xff\xff\xff" + b"PAR1")
def test_fuzz_footer_random_bytes(fmt, data) -> None:
    _check_footer(fmt, data)


@FUZZ
@given(data=st.binary(max_size=64))
@example(data=b"")
@example(data=b"-1 0")
@example(data=b"1_000 2")
@example(data=b"\xd9\xa1 1")  # a non-ASCII digit
@example(data=b"99999999999999999999 1")
@example(data=b"12 34".ljust(Ledger.WIDTH - 1) + b"\n")
def test_fuzz_ledger(data, tmp_path_factory) -> None:
    got = Ledger.parse(data)
    assert got is None or (
        len(got) == 2 and all(isinstance(v, int) and 0 <= v < 10**19 for v in got)
    )
    base = str(tmp_path_factory.mktemp("ledger"))
    with open(os.path.join(base, "budget.lock"), "wb") as f:
        f.write(data)
    with Lock(cache_paths(base), "budget.lock") as lock:
        ledger = Ledger(lock)
        assert ledger.read() == got
        ledger.write(7, 3)
        assert ledger.read() == (7, 3)  # a rewrite never leaves a longer one's tail
        ledger.free(10)
        assert ledger.read() == (0, 3)


@FUZZ
@given(name=st.text(max_size=120))
@example(name="notes.data")
@example(name="notes.data.tmp-1")
@example(name="0123456789abcdef01234567-x.data.tmp-1-dead")
@example(name=make_key(b"u|p|1|d", "dir/shard.data") + ".data.tmp-12-" + "ab" * 16)
def test_fuzz_cache_name(name) -> None:
    got = cache_name(name)
    if got is not None:
        key, kind, temp = got
        assert kind in ("data", "meta") and name.startswith(key + "." + kind)
        assert temp == (name != f"{key}.{kind}")
        assert "/" not in name and not name.startswith(".")


@FUZZ
@given(path=st.text(max_size=80), ident=st.binary(max_size=40))
def test_every_key_the_cache_makes_is_its_own(path, ident) -> None:
    key = make_key(ident, path)
    assert cache_name(key + ".data") == (key, "data", False)
    assert cache_name(f"{key}.data.tmp-{os.getpid()}-{'0f' * 16}") == (key, "data", True)
    assert cache_name(f"{key}.meta.tmp-{'0f' * 16}") == (key, "meta", True)


_VALUES = st.one_of(
    st.integers(min_value=-(1 << 80), max_value=1 << 80),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.floats(allow_nan=True),
)


@FUZZ
@given(
    cursor=_VALUES,
    seed=_VALUES,
    buckets=_VALUES,
    fingerprint=st.one_of(st.text(max_size=8), st.integers()),
    shuffle=_VALUES,
    version=st.sampled_from([1, 1, 1, 2, None, "1"]),
)
@example(cursor=1 << 63, seed=0, buckets=1, fingerprint="f", shuffle=True, version=1)
def test_fuzz_saved_order_state(cursor, seed, buckets, fingerprint, shuffle, version) -> None:
    doc = {"version": version, "cursor": cursor, "seed": seed, "buckets": buckets}
    doc.update(fingerprint=fingerprint, shuffle=shuffle)
    try:
        state = OrderState.from_dict(doc)
    except DataOrderError:
        return
    assert 0 <= state.cursor <= 1 << 62 and state.buckets >= 1
