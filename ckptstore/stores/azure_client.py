"""The Azure store's client: a sync ``BlobServiceClient`` from adlfs-style options, and URLs.

``storage_options`` are adlfs's (see ``ckptstore.stores.azure``); the ``AZURE_STORAGE_*``
environment variables fill in what is not given. The SDK's retries are off
(``retry_total=0``) and ``RetryConfig.request_timeout_s`` bounds each connect and read.
"""

from __future__ import annotations

import os
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.errors import ConfigError, missing_dependency
from ckptstore.stores._cloud import Reachability
from ckptstore.stores.storage_options import FSSPEC_OPTIONS, class_parameters

try:
    import requests
    from azure.storage.blob import BlobServiceClient
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise missing_dependency("azure.storage.blob", "azure") from _exc

__all__ = ["SCHEMES", "AzureClient", "known_options", "parse_url"]

SCHEMES = ("az", "abfs", "abfss")
_MiB = 1024 * 1024


def _option(options: dict[str, Any], key: str) -> Any:
    value = options.pop(key, None)
    return value if value is not None else os.environ.get(f"AZURE_STORAGE_{key.upper()}")


#: The options ``_service_client`` reads; adlfs's own are accepted (and not used) too.
_OPTIONS = frozenset(
    {
        "connection_string", "account_name", "account_key", "sas_token", "credential",
        "account_host", "account_url", "client_id", "tenant_id", "client_secret", "anon",
        "connection_timeout", "read_timeout",
    }
)  # fmt: skip


def known_options() -> frozenset[str]:
    """The option names an Azure store accepts: its own, fsspec's, and adlfs's."""
    try:
        from adlfs import AzureBlobFileSystem
    except ImportError:
        return _OPTIONS | FSSPEC_OPTIONS
    return _OPTIONS | FSSPEC_OPTIONS | class_parameters(AzureBlobFileSystem)


def _service_client(options: dict[str, Any], retry: RetryConfig) -> BlobServiceClient:
    """A sync ``BlobServiceClient`` from adlfs-style ``storage_options``."""
    options = dict(options)
    timeout = retry.request_timeout_s
    session = requests.Session()  # a pool big enough for the engine's threads
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=64)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    kwargs: dict[str, Any] = {
        "retry_total": 0,
        "connection_timeout": options.pop("connection_timeout", None) or timeout,
        "read_timeout": options.pop("read_timeout", None) or timeout,
        "max_single_get_size": 256 * _MiB,  # one ranged GET per engine read
        "max_chunk_get_size": 256 * _MiB,
        "max_single_put_size": 256 * _MiB,  # one Put Blob per whole-object write
        "session": session,
    }
    connection_string = _option(options, "connection_string")
    if connection_string:
        return BlobServiceClient.from_connection_string(connection_string, **kwargs)
    account = _option(options, "account_name")
    if not account:
        raise ConfigError(
            "Azure storage_options need 'connection_string' or 'account_name' (plus "
            "account_key, sas_token or credential); none was given and AZURE_STORAGE_* are unset"
        )
    host = options.pop("account_host", None) or f"{account}.blob.core.windows.net"
    url = options.pop("account_url", None) or f"https://{host}"
    credential = options.pop("credential", None)
    key, sas = _option(options, "account_key"), _option(options, "sas_token")
    client_id = _option(options, "client_id")
    anon = options.pop("anon", None)
    if credential is None and key:
        credential = {"account_name": account, "account_key": key}
    elif credential is None and sas:
        credential = sas.lstrip("?")
    elif credential is None and client_id:
        from azure.identity import ClientSecretCredential

        credential = ClientSecretCredential(
            _option(options, "tenant_id"), client_id, _option(options, "client_secret")
        )
    elif credential is None and not anon:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError as exc:
            raise missing_dependency("azure.identity", "azure") from exc
        credential = DefaultAzureCredential()
    return BlobServiceClient(url, credential=credential, **kwargs)


def parse_url(url: str) -> tuple[str, str, str | None]:
    """``(container, root, account or None)`` of an ``az://`` / ``abfs[s]://`` URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES or not rest.strip("/"):
        raise ConfigError(f"expected an az://container/path URL, got {url!r}")
    container, _, root = rest.strip("/").partition("/")
    account = None
    if "@" in container:  # abfs://container@account.dfs.core.windows.net/path
        container, host = container.split("@", 1)
        account = host.split(".", 1)[0]
    if ":" in container:  # az://user:password@host: not how Azure takes credentials
        raise ConfigError(
            f"{url}: a password in an Azure URL is not used; give the container (and "
            "@account) alone and the credentials in storage_options (account_key, sas_token)"
        )
    return container, root.strip("/"), account


class AzureClient:
    """A service client plus the state every store on it shares."""

    def __init__(self, options: dict[str, Any], retry: RetryConfig, account: str | None):
        options = dict(options)
        if account and not options.get("connection_string"):
            options.setdefault("account_name", account)
        self.service = _service_client(options, retry)
        self.reach = Reachability(self.service.url)
