"""Collate functions for :class:`~ckptstore.data.loader.DataLoader` batches of dict rows.

The loader's default, ``torch``'s ``default_collate``, stacks array columns (NumPy arrays,
see :mod:`ckptstore.data.columns`) into one tensor when every row has the same shape. For
variable-length rows (token sequences, say) pass ``collate_fn=PadCollate(pad_value=0)``::

    loader = DataLoader(ds, batch_size=8, collate_fn=PadCollate(pad_value=-100))
    batch["tokens"]       # LongTensor [8, longest row in this batch], padded at the end
    batch["tokens_len"]   # LongTensor [8]: each row's own length

:class:`PadCollate` is a frozen dataclass, so it pickles into DataLoader workers under any
start method.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from ckptstore.errors import ConfigError

__all__ = ["PadCollate", "pad_arrays"]


def pad_arrays(rows: Sequence[np.ndarray], pad_value: float = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(stacked, lengths)``: rows padded at the end of axis 0 to the longest.

    Rows must agree on dtype and on every axis but the first. Pure: no torch.
    """
    if not rows:
        raise ConfigError("pad_arrays needs at least one row")
    first = rows[0]
    for r in rows[1:]:
        if r.shape[1:] != first.shape[1:] or r.dtype != first.dtype:
            raise ConfigError(
                f"cannot pad rows of shape {r.shape} ({r.dtype}) beside {first.shape} "
                f"({first.dtype}): only the first axis may differ"
            )
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    out = np.full(
        (len(rows), int(lengths.max(initial=0)), *first.shape[1:]), pad_value, first.dtype
    )
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, lengths


@dataclass(frozen=True)
class PadCollate:
    """Collate dict rows, padding variable-length array columns (see the module docstring).

    ``keys``: the columns to pad (default: every column whose values are NumPy arrays of at
    least one dimension). ``lengths``: also return ``<key><suffix>`` with each row's length.
    Other columns go through ``default_collate``. A batch that is not a list of dicts goes
    through ``default_collate`` unchanged.
    """

    pad_value: float = 0
    keys: tuple[str, ...] | None = None
    lengths: bool = True
    suffix: str = "_len"

    def __call__(self, batch: list[Any]) -> Any:
        """Collate ``batch``: padded array columns plus their ``<col>_len``, the rest as
        ``default_collate`` does."""
        if not batch or not all(isinstance(row, dict) for row in batch):
            return default_collate(batch)
        out: dict[str, Any] = {}
        for key in batch[0]:
            column = [row[key] for row in batch]
            if self._pads(key, column):
                stacked, lengths = pad_arrays(column, self.pad_value)
                out[key] = torch.from_numpy(stacked)
                if self.lengths:
                    out[key + self.suffix] = torch.from_numpy(lengths)
            else:
                out[key] = default_collate(column)
        return out

    def _pads(self, key: str, column: list[Any]) -> bool:
        if self.keys is not None and key not in self.keys:
            return False
        return all(isinstance(v, np.ndarray) and v.ndim >= 1 for v in column)
