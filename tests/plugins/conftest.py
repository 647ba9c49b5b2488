"""Fixtures for the plugin tests.

``root_url`` is where checkpoints are committed. It is parametrised over stores so the
same tests run against every one; the S3 store (SeaweedFS) is added by its own branch.
"""

import os

import pytest

# Never reach the Hub: every model here is built from a config.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(params=["local"])
def root_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "committed")
    raise NotImplementedError(request.param)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
