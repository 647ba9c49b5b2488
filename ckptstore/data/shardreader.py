"""Read samples from a verified local copy of a shard: a reader per open shard, decoding
one group (a Parquet row group, an Arrow record batch, a whole raw file) at a time into a
byte-bounded LRU that a process's readers share.

    reader = open_reader(fmt, fd, shard_path, rows, columns, groups, key)
    samples = reader.take([3, 0, 7])                # rows of the shard, in the order asked
    reader.close()

A reader reads the file open at ``fd`` (the cache's descriptor of the copy it verified,
``Handle.fd``), never a path: it maps it or reads a duplicate of it, so the caller may close
``fd`` once the reader is open.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ckptstore.data.columns import DecodedGroup
from ckptstore.data.formats import FORMATS, pyarrow_module
from ckptstore.errors import ShardFormatError

__all__ = ["GroupCache", "ShardReader", "open_reader"]


class GroupCache:
    """A byte-bounded LRU of decoded groups (:class:`DecodedGroup`), shared by a process's
    readers."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, int], tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int], load: Callable[[], Any]) -> Any:
        """The group cached under ``key``, else ``load()``'s, cached (evicting the oldest).

        What ``load()`` returns has an ``nbytes``: what the byte budget counts.
        """
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]
        table = load()
        nbytes = int(table.nbytes)
        with self._lock:
            if key not in self._items:
                self._items[key] = (table, nbytes)
                self._bytes += nbytes
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, (_, n) = self._items.popitem(last=False)
                self._bytes -= n
        return table


class ShardReader:
    """Samples of one local shard file. ``take`` decodes each needed group once (cached)."""

    def __init__(
        self,
        key: str,
        rows: Sequence[int],
        groups: GroupCache,
        load: Callable[[int], Any],
        name: str = "",
    ) -> None:
        self.key = key
        self.name = name or key
        self.offsets = np.cumsum((0, *rows), dtype=np.int64)
        self._groups = groups
        self._load = load

    def take(self, indices: Sequence[int]) -> list[Any]:
        """Rows ``indices`` of the shard as dicts ``{column: value}``, in the order given.

        Array columns arrive as NumPy arrays (:func:`ckptstore.data.columns.to_rows`).
        """
        idx = np.asarray(indices, dtype=np.int64)
        group = np.searchsorted(self.offsets, idx, side="right") - 1
        out: list[Any] = [None] * len(idx)
        for g in sorted(set(group.tolist())):  # np.unique imports numpy.ma (0.1 s a worker)
            where = np.flatnonzero(group == g)
            decoded = self._groups.get((self.key, g), functools.partial(self._decode, g))
            for pos, row in zip(where.tolist(), decoded.rows(idx[where] - self.offsets[g])):
                out[pos] = row
        return out

    def _decode(self, g: int) -> DecodedGroup:
        """Group ``g`` decoded, holding exactly the rows the listing counted: a damaged
        file (truncated pages, a footer that lies) is a ``ShardFormatError`` naming it."""
        want = int(self.offsets[g + 1] - self.offsets[g])
        with _unreadable(f"{self.name}: group {g}"):
            table = self._load(g)
            got = int(table.num_rows)
        if got != want:
            raise ShardFormatError(
                f"{self.name}: group {g} holds {got} rows where its footer says {want}; the "
                "file is damaged. Rewrite or remove it, and list the dataset again"
            )
        return DecodedGroup(table)

    def close(self) -> None:
        """Drop references to the file (mapped memory is released when unreferenced)."""
        self._load = _closed


@contextlib.contextmanager
def _unreadable(what: str) -> Iterator[None]:
    """Turn what pyarrow raises for a damaged file (``OSError``, ``ArrowInvalid``, an
    ``IndexError`` of a short column...) into a ``ShardFormatError`` naming ``what``."""
    pa = pyarrow_module()
    try:
        yield
    except ShardFormatError:
        raise
    except (OSError, ValueError, IndexError, KeyError, TypeError, pa.ArrowException) as exc:
        raise ShardFormatError(
            f"{what} is unreadable ({type(exc).__name__}: {exc}); the file is damaged. "
            "Rewrite or remove it, and list the dataset again"
        ) from exc


def _closed(_group: int) -> Any:
    raise ShardFormatError("read from a closed shard reader")


class _RawReader(ShardReader):
    """A raw file is one sample: ``{"path": <path in the dataset>, "data": bytes}``."""

    def __init__(self, fd: int, shard_path: str) -> None:
        self.shard_path = shard_path
        self._file: Any = os.fdopen(os.dup(fd), "rb")  # held until close()

    def take(self, indices: Sequence[int]) -> list[Any]:
        self._file.seek(0)
        data = self._file.read()
        return [{"path": self.shard_path, "data": data} for _ in indices]

    def close(self) -> None:
        self._file.close()


def _mapped(fd: int) -> Any:
    """The whole file open at ``fd``, memory-mapped read-only, as a pyarrow input stream
    (the map is released when nothing references it any more)."""
    pa = pyarrow_module()
    return pa.BufferReader(pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ)))


def open_reader(
    fmt: str,
    fd: int,
    shard_path: str,
    rows: Sequence[int],
    columns: Sequence[str] | None,
    groups: GroupCache,
    key: str,
) -> ShardReader:
    """A reader over the verified local copy open at ``fd`` (memory-mapped; nothing is read
    until ``take``)."""
    if fmt == "raw":
        return _RawReader(fd, shard_path)
    cols = list(columns) if columns is not None else None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with _unreadable(shard_path):
            pf = pq.ParquetFile(_mapped(fd))
        return ShardReader(
            key, rows, groups, lambda g: pf.read_row_group(g, columns=cols), shard_path
        )
    if fmt == "arrow":
        import pyarrow.ipc as ipc

        with _unreadable(shard_path):
            reader = ipc.open_file(_mapped(fd))

        def load(g: int) -> Any:
            batch = reader.get_batch(g)
            return batch.select(cols) if cols is not None else batch

        return ShardReader(key, rows, groups, load, shard_path)
    raise ShardFormatError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
