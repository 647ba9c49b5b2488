"""The documented exit code, decided by what failed, never by where files are.

``ckptstore-tool`` used to call an exception a store client's when the innermost frame whose
*path* held ``/ckptstore/`` was under ``/ckptstore/stores/``. In a clone named ``ckptstore``
(git's default) with its virtualenv inside, every frame's path holds ``/ckptstore/``, so an
option a client rejected became "internal error ... a bug" (exit 3). These tests put a
client's code, and then the whole checkout with its virtualenv, under a folder named
``ckptstore`` and check the exit codes docs/cli.md gives; then the other exit-3 cases of
issue #32 (a missing optional dependency, a ``.metadata`` claiming a 4 PiB tensor, a
bucket name a client refuses) and the library's side: option names a client would reject
or ignore are a ``ConfigError`` when the store is opened, and ``ckptstore.load`` into a
state dict that does not match raises one ``StateDictMismatchError``.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.errors import ConfigError, CorruptCheckpointError, MissingDependencyError
from ckptstore.stores import open_store
from tests.adversarial.clirun import closed_port, run_cli_text
from tests.cli.conftest import REPO


def _usage_error(rc: int, both: str) -> None:
    assert rc == 2, both
    assert "internal error" not in both and "Traceback" not in both, both


_CLIENT = """
from fsspec.spec import AbstractFileSystem


class StrictFileSystem(AbstractFileSystem):
    protocol = "strictfs"

    def __init__(self, region=None, **kwargs):
        unknown = set(kwargs) - {"skip_instance_cache", "use_listings_cache"}
        if unknown:
            raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}")
        super().__init__(**kwargs)
"""


@pytest.fixture
def client_under_ckptstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store client (an fsspec filesystem) whose file lies under ``.../ckptstore/...``,
    as a site-packages inside a clone named ``ckptstore`` does; registered for strictfs://."""
    import fsspec

    site = tmp_path / "ckptstore" / ".venv" / "site-packages"
    site.mkdir(parents=True)
    (site / "strict_client.py").write_text(textwrap.dedent(_CLIENT))
    monkeypatch.syspath_prepend(str(site))
    fsspec.register_implementation("strictfs", "strict_client.StrictFileSystem", clobber=True)
    return str(site / "strict_client.py")


def test_client_error_from_a_path_named_ckptstore_is_a_usage_error(
    client_under_ckptstore: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An option the client rejects: exit 2 naming the option, wherever the client lives."""
    assert f"{os.sep}ckptstore{os.sep}" in client_under_ckptstore
    rc, both = run_cli_text(capsys, ["ls", "strictfs://bucket/run", "-o", "regoin=eu"])
    _usage_error(rc, both)
    assert "regoin" in both, both


def test_classification_reads_modules_not_paths(client_under_ckptstore: str) -> None:
    """The same client error classified directly: a store client's, by its frames' modules."""
    from ckptstore.cli.exit_codes import EXIT_USAGE, explain

    with pytest.raises(ConfigError) as info:  # the stores layer already says what it is
        open_store("strictfs://bucket/run", {"regoin": "eu"})
    cause = info.value.__cause__
    assert isinstance(cause, TypeError)
    assert explain(cause, ["strictfs://bucket/run"], ["regoin=eu"])[0] == EXIT_USAGE


def _checkout_named_ckptstore(tmp_path: Path) -> Path:
    """This checkout as ``<tmp>/ckptstore`` with its virtualenv inside (links), as a fresh
    ``git clone`` + ``python -m venv .venv`` lays it out."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs the tests to run from a virtualenv, to place one inside")
    clone = tmp_path / "ckptstore"
    clone.mkdir()
    for name in ("ckptstore", "tools", "tests"):
        (clone / name).symlink_to(Path(REPO) / name)
    (clone / ".venv").symlink_to(sys.prefix)
    return clone


def _run_in(clone: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    python = clone / ".venv" / "bin" / Path(sys.executable).name
    env = dict(os.environ, PYTHONPATH=str(clone))
    env.pop("CKPTSTORE_TOOL_TRACEBACK", None)
    proc = subprocess.run(
        [str(python), "-m", "ckptstore.cli", *argv],
        env=env,
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return proc


@pytest.mark.processes
def test_console_script_from_a_checkout_named_ckptstore(tmp_path: Path) -> None:
    """The real console script from a clone named ``ckptstore``: s3fs / botocore live in
    ``ckptstore/.venv/...``; an option they reject, a value of the wrong type, a bucket name
    botocore refuses are exit 2, never "internal error"."""
    clone = _checkout_named_ckptstore(tmp_path)
    port = closed_port()
    s3 = ["-o", f"endpoint_url=http://127.0.0.1:{port}", "-o", "key=k", "-o", "secret=s"]
    probe = _run_in(clone, "ls", "s3://bucket/run", *s3)
    assert probe.returncode == 2, probe.stderr  # the clone runs
    for argv in (
        ["ls", "s3://bucket/run", *s3, "-o", "no_such_option=1"],
        ["ls", "s3://bucket/run", *s3, "-o", "config_kwargs.retries=3"],
        ["ls", "s3://Bad_Bucket!/run", *s3],
    ):
        proc = _run_in(clone, *argv)
        _usage_error(proc.returncode, proc.stdout + proc.stderr)


@pytest.mark.server
def test_real_client_errors_against_seaweedfs(
    seaweedfs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real botocore / s3fs errors against a real server, in-process and from a clone
    named ``ckptstore``: exit 2 with the option named."""
    endpoint = seaweedfs.storage_options["endpoint_url"]
    creds = ["-o", f"key={seaweedfs.storage_options['key']}"]
    creds += ["-o", f"secret={seaweedfs.storage_options['secret']}"]
    cases = [
        (["-o", f"endpoint={endpoint}"], "endpoint_url"),  # the example
        (["-o", f"endpoint_url={endpoint}", "-o", "client_kwargs.region=x"], "region_name"),
        (["-o", f"endpoint_url={endpoint}", "-o", "config_kwargs.retries=3"], "config_kwargs"),
    ]
    clone = _checkout_named_ckptstore(tmp_path)
    for opts, says in cases:
        argv = ["ls", "s3://ckpt/exit-codes", *creds, *opts]
        rc, both = run_cli_text(capsys, argv)
        _usage_error(rc, both)
        assert says in both, both
        proc = _run_in(clone, *argv)
        _usage_error(proc.returncode, proc.stdout + proc.stderr)


@pytest.mark.server
def test_library_refuses_options_the_client_would_reject(seaweedfs: Any) -> None:
    """``endpoint=`` for ``endpoint_url=``: a ConfigError naming both when the store is
    opened (it was a bare client TypeError at the first request)."""
    options = dict(seaweedfs.storage_options)
    options["endpoint"] = options.pop("endpoint_url")
    for attempt in (
        lambda: open_store("s3://ckpt/opts", options),
        lambda: ckptstore.writer("s3://ckpt/opts/step_000000001", storage_options=options),
        lambda: ckptstore.reader("s3://ckpt/opts/step_000000001", storage_options=options),
    ):
        with pytest.raises(ConfigError, match="'endpoint'.*did you mean 'endpoint_url'"):
            attempt()


def test_gcs_and_azure_refuse_option_names_they_would_ignore() -> None:
    """gcsfs and the Azure SDK dropped an unknown name silently and used the default public
    endpoint: a misspelt endpoint sent the request, credentials and all, to the cloud."""
    with pytest.raises(ConfigError, match="did you mean 'endpoint_url'"):
        open_store("gs://bucket/run", {"endpoint": "http://127.0.0.1:1", "token": "anon"})
    with pytest.raises(ConfigError, match="did you mean 'account_url'"):
        open_store("az://c/run", {"account_name": "a", "account_key": "QUJD", "acount_url": "x"})


def test_missing_optional_dependency_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A URL whose fsspec backend needs a package that is not installed: exit 2 saying so,
    as docs/cli.md documents; ``MissingDependencyError`` from the library."""
    import fsspec

    fsspec.register_implementation(
        "needspkg",
        "ckptstore_no_such_package_xyz.NoFS",
        errtxt='NoFS requires "ckptstore_no_such_package_xyz" to be installed',
        clobber=True,
    )
    with pytest.raises(MissingDependencyError, match="ckptstore_no_such_package_xyz"):
        open_store("needspkg://bucket/run")
    rc, both = run_cli_text(capsys, ["ls", "needspkg://bucket/run"])
    _usage_error(rc, both)
    assert "not installed" in both, both


@pytest.fixture(scope="module")
def pib_metadata(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stock DCP checkpoint whose ``.metadata`` claims a 4 PiB tensor (1-D, 2**50 floats)."""
    d = tmp_path_factory.mktemp("pib") / "stock"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(16)}, storage_writer=dcp.FileSystemWriter(str(d)), no_dist=True)
    md = pickle.loads((d / ".metadata").read_bytes())
    item = md.state_dict_metadata["w"]
    item.size = torch.Size([2**50])
    item.chunks[0].sizes = torch.Size([2**50])
    (d / ".metadata").write_bytes(pickle.dumps(md))
    return d


@pytest.mark.parametrize("command", ["convert", "diff"])
def test_petabyte_metadata_is_never_an_internal_error(
    command: str, pib_metadata: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was exit 3 (torch's allocator refusing 4 PiB). Now a refusal with a documented
    code within seconds: 1 once the sizes are checked against the files
    (``CorruptCheckpointError``), 2 (not enough memory) until then."""
    argv = {
        "convert": ["convert", str(pib_metadata), str(tmp_path / "out.pt"), "--to", "torch"],
        "diff": ["diff", str(pib_metadata), str(pib_metadata)],
    }[command]
    t = time.monotonic()
    rc, both = run_cli_text(capsys, argv)
    assert rc in (1, 2), both
    assert "internal error" not in both and "Traceback" not in both, both
    assert time.monotonic() - t < 60
    assert not (tmp_path / "out.pt").exists()


def test_corrupt_errors_map_to_exit_1_however_wrapped() -> None:
    """A ``CorruptCheckpointError`` is exit 1 on its own, inside DCP's
    ``CheckpointException``, and as the cause of another library's error."""
    from torch.distributed.checkpoint.api import CheckpointException

    from ckptstore.cli.exit_codes import EXIT_CHECK_FAILED, explain

    corrupt = CorruptCheckpointError("x/.metadata claims 4 PiB in a 1 KiB file")
    wrapped = RuntimeError("planning failed")
    wrapped.__cause__ = corrupt
    for exc in (corrupt, CheckpointException("load", {0: corrupt}), wrapped):
        code, message = explain(exc, ["x"])
        assert code == EXIT_CHECK_FAILED and "4 PiB" in message, (exc, message)


# -- ckptstore.load into a state dict that does not match ---------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("load") / "step_000000001")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ckptstore.save({"model": {"w": torch.ones(4, 4)}, "step": 3}, url)
    return url


@pytest.mark.parametrize(
    ("state", "names"),
    [
        ({"model": {"w": torch.zeros(4, 4), "extra": torch.zeros(2)}}, ["'model.extra'"]),
        ({"model": {"w": torch.zeros(2, 8)}}, ["'model.w'", "[2, 8]", "[4, 4]"]),
        ({"nothere": 1}, ["'nothere'"]),
    ],
    ids=["missing-key", "shape", "missing-top-level"],
)
def test_load_mismatch_is_one_ckptstore_error(
    saved: str, state: dict[str, Any], names: list[str]
) -> None:
    """Not torch's ``CheckpointException`` (a BaseException holding every rank's traceback):
    one ``StateDictMismatchError`` (a ``ConfigError``, a ``ValueError``) naming the key
    and both shapes; nothing was loaded."""
    from ckptstore.errors import StateDictMismatchError

    with pytest.raises(StateDictMismatchError) as info:
        ckptstore.load(state, saved)
    message = str(info.value)
    assert all(n in message for n in names), message
    assert "Traceback" not in message and "inspect" in message, message
    assert isinstance(info.value, ValueError)
    if "w" in state.get("model", {}):
        assert not state["model"]["w"].any()  # nothing loaded into it
