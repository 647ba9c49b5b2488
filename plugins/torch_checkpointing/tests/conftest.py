"""Fixtures of the torch_checkpointing plugin's tests: ``tc_root``, a fresh root on each
store the test suite starts (a volume, an fsspec memory file system, S3 on the session's
SeaweedFS, GCS on fake-gcs-server, Azure on Azurite: the rootdir conftest's servers); see
``tc_roots``."""

from typing import Any

import pytest
from tc_roots import kinds, make_root

from tests.plugins.fixtures import offline, root_url  # noqa: F401 - fixtures, found by name


@pytest.fixture(params=kinds())
def tc_root(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict, Any]:
    return make_root(request, request.param, tmp_path)
