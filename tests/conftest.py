"""Session-wide object-store servers on 127.0.0.1, shared by every test directory under
tests/ (and ``tiny_disk``, a real 1 MiB tmpfs for full-disk tests). SeaweedFS,
fake-gcs-server and Azurite, which the plugins' tests use too, are in the repository's
rootdir conftest.py.

Each starts on first use (so a run that needs none starts none) and is stopped, with its
data directory deleted, at the end of the session. SeaweedFS and moto get bucket ``ckpt``;
tests use unique prefixes (fake-gcs-server and Azurite: tests create their own buckets).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # aiohttp warns about each body over 1 MiB that S3Store sends in one write, on purpose
    # (see ckptstore.stores.s3.body.as_body); Python hides ResourceWarning by default.
    config.addinivalue_line(
        "filterwarnings", "ignore:Sending a large body directly:ResourceWarning"
    )


BUCKET = "ckpt"


@pytest.fixture
def proxy(seaweedfs: Any) -> Iterator[Any]:
    """A ``harness.proxy.FaultProxy`` in front of the session's SeaweedFS, for one test."""
    from harness.proxy import FaultProxy

    with FaultProxy(seaweedfs.port) as p:
        yield p


@pytest.fixture(scope="session")
def moto() -> Iterator[Any]:
    """One moto S3 server for the session, with bucket ``ckpt``."""
    from harness.motoserver import MotoServer

    server = MotoServer().start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MiB tmpfs, a disk that fills (needs root; skipped where mount is not allowed)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
