"""decode_tensor: saved tensors come back as views of the read buffer, bit for bit."""

import io

import pytest
import torch

from ckptstore.dcp.decoding import _tensor_view, decode_tensor


def saved(obj: object) -> bytearray:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return bytearray(buf.getvalue())


CASES = {
    "matrix": torch.arange(10.0).reshape(2, 5),
    "transposed": torch.arange(10.0).reshape(2, 5).t(),
    "bfloat16": torch.randn(3, 4, 5).to(torch.bfloat16),
    "bool": torch.tensor([True, False, True]),
    "scalar": torch.tensor(3.5),
    "offset view": torch.arange(12, dtype=torch.int64)[2:],
    "strided view": torch.randn(4, 4)[::2],
    "int8": torch.arange(-5, 5, dtype=torch.int8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_plain_tensors_decode_as_views_of_the_buffer(name: str) -> None:
    tensor = CASES[name]
    data = saved(tensor)
    out = decode_tensor(data)
    assert torch.equal(out, tensor) and out.dtype == tensor.dtype
    assert out.stride() == tensor.stride() and out.storage_offset() == tensor.storage_offset()
    base = torch.frombuffer(data, dtype=torch.uint8).data_ptr()
    assert base <= out.data_ptr() < base + len(data)  # no copy: it aliases the buffer


def test_everything_else_falls_back_to_torch_load() -> None:
    for other in (
        torch.zeros(0, 3),
        torch.eye(3).to_sparse(),
    ):
        data = saved(other)
        assert _tensor_view(memoryview(data)) is None
        out = decode_tensor(data)
        assert out.shape == other.shape and torch.equal(out.to_dense(), other.to_dense())
    assert _tensor_view(memoryview(saved({"not": "a tensor"}))) is None
    readonly = bytes(saved(CASES["matrix"]))  # a view would be read-only: copied instead
    assert torch.equal(decode_tensor(readonly), CASES["matrix"])


def test_damaged_bytes_never_give_an_out_of_bounds_view() -> None:
    data = saved(torch.arange(100.0))
    assert _tensor_view(memoryview(data[: len(data) // 2])) is None  # truncated: no zip
    with pytest.raises(Exception):  # noqa: B017 - torch.load's own error, whatever it is
        decode_tensor(data[: len(data) // 2])


def _stock_without_crc32(tensor: torch.Tensor) -> bytes:
    torch.serialization.set_crc32_options(False)
    try:
        return bytes(saved(tensor))
    finally:
        torch.serialization.set_crc32_options(True)


ITEMS = {
    **CASES,
    "parameter": torch.nn.Parameter(torch.randn(5, 7)),
    "empty": torch.zeros(0, 3),
    "large": torch.randn(128, 1024),
    "complex conj": torch.randn(4, dtype=torch.complex64).conj(),
}


@pytest.mark.parametrize("name", list(ITEMS))
def test_items_are_torch_save_bytes_without_the_zip_crc32(name: str) -> None:
    """What an item is: what torch.save writes of ``cpu_item(tensor)`` with
    set_crc32_options(False) (the manifest's CRC32C covers every byte), also when written
    as a cached frame around the storage's bytes; it loads with torch.load and decodes as
    a view; the process-wide option stays as the user left it."""
    from ckptstore.dcp import encoding

    assert encoding._crc_free_ok()  # the fast path is live on the supported torch
    item = encoding.cpu_item(ITEMS[name])
    assert isinstance(item, torch.Tensor)
    stock = _stock_without_crc32(item)
    for _ in range(2):  # the frame is made, then reused
        assert bytes(encoding.encode_item(ITEMS[name])) == stock
        sink = io.BytesIO()
        encoding.write_item(ITEMS[name], sink)
        assert sink.getvalue() == stock
        small = encoding.small_item_bytes(item)  # a small item's bytes, built in memory
        if item.untyped_storage().nbytes() < encoding.PAYLOAD_MIN:
            assert small is not None and bytes(small) == stock
        else:
            assert small is None  # streamed through an ItemSink instead
    assert (encoding._frame(item) is not None) == (item.nbytes > 0)
    assert torch.equal(torch.load(io.BytesIO(stock), weights_only=True), item)
    assert torch.equal(decode_tensor(bytearray(stock)), item)
    assert torch.serialization.get_crc32_options() is True
    import zipfile

    assert zipfile.ZipFile(io.BytesIO(saved(item))).testzip() is None  # torch.save: CRCs


def test_tensors_of_one_shape_share_a_frame_and_keep_their_own_bytes() -> None:
    from ckptstore.dcp.encoding import encode_item

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    assert bytes(encode_item(a)) == _stock_without_crc32(a)
    assert bytes(encode_item(b)) == _stock_without_crc32(b)
    assert torch.equal(decode_tensor(bytearray(encode_item(b))), b)


def test_a_record_whose_zip_crc32_is_wrong_is_not_taken_as_a_view() -> None:
    data = saved(torch.arange(100.0))
    at = bytes(data).find(b"cpu")  # in data.pkl: the storage's location, which is not read
    data[at : at + 3] = b"cpv"  # so only data.pkl's CRC-32 says the bytes changed
    assert _tensor_view(memoryview(data)) is None
    assert torch.equal(decode_tensor(data), torch.arange(100.0))  # torch.load ignores it


def test_where_torch_moved_its_writer_names_items_are_written_by_torch_save(monkeypatch) -> None:
    """The guard tests/test_torch_range.py lists: where the private names are gone (the
    import in ``_save_crc_free`` fails), items get ``torch.save``'s bytes (with the zip
    CRC-32), not an error."""
    from ckptstore.dcp import encoding

    def moved(*_: object) -> None:
        raise ImportError("cannot import name '_save' from 'torch.serialization'")

    monkeypatch.setattr(encoding, "_save_crc_free", moved)
    monkeypatch.setattr(encoding, "_CRC_FREE", [])
    tensor = torch.randn(8, 8)
    assert bytes(encoding.encode_item(tensor)) == bytes(saved(tensor))
    assert encoding._CRC_FREE == [False]
