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

from typing import Any

import numpy as np

__all__ = ["array_shape", "to_rows"]


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


def _arrays(col: Any, inner: tuple[int, ...]) -> list[np.ndarray | None] | None:
    """One array per row of a list array ``col``; None where items hold nulls (fallback)."""
    import pyarrow as pa
    import pyarrow.types as pat

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    leaf = col.flatten()  # one level down, honouring the slice; null rows add nothing
    for _ in inner:
        if leaf.null_count:
            return None
        leaf = leaf.flatten()
    if leaf.null_count:
        return None
    values = np.array(leaf.to_numpy(zero_copy_only=False))  # a copy: writable, owns memory
    if pat.is_fixed_size_list(col.type):
        lengths = np.full(len(col), col.type.list_size, dtype=np.int64)
    else:
        lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    valid = (
        np.ones(len(col), dtype=bool)
        if not col.null_count
        else np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    )
    lengths = np.where(valid, lengths, 0).astype(np.int64)
    per = int(np.prod(inner, dtype=np.int64)) if inner else 1
    parts = np.split(values, np.cumsum(lengths * per)[:-1])
    return [
        part.reshape((int(n), *inner)) if ok else None
        for part, n, ok in zip(parts, lengths.tolist(), valid.tolist())
    ]


def to_rows(table: Any) -> list[dict[str, Any]]:
    """Rows of a ``pyarrow.Table`` / ``RecordBatch`` as dicts, array columns as NumPy arrays."""
    names = list(table.schema.names)
    arrays: dict[str, list[np.ndarray | None]] = {}
    for name in names:
        inner = array_shape(table.schema.field(name).type)
        if inner is not None:
            got = _arrays(table.column(name), inner)
            if got is not None:
                arrays[name] = got
    if not arrays:
        return table.to_pylist()
    rest = [n for n in names if n not in arrays]
    plain = table.select(rest).to_pylist() if rest else [{} for _ in range(table.num_rows)]
    return [
        {n: arrays[n][i] if n in arrays else base[n] for n in names} for i, base in enumerate(plain)
    ]
