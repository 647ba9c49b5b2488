"""Fixtures the plugins' tests share: each plugins/*/tests/conftest.py imports them.

``root_url`` is where checkpoints are committed. It is parametrised over stores so the
same tests run against every one: a volume, and S3 on the session's SeaweedFS (the rootdir
conftest.py's ``seaweedfs``). The S3 endpoint and credentials reach every client (these
tests and the job subprocesses they start) through botocore's standard environment
variables, as a user's job would get them.
"""

import os
import uuid

import pytest

from tests.conftest import BUCKET

__all__ = ["root_url", "offline"]

# Never reach the Hub: every model here is built from a config.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.server)])
def root_url(request: pytest.FixtureRequest, tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        return str(tmp_path / "committed")
    server = request.getfixturevalue("seaweedfs")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    return f"s3://{BUCKET}/plugins-{uuid.uuid4().hex[:8]}"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
