"""The GCS store's client: one gcsfs session per store family, requests and CRC helpers.

Requests go through ``gcsfs.core.GCSFileSystem``'s aiohttp session and credentials, but
not through gcsfs's own retry loop; each is bounded by ``RetryConfig.request_timeout_s``.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Sequence
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.checksum import crc32c_combine
from ckptstore.engine.store import Part
from ckptstore.errors import TransientStoreError, missing_dependency
from ckptstore.stores._cloud import Reachability, parallel

try:
    import aiohttp
    from fsspec.asyn import sync
    from gcsfs.core import GCSFileSystem
    from google.auth.exceptions import RefreshError
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise missing_dependency("gcsfs", "gcs") from _exc

__all__ = ["GCSClient", "b64crc", "crc_of", "combined_crc", "parallel"]


def b64crc(value: int) -> str:
    """A CRC32C as GCS spells it: big-endian, base64."""
    return base64.b64encode(struct.pack(">I", value)).decode()


class GCSClient:
    """One gcsfs file system plus the state every store on it shares."""

    def __init__(self, options: dict[str, Any], retry: RetryConfig) -> None:
        options = dict(options)
        timeout = options.pop("requests_timeout", None) or retry.request_timeout_s
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.timeout_s = float(timeout)
        self.fs = GCSFileSystem(**options)
        self.reach = Reachability(self.fs._location)
        self.buckets_seen: set[str] = set()

    async def _send(self, method: str, url: str, params: dict, headers: dict | None, body: Any):
        fs = self.fs
        await fs._set_session()
        if isinstance(body, dict):
            kw: dict[str, Any] = {"json": body}
        else:
            kw = {"data": body}
        async with fs.session.request(
            method,
            url,
            params=fs._get_params(params),
            headers=fs._get_headers(headers),
            timeout=self.timeout,
            **kw,
        ) as r:
            return r.status, await r.read()

    def request(
        self,
        method: str,
        url: str,
        what: str,
        *,
        params: dict | None = None,
        headers: dict | None = None,
        body: Any = None,
    ) -> tuple[int, bytes]:
        """Send one request; connection failures and timeouts become ckptstore errors."""
        if not url.startswith("http"):
            url = self.fs.base + url
        try:
            out = sync(
                self.fs.loop,
                self._send,
                method,
                url,
                params or {},
                headers,
                body,
                timeout=self.timeout_s + 5,
            )
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise TransientStoreError(
                f"{what}: no answer within {self.timeout_s:g} s (RetryConfig.request_timeout_s)"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise self.reach.connection_error(exc, what) from exc
        except RefreshError as exc:  # google.auth could not refresh the token (yet)
            raise TransientStoreError(f"{what}: credential refresh failed ({exc})") from exc
        self.reach.reached = True
        return out


def crc_of(meta: dict) -> int | None:
    """The CRC32C in GCS object metadata (base64 of 4 big-endian bytes), if any."""
    value = meta.get("crc32c")
    return int.from_bytes(base64.b64decode(value), "big") if value else None


def combined_crc(parts: Sequence[Part]) -> int | None:
    """CRC32C of the parts' concatenation, from the CRCs GCS reported for each part."""
    if not parts or not all(p.etag for p in parts):
        return None
    value = int(parts[0].etag, 16)
    for p in parts[1:]:
        value = crc32c_combine(value, int(p.etag, 16), p.size)
    return value
