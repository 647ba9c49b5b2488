"""A fault-injecting store wrapper: fail, delay or corrupt the Nth call of a method.

    store = FaultyStore(LocalStore(path), [
        Fault("put_part", calls={2, 3}, error=TransientStoreError("injected 503")),
        Fault("complete_multipart", error=DurabilityError("injected EIO")),   # every call
        Fault("put_part", calls={1}, corrupt=True),   # flip a bit after the checksum
        Fault("get", delay=30.0),                     # a stalled connection
    ])

Calls are counted per method from 1, across threads. ``store.calls`` records them.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ckptstore.engine.store import Buffer, Entry, Multipart, Part, Store

__all__ = ["Fault", "FaultyStore"]


@dataclass(frozen=True)
class Fault:
    """What to do to calls of ``method``: the calls numbered in ``calls`` (None: all)."""

    method: str
    calls: frozenset[int] | set[int] | None = None
    error: BaseException | None = None
    delay: float = 0.0
    corrupt: bool = False

    def applies(self, n: int) -> bool:
        return self.calls is None or n in self.calls


class FaultyStore(Store):
    """Wraps ``inner`` and applies ``faults``; everything else passes through."""

    def __init__(self, inner: Store, faults: Sequence[Fault] = ()) -> None:
        super().__init__(inner.url, inner.storage_options, retry=inner.retry)
        self.inner = inner
        self.faults = list(faults)
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.capabilities = inner.capabilities

    def describe(self, path: str = "") -> str:
        return self.inner.describe(path)

    def _before(self, method: str, data: Buffer | None = None) -> Buffer | None:
        with self._lock:
            self.calls[method] += 1
            n = self.calls[method]
        for f in self.faults:
            if f.method != method or not f.applies(n):
                continue
            if f.delay:
                time.sleep(f.delay)
            if f.error is not None:
                raise f.error
            if f.corrupt and data is not None and len(data):
                flipped = bytearray(data)
                flipped[len(flipped) // 2] ^= 0x01
                data = flipped
        return data

    def child(self, prefix: str) -> FaultyStore:
        return FaultyStore(self.inner.child(prefix), self.faults)

    def put(self, path: str, data: Buffer) -> None:
        self.inner.put(path, self._before("put", data))  # type: ignore[arg-type]

    def put_if_absent(self, path: str, data: Buffer) -> None:
        self.inner.put_if_absent(path, self._before("put_if_absent", data))  # type: ignore[arg-type]

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        self._before("get")
        return self.inner.get(path, start, end)

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        self._before("get")
        return self.inner.get_into(path, start, buf)

    def size(self, path: str) -> int:
        self._before("size")
        return self.inner.size(path)

    def find(self, prefix: str = "") -> list[str]:
        self._before("find")
        return self.inner.find(prefix)

    def listdir(self, prefix: str = "") -> list[str]:
        self._before("listdir")
        return self.inner.listdir(prefix)

    def scan(self, prefix: str = "") -> list[Entry]:
        self._before("listdir")
        return self.inner.scan(prefix)

    def copy(self, src: str, dst: str) -> None:
        self._before("copy")
        self.inner.copy(src, dst)

    def delete(self, path: str) -> None:
        self._before("delete")
        self.inner.delete(path)

    def remove_empty_dirs(self, prefix: str = "") -> None:
        self.inner.remove_empty_dirs(prefix)

    def begin_multipart(self, path: str) -> Multipart:
        self._before("begin_multipart")
        return self.inner.begin_multipart(path)

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        data = self._before("put_part", data)  # type: ignore[assignment]
        return self.inner.put_part(upload, number, offset, data)

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        self._before("complete_multipart")
        self.inner.complete_multipart(upload, parts)

    def abort_multipart(self, upload: Multipart) -> None:
        self._before("abort_multipart")
        self.inner.abort_multipart(upload)

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        self._before("list_multipart")
        return self.inner.list_multipart(prefix)

    def close(self) -> None:
        self.inner.close()
