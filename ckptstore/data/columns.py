"""Decoded rows: an Arrow table or record batch as a list of ``{column: value}`` dicts.

Scalars become Python values (``int``, ``float``, ``str``, ``bytes``, ``None``), as
``pyarrow``'s ``to_pylist`` makes them. *Array columns* become one NumPy array per row, so
``torch``'s ``default_collate`` stacks a batch of them into one tensor ``[batch, ...]``
instead of transposing Python lists into a list of per-position tensors. An array column
is a ``list``, ``large_list`` or ``fixed_size_list`` whose items are numbers or booleans,
or fixed-size lists of them (``list<fixed_size_list<float32>[3]>`` gives arrays of shape
``(n, 3)``). The array has the items' dtype (``int32`` stays ``int32``) and is writable: a
slice of one copy per decoded batch, never a view of the memory-mapped shard. A null row is
``None``. Everything else —
lists of strings, lists of variable-length lists, structs, and array columns with null
*items* — stays as ``to_pylist`` gives it.

Rows of different lengths stack only with a padding collate: see
:func:`ckptstore.data.collate.pad_collate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DecodedGroup", "array_shape", "to_rows"]


def _is_list(t: Any) -> bool:
    import pyarrow.types as pat

    return bool(pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t))


def array_shape(t: Any) -> tuple[int, ...] | None:
    """Inner shape of one row of an array column of type ``t``; None: not an array column.

    ``list<int64>`` -> ``()`` (rows are 1-d of any length); ``fixed_size_list<f32>[4]`` ->
    ``()`` as well (the outer length is the row's); ``list<fixed_size_list<f32>[3]>`` ->
    ``(3,)``.
    """
    import pyarrow.types as pat

    if not _is_list(t):
        return None
    inner: list[int] = []
    item = t.value_type
    while pat.is_fixed_size_list(item):
        inner.append(int(item.list_size))
        item = item.value_type
    if not (pat.is_integer(item) or pat.is_floating(item) or pat.is_boolean(item)):
        return None
    return tuple(inner)


class _ArrayColumn:
    """One list column of a decoded group: flat item values and where each row's start."""

    __slots__ = ("values", "starts", "lengths", "valid", "inner", "per")

    def __init__(self, col: Any, inner: tuple[int, ...]) -> None:
        import pyarrow as pa
        import pyarrow.types as pat

        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        n = len(col)
        # Where each row's items start and end in the flat leaf values, level by level
        # (``flatten`` would do it but imports pyarrow.compute: 0.27 s in each worker).
        if pat.is_fixed_size_list(col.type):
            offs = (col.offset + np.arange(n + 1, dtype=np.int64)) * col.type.list_size
        else:
            offs = _numpy(col.offsets).astype(np.int64)  # the slice's own, n + 1 of them
        child = col.values  # the whole child: offsets index it, not the slice
        for size in inner:  # a fixed-size list level: item j is values[(offset + j) * size:]
            if _nulls(child, offs):
                raise _HasNulls
            offs = (child.offset + offs) * size
            child = child.values
        if _nulls(child, offs):
            raise _HasNulls
        self.values = _numpy(child)[offs[0] : offs[-1]].copy()  # owns its memory
        valid = np.ones(n, dtype=bool) if not col.null_count else _valid(col)
        self.per = int(np.prod(inner, dtype=np.int64)) if inner else 1
        self.lengths = np.where(valid, np.diff(offs) // self.per, 0).astype(np.int64)
        self.starts = (offs[:-1] - offs[0]).astype(np.int64)
        self.valid = valid
        self.inner = inner

    def row(self, i: int, valid: bool, start: int, n: int) -> np.ndarray | None:
        """Row ``i`` as a new array (a copy: writable, never a view of the cached group)."""
        if not valid:
            return None
        return self.values[start : start + n * self.per].reshape((n, *self.inner)).copy()


class _HasNulls(Exception):
    """An array column whose items hold nulls: it stays Python lists."""


# pyarrow's own ``to_numpy`` (and ``np.asarray`` of an array) goes through its pandas
# conversion layer, which imports pandas whenever it is installed: 1.3-1.8 s in every
# fresh DataLoader worker's first batch on a loaded 2-core machine (benchmarks/data/rank_setup.py,
# -X importtime), for arrays that are one buffer NumPy can view. So the buffers are read
# here directly, for exactly the types an array column has (array_shape): numbers and
# booleans without nulls, and list offsets.


def _numpy(arr: Any) -> np.ndarray:
    """A read-only NumPy view of a null-free numeric or boolean pyarrow Array (booleans:
    a new array, Arrow packs them into bits)."""
    import pyarrow.types as pat

    n, off = len(arr), arr.offset
    data = arr.buffers()[1]
    if pat.is_boolean(arr.type):
        return _bits(data, off, n)
    dtype = np.dtype(_DTYPES[str(arr.type)])
    if data is None or n == 0:
        return np.empty(0, dtype)
    return np.frombuffer(data, dtype, count=n, offset=off * dtype.itemsize)


def _bits(buf: Any, off: int, n: int) -> np.ndarray:
    if buf is None or n == 0:
        return np.zeros(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")
    return bits[off : off + n].astype(bool)


def _nulls(arr: Any, offs: np.ndarray) -> int:
    """Nulls among ``arr``'s items ``offs[0]:offs[-1]`` (those the rows use)."""
    lo, hi = int(offs[0]), int(offs[-1])
    return int(arr.slice(lo, hi - lo).null_count) if arr.null_count else 0


def _valid(col: Any) -> np.ndarray:
    """Which rows of ``col`` are not null (its validity bitmap)."""
    return _bits(col.buffers()[0], col.offset, len(col))


_DTYPES = {
    **{f"int{b}": f"<i{b // 8}" for b in (8, 16, 32, 64)},
    **{f"uint{b}": f"<u{b // 8}" for b in (8, 16, 32, 64)},
    "halffloat": "<f2",
    "float": "<f4",
    "double": "<f8",
}


class DecodedGroup:
    """One row group (or record batch) decoded once; rows are then cheap to take.

    Array columns are held as one flat NumPy array per column (a copy of the shard's
    bytes), every other column as the Python values ``to_pylist`` makes. :meth:`rows` gives
    the same dicts as :func:`to_rows` of ``table.take(indices)``, each array a fresh copy.
    """

    def __init__(self, table: Any) -> None:
        self.names = list(table.schema.names)
        self.num_rows = int(table.num_rows)
        self.nbytes = int(table.nbytes)
        self._arrays: dict[str, _ArrayColumn] = {}
        self._plain: dict[str, list[Any]] = {}
        for name in self.names:
            inner = array_shape(table.schema.field(name).type)
            if inner is not None:
                try:
                    self._arrays[name] = _ArrayColumn(table.column(name), inner)
                    continue
                except _HasNulls:
                    pass
            self._plain[name] = table.column(name).to_pylist()

    def rows(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """Rows ``indices`` (positions in the group) as dicts, in the order given."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_rows):
            raise IndexError(f"row index out of range for a group of {self.num_rows} rows")
        at = idx.tolist()
        cols: dict[str, list[Any]] = {}
        for name in self.names:
            plain = self._plain.get(name)
            if plain is not None:
                cols[name] = [plain[i] for i in at]
                continue
            a = self._arrays[name]
            cols[name] = [
                a.row(i, v, s, n)
                for i, v, s, n in zip(
                    at, a.valid[idx].tolist(), a.starts[idx].tolist(), a.lengths[idx].tolist()
                )
            ]
        return [{n: cols[n][j] for n in self.names} for j in range(len(at))]


def to_rows(table: Any) -> list[dict[str, Any]]:
    """Rows of a ``pyarrow.Table`` / ``RecordBatch`` as dicts, array columns as NumPy arrays."""
    return DecodedGroup(table).rows(np.arange(int(table.num_rows)))
