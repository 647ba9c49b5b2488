"""Every tensor comes back as saved: conjugate and negative views, non-contiguous and
offset views, 0-dim and zero-size tensors, every dtype, on both sides of the direct-read
threshold, property-tested against stock DCP's ``FileSystemReader`` reading the same
files (single process)."""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ckptstore
from ckptstore.dcp.decoding import decode_tensor
from ckptstore.dcp.encoding import (
    PAYLOAD_MIN,
    encode_item,
    small_item_bytes,
    write_item,
)
from ckptstore.dcp.reader import StockCheckpointWarning

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
    *(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)),
]
VIEWS = ["plain", "conj", "neg", "transpose", "offset", "strided"]


def _make(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    size = torch.empty((), dtype=dtype).element_size()
    base = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g).view(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.where(torch.isnan(base), torch.zeros((), dtype=dtype), base)
    return base[:n].clone()


def _view(t: torch.Tensor, view: str) -> torch.Tensor:
    if view == "conj":
        return t.conj() if t.is_complex() else t
    if view == "neg":  # torch has no neg kernel for float8 (not even to pickle the view)
        return (
            t._neg_view()
            if (t.is_floating_point() or t.is_complex()) and t.element_size() > 1
            else t
        )
    if view == "transpose" and t.numel() >= 4 and t.numel() % 2 == 0:
        return t.reshape(2, -1).t()
    if view == "offset" and t.numel() > 2:
        return t[1:]
    if view == "strided" and t.numel() > 2:
        return t[::2]
    return t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.resolve_conj().resolve_neg(), b.resolve_conj().resolve_neg()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.numel() == 0 or bool(torch.equal(_bytes_of(a), _bytes_of(b)))


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else t


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    dtype=st.sampled_from(DTYPES),
    view=st.sampled_from(VIEWS),
    n=st.sampled_from([0, 1, 3, 17, 1000, PAYLOAD_MIN // 2 + 7, PAYLOAD_MIN + 5]),
    scalar=st.booleans(),
    seed=st.integers(0, 2**16),
)
@example(dtype=torch.complex128, view="plain", n=0, scalar=True, seed=0)  # wider than 8 bytes
def test_loads_what_stock_dcp_loads(tmp_path_factory, dtype, view, n, scalar, seed) -> None:
    base = _make(dtype, max(n, 1), seed)
    saved = {
        "t": base[0] if scalar else _view(base[:n], view),
        "small": _view(_make(dtype, 6, seed + 1), view),  # always under the threshold
    }
    url = str(tmp_path_factory.mktemp("v") / "step_000000001")
    ckptstore.save(dict(saved), url)
    ours = {k: torch.zeros(v.shape, dtype=dtype) for k, v in saved.items()}
    ckptstore.load(ours, url)
    stock = {k: torch.zeros(v.shape, dtype=dtype) for k, v in saved.items()}
    dcp.load(stock, storage_reader=dcp.FileSystemReader(url))
    for k, want in saved.items():
        assert _same(stock[k], want), ("stock", k, dtype, view, n)
        assert _same(ours[k], want), ("ckptstore", k, dtype, view, n)


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_stock_written_conj_and_neg_views_decode_with_their_bits(tmp_path, view) -> None:
    """Stock FileSystemWriter keeps torch's conj / neg bit in the item; decode honours it."""
    x = torch.randn(PAYLOAD_MIN // 8 + 3, dtype=torch.complex64)
    v = x.conj() if view == "conj" else x._neg_view()
    back = decode_tensor(bytearray(encode_item(v)))
    assert torch.equal(back.resolve_conj().resolve_neg(), v.resolve_conj().resolve_neg())
    path = str(tmp_path / "stock")
    dcp.save({"v": v}, storage_writer=dcp.FileSystemWriter(path))
    with pytest.warns(StockCheckpointWarning):
        out = {"v": torch.zeros_like(x)}
        ckptstore.load(out, path)
    assert torch.equal(out["v"], v.resolve_conj().resolve_neg())


class _Writes(io.RawIOBase):
    """A sink that keeps every write it is handed (as ``ItemSink`` receives them)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def, override]
        self.writes.append(bytes(b))
        return len(self.writes[-1])


@pytest.mark.parametrize("n", [3, PAYLOAD_MIN // 4 - 1, PAYLOAD_MIN // 4 * 2])
def test_an_item_below_the_payload_size_is_built_in_memory_a_larger_one_streams(n) -> None:
    """``torch.save`` writes ~40 records per item: a small item's bytes are built in memory
    as one buffer (``small_item_bytes``, which the writer gathers with its neighbours), a
    larger one streams through its sink; the bytes are ``torch.save``'s (without the zip
    CRC-32) either way."""
    t = torch.arange(n, dtype=torch.float32)
    sink = _Writes()
    write_item(t, sink)
    expected = io.BytesIO()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(t, expected)
    finally:
        torch.serialization.set_crc32_options(True)
    assert b"".join(sink.writes) == expected.getvalue()
    small = small_item_bytes(t)
    assert (small is not None) == (t.nbytes < PAYLOAD_MIN)
    assert small is None or bytes(small) == expected.getvalue()
