"""Fixtures for ``ckptstore-tool`` tests.

Every test reaches storage through ``backend`` (a URL prefix plus storage options), so the
same tests run on any store: ``backend`` is parametrized (``volume`` here; an object store is
one more ``Backend`` in ``_BACKENDS`` whose ``options`` carry its endpoint). ``root_url`` is a
fresh run root on it. Tests touch stored bytes only through the ``Store`` contract.

``cli(...)`` runs the tool in-process (fast); ``script(...)`` runs the real console script
(``python -m ckptstore.cli`` with this checkout on PYTHONPATH) in a subprocess. Both append
the backend's ``-o`` storage options.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore.engine.fence import fence_attempt
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME
from ckptstore.engine.store import Store
from ckptstore.stores import open_store

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _flat_options(options: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in options.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _flat_options(v, key + ".")
        else:
            out += ["-o", f"{key}={json.dumps(v) if not isinstance(v, str) else v}"]
    return out


@dataclass
class Backend:
    """Where a test's checkpoints live: ``base`` URL prefix plus its storage options."""

    name: str
    base: str
    options: dict[str, Any] = field(default_factory=dict)
    missing: str = ""  # a URL that does not exist (for an object store: a missing bucket)

    def url(self, *parts: str) -> str:
        return "/".join([self.base.rstrip("/"), *parts])

    def store(self, *parts: str) -> Store:
        return open_store(self.url(*parts), self.options or None)

    def open(self, url: str) -> Store:
        """The store rooted at ``url`` (a URL under ``base``)."""
        return open_store(url, self.options or None)

    @property
    def opts(self) -> list[str]:
        """The ``-o key=value`` arguments for this backend."""
        return _flat_options(self.options)


def _volume(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    return Backend("volume", str(tmp_path / "store"), {}, str(tmp_path / "no" / "such" / "dir"))


def _s3(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    from tests.conftest import BUCKET

    server = request.getfixturevalue("seaweedfs")
    base = f"s3://{BUCKET}/cli-{uuid.uuid4().hex[:8]}"
    return Backend("s3", base, dict(server.storage_options), "s3://no-such-bucket-x/run")


#: name -> (factory, marks). Every CLI test runs on each backend.
_BACKENDS: dict[str, tuple[Callable[[Any, Any], Backend], tuple[Any, ...]]] = {
    "volume": (_volume, ()),
    "s3": (_s3, (pytest.mark.server,)),
}


@pytest.fixture(
    params=[pytest.param(name, marks=marks) for name, (_, marks) in sorted(_BACKENDS.items())]
)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    factory, _ = _BACKENDS[request.param]
    return factory(request, tmp_path)


@pytest.fixture
def root_url(backend: Backend) -> str:
    return backend.url(f"run-{uuid.uuid4().hex[:8]}")


def sample_state(seed: int = 0, step: int = 7) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.arange(10)},
        "step": step,
        "meta": {"name": "run"},
    }


def save_ckpt(backend: Backend, url: str, state: dict[str, Any] | None = None, **kw: Any) -> str:
    """Save ``state`` as a committed ckptstore checkpoint at ``url``; returns ``url``."""
    files_per_rank = kw.pop("files_per_rank", None)
    w = ckptstore.writer(url, storage_options=backend.options or None, **kw)
    if files_per_rank:
        w.files_per_rank = files_per_rank
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ckptstore.save(state if state is not None else sample_state(), w)
    return url


def step(root: str, n: int) -> str:
    return f"{root}/step_{n:09d}"


def tear(backend: Backend, url: str) -> None:
    """Make ``url`` look like a save that died before its marker (and its fence)."""
    store = backend.open(url)
    fences = [n for n in store.find() if fence_attempt(n) is not None]
    for name in (MARKER_NAME, MANIFEST_NAME, ".metadata", *fences):
        store.delete(name)


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def _in_process(capsys: pytest.CaptureFixture[str], extra: list[str]) -> Callable[..., Result]:
    from ckptstore.cli.main import main

    def run(*args: str) -> Result:
        capsys.readouterr()
        rc = main([*args, *extra])
        cap = capsys.readouterr()
        return Result(rc, cap.out, cap.err)

    return run


@pytest.fixture
def cli(backend: Backend, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run ``ckptstore-tool ARGS`` in this process, plus the backend's -o options."""
    return _in_process(capsys, backend.opts)


@pytest.fixture
def tool(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run ``ckptstore-tool ARGS`` in this process, no storage (``goodput``)."""
    return _in_process(capsys, [])


def script_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_script(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """``python -m ckptstore.cli ARGV`` with this checkout first on PYTHONPATH."""
    proc = subprocess.run(
        [sys.executable, "-m", "ckptstore.cli", *argv],
        env=env or script_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def script(backend: Backend) -> Callable[..., Result]:
    """Run the real console script in a subprocess (plus the backend's -o options)."""

    def run(*args: str, **kw: Any) -> Result:
        return run_script(*args, *backend.opts, **kw)

    return run
