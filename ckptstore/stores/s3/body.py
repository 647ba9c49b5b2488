"""S3 request bodies, and the ETag S3 gives a multipart object.

``as_body`` hands botocore one buffer without a copy; ``buffers_body`` makes one request
body of several buffers, sent as they are (no join), and ``no_expect_for_buffers`` keeps
botocore from holding such a body back behind ``Expect: 100-continue``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import weakref
from collections.abc import Sequence
from typing import Any

from ckptstore.engine.store import Buffer, Part

__all__ = [
    "FIRST_WRITE",
    "as_body",
    "b64",
    "multipart_etag",
    "buffers_body",
    "buffers_body_type",
    "no_expect_for_buffers",
]


def as_body(data: Buffer) -> bytearray:
    """``data`` as the ``bytearray`` botocore should send, copied only when it must be.

    A bytearray goes from botocore to aiohttp untouched and is written to the socket in one
    call. ``bytes`` would not: botocore wraps them in a ``BytesIO``, which aiohttp copies
    out again in 64 KiB reads, and a memoryview is refused. The engine's parts are views of
    whole pooled bytearrays, so only a short last part (or a small object) is copied here.

    aiohttp issues a ``ResourceWarning`` ("Sending a large body directly ...") for every
    body over 1 MiB: that one-call write is the point here. Python ignores ResourceWarning
    by default, so users do not see it; ckptstore does not filter it itself, because the
    warning is raised on fsspec's event-loop thread while other threads run, where
    ``warnings.catch_warnings()`` (process-wide state) cannot scope a filter safely. The
    test suite, which shows every warning, ignores it in ``tests/conftest.py``.
    """
    if isinstance(data, bytearray):
        return data
    if isinstance(data, memoryview):
        owner = data.obj
        if isinstance(owner, bytearray) and data.c_contiguous and data.nbytes == len(owner):
            return owner
    return bytearray(data)


def buffers_body(buffers: Sequence[Buffer]) -> Any:
    """One request body of ``buffers``, sent one after another as they are (no join).

    An aiohttp ``Payload`` (aiohttp sends it by writing each buffer to the transport, no
    slice or join of a whole buffer; Python 3.11's transport still copies what the socket
    does not take at once into its own buffer, 3.12 keeps a reference) that is
    also the file-like object botocore accepts for a body (``read``/``seek``/``tell``, used
    only when the payload is signed, ``checksum="none"``); ``len()`` is its size. botocore
    adds ``Expect: 100-continue`` to any file-like body, which would cost a round trip
    before every part: ``S3Client`` removes it for these bodies (a bytearray body never
    had it).
    """
    return buffers_body_type()(buffers)


#: Bytes of a ``buffers_body`` written first, with the request head (see its ``write``).
FIRST_WRITE = 64 * 1024

#: Clients whose events already drop ``Expect`` for such bodies.
_NO_EXPECT: weakref.WeakSet[Any] = weakref.WeakSet()


def no_expect_for_buffers(client: Any) -> None:
    """Register, once per client, a handler that drops botocore's ``Expect: 100-continue``
    header from requests whose body is a ``buffers_body`` (runs on the event loop)."""
    if client in _NO_EXPECT:
        return
    body_type = buffers_body_type()

    def drop_expect(params: dict[str, Any], **_: Any) -> None:
        if isinstance(params.get("body"), body_type):
            params.get("headers", {}).pop("Expect", None)

    # botocore's own handler is on "before-call.s3", and more specific events run first.
    client.meta.events.register_last("before-call.s3", drop_expect)
    _NO_EXPECT.add(client)


@functools.cache
def buffers_body_type() -> type:
    """The class ``buffers_body`` makes (an aiohttp ``Payload``; built once, on first use)."""
    from aiohttp.payload import Payload

    class BuffersBody(Payload):
        """See ``buffers_body``."""

        _autoclose = True

        def __init__(self, buffers: Sequence[Buffer]) -> None:
            views = tuple(memoryview(b).cast("B") for b in buffers)
            super().__init__(views, content_type="application/octet-stream")
            self._size = sum(len(v) for v in views)
            self._pos = 0

        def __len__(self) -> int:
            return self._size or 0

        async def write(self, writer: Any) -> None:
            await self.write_with_length(writer, None)

        async def write_with_length(self, writer: Any, content_length: int | None) -> None:
            left = len(self) if content_length is None else min(content_length, len(self))
            chunks = [v for v in self._value if len(v)]
            if chunks and len(chunks[0]) > FIRST_WRITE:
                # aiohttp sends the request head with the first write, joined into new
                # bytes (below Python 3.12.9): keep that write small.
                chunks[:1] = [chunks[0][:FIRST_WRITE], chunks[0][FIRST_WRITE:]]
            for view in chunks:
                if left <= 0:
                    break
                chunk = view[:left]
                await writer.write(chunk)
                left -= len(chunk)

        def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
            return b"".join(self._value).decode(encoding, errors)

        # -- file-like, for botocore ---------------------------------------------------
        def read(self, n: int | None = -1) -> bytes:
            start = self._pos
            end = len(self) if n is None or n < 0 else min(len(self), start + n)
            out = bytearray()
            offset = 0
            for view in self._value:
                lo, hi = max(start - offset, 0), min(end - offset, len(view))
                if lo < hi:
                    out += view[lo:hi]
                offset += len(view)
            self._pos = max(start, end)
            return bytes(out)

        def seek(self, pos: int, whence: int = 0) -> int:
            base = (0, self._pos, len(self))[whence]
            self._pos = min(max(base + pos, 0), len(self))
            return self._pos

        def tell(self) -> int:
            return self._pos

    return BuffersBody


def b64(raw: bytes) -> str:
    """``raw`` base64-encoded, as S3's checksum headers carry it."""
    return base64.b64encode(raw).decode("ascii")


def multipart_etag(parts: Sequence[Part]) -> str | None:
    """S3's ETag of a completed multipart object, md5(part md5s)-N, when ETags are md5s."""
    digests = []
    for p in sorted(parts, key=lambda p: p.number):
        etag = p.etag.strip('"')
        if len(etag) != 32:
            return None
        try:
            digests.append(bytes.fromhex(etag))
        except ValueError:
            return None
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(parts)}"
