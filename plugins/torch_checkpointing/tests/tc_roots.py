"""Fresh roots for the torch_checkpointing plugin's tests (``conftest.tc_root``): one per
store the test suite starts, as ``(url, storage_options, store)`` where ``store`` is a
ckptstore store on the same root, the ground truth the tests check."""

import uuid
from typing import Any

import pytest

import ckptstore
from tests.conftest import BUCKET

KINDS = ["volume", "memory", "s3", "gcs", "azure"]
SERVER = {"s3": "seaweedfs", "gcs": "fake_gcs_server", "azure": "azurite_server"}


def make_root(request: pytest.FixtureRequest, kind: str, tmp_path: Any) -> tuple[str, dict, Any]:
    name = f"tc-{uuid.uuid4().hex[:10]}"
    if kind == "volume":
        url, options = str(tmp_path / "root"), {}
        (tmp_path / "root").mkdir()
    elif kind == "memory":
        url, options = f"memory://{name}", {}
    else:
        server = request.getfixturevalue(SERVER[kind])
        options = dict(server.storage_options)
        if kind == "s3":
            url = f"s3://{BUCKET}/{name}"
        else:
            server.create_bucket(name)
            url = f"{'gs' if kind == 'gcs' else 'az'}://{name}/root"
    return url, options, ckptstore.open_store(url, options)


def kinds() -> list[Any]:
    return [pytest.param(k, marks=[pytest.mark.server] if k in SERVER else []) for k in KINDS]
