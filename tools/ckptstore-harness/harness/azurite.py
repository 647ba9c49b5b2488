"""Azurite, Microsoft's Azure Blob emulator (npm package ``azurite``; ``tools/setup.sh``).

    with Azurite() as server:
        server.create_bucket("ckpt")             # a container
        store = server.store("ckpt/run1")         # an AzureStore rooted at az://ckpt/run1

Uses the well-known development account ``devstoreaccount1``. Ready in ~1-2 s. Measured
here: Put Blob with If-None-Match:* gives 409 BlobAlreadyExists to the second writer;
``get_block_list("uncommitted")`` shows staged blocks before the commit; a wrong account
key gets 403 AuthorizationFailure; container names need 3-63 characters.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from harness import checkout_root
from harness.servers import ServerProcess

__all__ = ["Azurite", "azurite_binary", "ACCOUNT", "ACCOUNT_KEY"]

ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def azurite_binary() -> str | None:
    """``$AZURITE_BLOB``, else ``<repo>/tools/node_modules/.bin/azurite-blob``, else PATH."""
    env = os.environ.get("AZURITE_BLOB")
    if env and os.path.exists(env):
        return env
    local = Path(checkout_root()) / "tools/node_modules/.bin/azurite-blob"
    if local.exists():
        return str(local)
    return shutil.which("azurite-blob")


class Azurite(ServerProcess):
    """An azurite-blob process; ``store()`` gives AzureStores on it."""

    name = "azurite"
    ready_timeout = 60.0

    def __init__(self, account_key: str = ACCOUNT_KEY) -> None:
        super().__init__()
        self.account_key = account_key

    def command(self) -> list[str]:
        binary = azurite_binary()
        if binary is None:
            raise RuntimeError("azurite-blob not found; run tools/setup.sh (needs npm)")
        return [
            binary,
            "--blobHost", "127.0.0.1",
            "--blobPort", str(self.port),
            "--location", os.path.join(self.dir, "data"),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ]  # fmt: skip

    def connection_string(self, account_key: str | None = None) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};"
            f"AccountKey={account_key or self.account_key};"
            f"BlobEndpoint={self.endpoint}/{ACCOUNT};"
        )

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string()}

    def service_client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string(), retry_total=0)

    def create_bucket(self, name: str) -> None:
        """Create container ``name``."""
        with self.service_client() as client:
            client.create_container(name)

    def store(self, container_prefix: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        """An ``AzureStore`` for ``az://<container_prefix>`` (kwargs: ``retry``)."""
        from ckptstore.stores.azure import AzureStore

        return AzureStore(f"az://{container_prefix}", self.storage_options, **kwargs)
