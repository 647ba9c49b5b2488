"""moto's S3 server in a subprocess: for S3 API quirks and errors SeaweedFS does not show.

    with MotoServer() as moto:
        moto.create_bucket("ckpt")
        store = moto.store("ckpt/run1")
        moto.reset()                       # forget every bucket and object

Measured quirks (moto 5.2): it honours ``If-None-Match: *`` on PutObject; it does not check
Content-MD5 or x-amz-checksum-crc32c (a damaged body is stored); AbortMultipartUpload of
a completed upload answers NoSuchUpload; UploadPart / CompleteMultipartUpload with an
unknown upload id answer 500; ListMultipartUploads reports a fixed, old ``Initiated`` time.
It does not check credentials (any key is accepted).
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from typing import Any

from harness.seaweedfs import create_bucket
from harness.servers import ServerProcess, wait_for_port

__all__ = ["MotoServer"]


class MotoServer(ServerProcess):
    """``moto.server`` on 127.0.0.1:``self.port`` (its own process: no GIL shared with tests)."""

    name = "moto"
    ready_timeout = 60.0

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def env(self) -> dict[str, str]:
        env = super().env()
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        return env

    def wait_ready(self) -> None:
        wait_for_port(self.port, self.ready_timeout, self.proc)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                return
            except urllib.error.HTTPError:
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"moto did not answer within {self.ready_timeout} s")

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": "testing", "secret": "testing", "endpoint_url": self.endpoint}

    def store(self, bucket_prefix: str, **kwargs: Any) -> Any:
        from ckptstore.stores.s3 import S3Store

        options = dict(self.storage_options, **kwargs.pop("storage_options", {}))
        return S3Store(f"s3://{bucket_prefix}", options, **kwargs)

    def create_bucket(self, name: str) -> None:
        create_bucket(self.storage_options, name)

    def reset(self) -> None:
        """Forget all state (POST /moto-api/reset)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()
