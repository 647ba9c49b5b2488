"""Fixtures of the multi-node scenarios: the token data set and the uninterrupted
two-node reference run, made once for every test file here."""

from __future__ import annotations

import pytest

from tests.multinode.scenario import SAMPLES, job


@pytest.fixture(scope="package")
def data(tmp_path_factory) -> str:
    from examples.resilience.tokens import write_dataset

    out = str(tmp_path_factory.mktemp("tokens"))
    write_dataset(out, samples=SAMPLES, shards=4)
    return out


@pytest.fixture(scope="package")
def reference(data, tmp_path_factory) -> str:
    """Two nodes, uninterrupted."""
    d = str(tmp_path_factory.mktemp("reference"))
    with job(d, data, max_restarts=0) as nj:
        nj.start()
        nj.wait()
    return d
