"""pytest's rootdir conftest: the session's SeaweedFS, one server for every test directory.

tests/ and each plugin's plugins/<name>/tests/ talk to it; were it defined in
tests/conftest.py (which plugins/ does not see), each plugin's tests would start one of
their own, and clients cached in the pytest process would meet the wrong server. The other
session servers (moto, fake-gcs-server, Azurite), used by tests/ alone, stay there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import BUCKET


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[Any]:
    """One SeaweedFS for the session, with bucket ``ckpt``; tests use unique prefixes."""
    from harness.seaweedfs import SeaweedFS

    server = SeaweedFS().start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()
