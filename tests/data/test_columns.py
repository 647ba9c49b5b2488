"""Array columns arrive as NumPy arrays per row and as stacked tensors per batch."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import torch

from ckptstore.data import DataLoader, ShardedDataset
from ckptstore.data.collate import PadCollate, pad_arrays
from ckptstore.data.columns import DecodedGroup, array_shape, to_rows
from ckptstore.errors import ConfigError


def _token_table(start: int, n: int, length: int | None) -> pa.Table:
    ids = list(range(start, start + n))
    lens = [length if length is not None else 1 + i % 5 for i in ids]
    tokens = [[i * 100 + j for j in range(k)] for i, k in zip(ids, lens)]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "tokens": pa.array(tokens, pa.list_(pa.int32())),
            "xyz": pa.array([[float(i)] * 3 for i in ids], pa.list_(pa.float32(), 3)),
            "words": pa.array([[f"w{i}"] for i in ids], pa.list_(pa.string())),
        }
    )


def _write(root, tables, fmt="parquet") -> None:
    root.mkdir()
    for i, t in enumerate(tables):
        if fmt == "parquet":
            pq.write_table(t, root / f"part-{i:04d}.parquet", row_group_size=4)
        else:
            with pa.OSFile(str(root / f"part-{i:04d}.arrow"), "wb") as f:
                with ipc.new_file(f, t.schema) as w:
                    for b in t.to_batches(max_chunksize=4):
                        w.write_batch(b)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
@pytest.mark.processes
def test_equal_length_lists_stack_into_one_tensor(tmp_path, fmt) -> None:
    _write(tmp_path / "ds", [_token_table(0, 10, 6), _token_table(10, 7, 6)], fmt)
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=str(tmp_path / "c"), seed=3)
    row = ds[12]
    assert isinstance(row["tokens"], np.ndarray) and row["tokens"].dtype == np.int32
    assert row["tokens"].tolist() == [1200 + j for j in range(6)]
    assert row["tokens"].flags.writeable  # a copy, not a read-only view of the mapped shard
    assert row["xyz"].tolist() == [12.0] * 3 and row["xyz"].dtype == np.float32
    assert row["words"] == ["w12"]  # lists of strings stay Python lists
    seen = []
    for batch in DataLoader(ds, 4, num_workers=2, prefetch=False):
        tokens = batch["tokens"]
        assert isinstance(tokens, torch.Tensor) and tokens.dtype == torch.int32
        assert tokens.shape == (len(batch["id"]), 6)
        assert batch["xyz"].shape == (len(batch["id"]), 3)
        for i, t in zip(batch["id"].tolist(), tokens.tolist()):
            assert t == [i * 100 + j for j in range(6)]
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(17))
    ds.close()


@pytest.mark.processes
def test_ragged_lists_pad_with_pad_collate(tmp_path) -> None:
    _write(tmp_path / "ds", [_token_table(0, 9, None), _token_table(9, 6, None)])
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=str(tmp_path / "c"), seed=5)
    with pytest.raises(RuntimeError, match="equal size"):
        next(iter(DataLoader(ds, 5, prefetch=False)))  # default_collate cannot stack them
    seen = []
    collate = PadCollate(pad_value=-1, keys=("tokens",))
    for batch in DataLoader(ds, 5, num_workers=2, collate_fn=collate, prefetch=False):
        lens = batch["tokens_len"].tolist()
        assert batch["tokens"].shape == (len(lens), max(lens))
        for i, n, t in zip(batch["id"].tolist(), lens, batch["tokens"].tolist()):
            assert n == 1 + i % 5
            assert t == [i * 100 + j for j in range(n)] + [-1] * (max(lens) - n)
        assert batch["xyz"].shape == (len(lens), 3)  # not padded: stacked as usual
        seen += batch["id"].tolist()
    assert sorted(seen) == list(range(15))
    ds.close()


def test_nested_fixed_size_and_nulls() -> None:
    pts = pa.array(
        [[[1.0, 2.0], [3.0, 4.0]], None, [], [[5.0, 6.0]]], pa.list_(pa.list_(pa.float64(), 2))
    )
    holes = pa.array([[1, None], [2, 3], [4], [5]], pa.list_(pa.int64()))
    table = pa.table({"pts": pts, "holes": holes, "k": [0, 1, 2, 3]})
    assert array_shape(pts.type) == (2,) and array_shape(pa.int64()) is None
    rows = to_rows(table.take([3, 1, 0, 2]))
    assert [r["k"] for r in rows] == [3, 1, 0, 2]
    assert rows[0]["pts"].tolist() == [[5.0, 6.0]] and rows[1]["pts"] is None
    assert rows[2]["pts"].shape == (2, 2) and rows[3]["pts"].shape == (0, 2)
    assert rows[2]["holes"] == [1, None]  # a column with null items stays Python lists
    assert list(rows[0]) == ["pts", "holes", "k"]  # column order kept


def test_pad_arrays_refuses_mismatched_inner_shapes() -> None:
    out, lens = pad_arrays([np.ones((2, 3)), np.ones((1, 3))], pad_value=0)
    assert out.shape == (2, 2, 3) and lens.tolist() == [2, 1] and out[1, 1].sum() == 0
    with pytest.raises(ConfigError, match="only the first axis may differ"):
        pad_arrays([np.ones((2, 3)), np.ones((2, 4))])


def test_decoded_group_rows_are_fresh_copies() -> None:
    table = _token_table(0, 6, None)
    group = DecodedGroup(table.slice(1, 4))  # a slice: offsets must honour it
    rows = group.rows([3, 0, 0])
    assert [r["id"] for r in rows] == [4, 1, 1]
    assert rows[0]["tokens"].tolist() == [400 + j for j in range(5)]
    assert rows[1]["tokens"].tolist() == [100, 101]
    rows[1]["tokens"][0] = -1  # a row is its own copy: the cached group stays as decoded
    assert rows[2]["tokens"].tolist() == [100, 101]
    assert group.rows([0])[0]["tokens"].tolist() == [100, 101]
    assert rows[0]["words"] == ["w4"] and rows[0]["xyz"].tolist() == [4.0] * 3
    with pytest.raises(IndexError):
        group.rows([4])


def test_every_number_type_and_nulls_decode_as_arrow_says(tmp_path) -> None:
    """Array columns are read from their Arrow buffers: each numeric type and bool, sliced
    and in several chunks, null rows and large lists, agree with ``to_pylist``."""
    types = [pa.int8(), pa.uint16(), pa.int64(), pa.uint64(), pa.float16(), pa.float64()]
    cols = {f"c{i}": pa.array([[1, 2], None, [], [3]], pa.list_(t)) for i, t in enumerate(types)}
    cols["flags"] = pa.array([[True, False, True], [False], None, []], pa.large_list(pa.bool_()))
    table = pa.table(cols)
    chunked = pa.concat_tables([table.slice(0, 3), table.slice(3, 1)])
    for t in (table, table.slice(1, 3), chunked):
        for got, want in zip(to_rows(t), t.to_pylist()):
            for name, value in want.items():
                if value is None:
                    assert got[name] is None
                else:
                    assert got[name].tolist() == value
                    assert got[name].dtype == np.dtype(
                        t.schema.field(name).type.value_type.to_pandas_dtype()
                    )


@pytest.mark.processes
def test_decoding_a_shard_imports_no_pandas(tmp_path) -> None:
    """pyarrow's ``to_numpy`` imports pandas when it is installed (1-2 s in each fresh
    DataLoader worker) and ``flatten`` pyarrow.compute (0.3 s); decoding array columns
    goes through neither."""
    import subprocess
    import sys

    pytest.importorskip("pandas")
    _write(tmp_path / "ds", [_token_table(0, 8, 4)])
    code = (
        "import sys, pyarrow.parquet as pq\n"
        "from ckptstore.data.columns import DecodedGroup\n"
        f"pf = pq.ParquetFile({str(tmp_path / 'ds' / 'part-0000.parquet')!r})\n"
        "rows = DecodedGroup(pf.read_row_group(1)).rows([0, 3])\n"
        "assert rows[1]['tokens'].tolist() == [700, 701, 702, 703], rows\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'"
        " or m == 'pyarrow.compute'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
