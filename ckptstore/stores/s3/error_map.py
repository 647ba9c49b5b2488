"""Translate botocore / aiohttp failures into ckptstore errors a caller can act on.

=====================================================  =========================
What the S3 client raised                              ckptstore error
=====================================================  =========================
5xx, 429, SlowDown, RequestTimeout, BadDigest,         ``TransientStoreError``
ConditionalRequestConflict, ExpiredToken, connection   (the engine retries it)
refused/reset, connect or read timeout, truncated body
NoSuchBucket                                           ``StoreNotFoundError``
NoSuchKey, NoSuchUpload, 404                           ``StoreNotFoundError``
403, AccessDenied, InvalidAccessKeyId,                 ``StoreAccessError``
SignatureDoesNotMatch, missing credentials
any other 4xx                                          ``StoreAccessError``
=====================================================  =========================

``BadDigest`` means the bytes the server received do not match the checksum we sent:
corruption in transit, so the request is worth repeating.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ckptstore.errors import (
    CkptStoreError,
    StoreAccessError,
    StoreNotFoundError,
    TransientStoreError,
)

__all__ = ["error_code", "translate_s3_error", "TRANSIENT_CODES", "ACCESS_CODES"]

TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "BadDigest",
        "XAmzContentSHA256Mismatch",
        "IncompleteBody",
        "ConditionalRequestConflict",
        "OperationAborted",
        "ExpiredToken",
        "RequestExpired",
    }
)
ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "AllAccessDisabled",
        "AccountProblem",
        "403",
    }
)


def error_code(exc: BaseException) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a botocore ``ClientError``; ("", 0) otherwise."""
    response: Any = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", 0
    code = str(response.get("Error", {}).get("Code", "") or "")
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def translate_s3_error(exc: BaseException, what: str, bucket: str, endpoint: str) -> Exception:
    """The ckptstore error for ``exc`` raised while doing ``what`` (a phrase naming the URL)."""
    if isinstance(exc, CkptStoreError):
        return exc
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        code, status = error_code(exc)
        message = exc.response.get("Error", {}).get("Message", "") or str(exc)
        detail = f"{code or status}: {message}"
        if code in TRANSIENT_CODES or status == 429 or status >= 500:
            return TransientStoreError(f"{what}: {detail} (transient, will be retried)")
        if code == "NoSuchBucket":
            return StoreNotFoundError(
                f"{what}: bucket {bucket!r} does not exist at {endpoint}; create it or fix the URL."
            )
        if code == "NoSuchUpload":
            return StoreNotFoundError(
                f"{what}: the multipart upload no longer exists (it was completed or aborted)"
            )
        if code in ("NoSuchKey", "NotFound", "404") or status == 404:
            return StoreNotFoundError(f"{what}: not found ({detail})")
        if code in ACCESS_CODES or status in (401, 403):
            return StoreAccessError(
                f"{what}: access denied by {endpoint} ({detail}). Check the credentials "
                "(key/secret/token in storage_options, or AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY / AWS_PROFILE), that they may read and write bucket "
                f"{bucket!r}, and that the endpoint URL is the right one."
            )
        return StoreAccessError(f"{what}: the store refused the request ({detail}); not retried")
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return StoreAccessError(
            f"{what}: no usable S3 credentials ({exc}); pass key/secret in storage_options or "
            "set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE."
        )
    if isinstance(exc, bx.EndpointConnectionError):
        return TransientStoreError(
            f"{what}: cannot connect to {endpoint} ({exc}); check endpoint_url in "
            "storage_options and that the server is up and reachable."
        )
    if isinstance(exc, asyncio.TimeoutError):
        return TransientStoreError(f"{what}: no complete response in time (request timeout)")
    if isinstance(exc, (bx.HTTPClientError, bx.ResponseStreamingError, OSError)):
        return TransientStoreError(f"{what}: {type(exc).__name__}: {exc}")
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiobotocore depends on aiohttp
        return exc if isinstance(exc, Exception) else RuntimeError(str(exc))
    if isinstance(exc, aiohttp.ClientError):
        return TransientStoreError(f"{what}: {type(exc).__name__}: {exc}")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))
