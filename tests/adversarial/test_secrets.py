"""No credential reaches output; text read from storage is printed with controls escaped.

Each case plants a sentinel credential where a user puts one (a ``-o`` option, the
user-info of a URL, an Azure connection string, a signed query string) and drives a real
failure path (a client refusing an option, a closed port, a real SeaweedFS refusing a
wrong secret), then checks every byte the CLI printed, every library error's ``str`` and
``repr``, and every library log line: the sentinel never appears. The other half plants
terminal controls (ESC sequences, a carriage return, a newline forging a ``Status`` line,
a bidi override) in a committed checkpoint's manifest ``extra`` and in a path an error
names, and checks they are printed escaped.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Marker
from ckptstore.errors import CkptStoreError
from ckptstore.stores import open_store
from tests.adversarial.clirun import closed_port, run_cli_text
from tests.cli.conftest import REPO

SECRET = "Sent1nelSecretValue9"  # as a password, key, token, account key, signature


def _cases(port: int) -> list[tuple[str, list[str]]]:
    s3 = ["-o", f"endpoint_url=http://127.0.0.1:{port}"]
    conn = (
        "DefaultEndpointsProtocol=http;AccountName=acct;"
        f"AccountKey={SECRET};BlobEndpoint=http://127.0.0.1:{port}/acct;"
    )
    return [
        # the case: a client rejects an option; its message listed every -o value
        ("s3-bogus-option", ["ls", "s3://b/r", *s3, "-o", f"secret={SECRET}", "-o", "bogus=1"]),
        ("s3-bad-value", ["ls", "s3://b/r", *s3, "-o", f"key={SECRET}", "-o", "client_kwargs=3"]),
        (
            "s3-bad-config",
            ["ls", "s3://b/r", *s3, "-o", f"token={SECRET}", "-o", "config_kwargs.retries=3"],
        ),
        (
            "s3-nested-secret",
            ["ls", "s3://b/r", *s3, "-o", f"client_kwargs.aws_secret_access_key={SECRET}"]
            + ["-o", "client_kwargs.endpoint=x"],
        ),
        ("s3-closed-port", ["ls", "s3://b/r", *s3, "-o", "key=k", "-o", f"secret={SECRET}"]),
        # user:password in URLs of every scheme
        ("s3-userinfo", ["inspect", f"s3://user:{SECRET}@bkt/run"]),
        ("gs-userinfo", ["ls", f"gs://user:{SECRET}@bkt/run", "-o", "token=anon"]),
        ("az-userinfo", ["ls", f"az://user:{SECRET}@acct/run"]),
        ("http-userinfo", ["ls", f"http://user:{SECRET}@127.0.0.1:{port}/run"]),
        ("ftp-userinfo", ["ls", f"ftp://user:{SECRET}@127.0.0.1:{port}/run"]),
        (
            "http-bogus",
            ["ls", f"http://127.0.0.1:{port}/r", "-o", f"password={SECRET}"] + ["-o", "x=1"],
        ),
        # Azure credentials inside a connection string, a rejected one, an account key
        ("az-conn", ["ls", "az://c/run", "-o", f"connection_string={conn}"]),
        ("az-conn-garbage", ["ls", "az://c/run", "-o", f"connection_string=garbage{SECRET}"]),
        ("az-key-typo", ["ls", "az://c/run", "-o", f"account_key={SECRET}", "-o", "acount=a"]),
        # a signed URL's query string, a flag argparse refuses
        ("sas-url", ["ls", f"http://127.0.0.1:{port}/c/r?sv=2024&sig={SECRET}&se=1"]),
        ("unknown-flag", ["ls", "/nonexistent", f"--token={SECRET}"]),
    ]


_IDS = [c[0] for c in _cases(1)]


@pytest.mark.parametrize("case", _IDS)
def test_cli_never_prints_a_credential(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every failure of these commands is a usage/access error (2) whose output holds no
    part of the credential given: not the value, not the URL's user-info."""
    argv = dict(_cases(closed_port()))[case]
    rc, both = run_cli_text(capsys, argv)
    assert SECRET not in both, both
    assert rc == 2, both
    assert "Traceback" not in both and "internal error" not in both, both


@pytest.mark.processes
def test_console_script_with_traceback_env_prints_no_credential() -> None:
    """The real console script, with CKPTSTORE_TOOL_TRACEBACK=1 set, on a client error."""
    env = dict(os.environ, PYTHONPATH=REPO, CKPTSTORE_TOOL_TRACEBACK="1")
    port = closed_port()
    for argv in (
        ["ls", "s3://b/r", "-o", f"endpoint_url=http://127.0.0.1:{port}"]
        + ["-o", f"secret={SECRET}", "-o", "bogus=1"],
        ["inspect", f"s3://user:{SECRET}@bkt/run"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "ckptstore.cli", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 2, proc.stderr
        assert SECRET not in proc.stdout + proc.stderr, proc.stderr


@pytest.mark.server
def test_wrong_secret_on_a_real_server_is_not_printed(
    seaweedfs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """SeaweedFS refuses a wrong secret (a real 403): the message says so, without it."""
    opts = dict(seaweedfs.storage_options)
    argv = ["ls", f"s3://ckpt/secrets-{uuid.uuid4().hex[:8]}"]
    argv += ["-o", f"endpoint_url={opts['endpoint_url']}", "-o", f"key={opts['key']}"]
    rc, both = run_cli_text(capsys, [*argv, "-o", f"secret={SECRET}"])
    assert rc == 2 and SECRET not in both, both
    assert "access denied" in both or "refused" in both, both


def test_library_errors_carry_no_credential() -> None:
    """``str`` and ``repr`` of every ckptstore error built around a credential are clean,
    whichever way the credential got into the message."""
    port = closed_port()
    attempts: list[Any] = [
        lambda: open_store(f"s3://user:{SECRET}@bkt/run"),
        lambda: open_store(f"az://user:{SECRET}@acct/run"),
        lambda: open_store("s3://b/r", {"secret": SECRET, "endpoint": "http://x"}),
        lambda: ckptstore.reader(f"http://user:{SECRET}@127.0.0.1:{port}/run"),
        lambda: open_store("gs://b/r", {"token": SECRET, "endpoint": "http://x"}),
    ]
    for attempt in attempts:
        with pytest.raises(Exception) as info:  # noqa: PT011 - any error, all checked alike
            attempt()
        assert SECRET not in str(info.value) and SECRET not in repr(info.value), info.value
        assert isinstance(info.value, (CkptStoreError, OSError)), repr(info.value)
    # a message naming no option at all: the value is known from the store's options
    open_store("s3://b/r", {"secret": SECRET, "endpoint_url": f"http://127.0.0.1:{port}"})
    from ckptstore.errors import StoreAccessError

    assert SECRET not in str(StoreAccessError(f"Invalid header value {SECRET!r}"))


def test_library_log_lines_carry_no_credential() -> None:
    """A ckptstore logger's record is redacted before any application handler formats it."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(self.format(record))

    root = logging.getLogger()
    handler = Keep()
    root.addHandler(handler)
    try:
        log = logging.getLogger("ckptstore.engine.retry")
        log.warning("retrying %s after: %s", f"http://u:{SECRET}@h/x", {"token": SECRET})
        try:
            raise ValueError(f"secret={SECRET}")
        except ValueError:
            logging.getLogger("ckptstore.stores.gcs").exception("failed")
    finally:
        root.removeHandler(handler)
    assert len(seen) == 2 and all(SECRET not in line for line in seen), seen


def test_redaction_keeps_advice_and_ordinary_text() -> None:
    """What is not a credential stays: placeholders, option names, endpoints, paths."""
    from ckptstore.redact import redact

    advice = "pass -o key=... -o secret=... or -o KEY=VALUE (-o endpoint_url=http://h:1)"
    assert redact(advice) == advice
    path = "/data/run/step_000000001/__0_0.distcp: size 5, manifest says 10"
    assert redact(path) == path


# -- text from storage -----------------------------------------------------------------

EVIL = "\x1b]0;owned\x07\x1b[2J\rStatus      committed\nNote        all good\u202e"


def _resign_extra(step: Path, extra: dict[str, Any]) -> None:
    """Put ``extra`` in the manifest and re-sign the marker (as a bucket writer can)."""
    doc = json.loads((step / MANIFEST_NAME).read_bytes())
    doc["extra"] = extra
    manifest = json.dumps(doc).encode()
    marker = json.loads((step / MARKER_NAME).read_bytes())
    for name in os.listdir(step):
        if name.startswith("ckptstore.manifest."):
            os.remove(step / name)
    (step / MANIFEST_NAME).write_bytes(manifest)
    data = Marker.for_manifest(manifest, doc["step"], marker["attempt"]).to_bytes()
    (step / MARKER_NAME).write_bytes(data)


def _assert_escaped(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text, repr(text)
    assert "\u202e" not in text, repr(text)
    lines = text.splitlines()
    assert not any(ln.startswith("Note        all good") for ln in lines), text
    assert sum(ln.startswith("Status ") for ln in lines) <= 1, text


def test_inspect_escapes_manifest_extra(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    step = tmp_path / "run" / "step_000000003"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ckptstore.save({"w": torch.ones(2)}, ckptstore.writer(str(step)))
    _resign_extra(step, {EVIL: EVIL, "note": {"nested": EVIL}})
    rc, both = run_cli_text(capsys, ["inspect", str(step)])
    assert rc == 0, both
    _assert_escaped(both)
    assert "\\u001b" in both and "\\n" in both  # shown, escaped, not dropped
    rc, out = run_cli_text(capsys, ["inspect", str(step), "--json"])
    assert rc == 0 and json.loads(out[: out.rindex("}") + 1])["manifest"]["extra"][EVIL] == EVIL


def test_error_lines_escape_controls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An error naming a path from the user or storage stays one escaped line."""
    rc, both = run_cli_text(capsys, ["inspect", str(tmp_path / f"nope{EVIL}")])
    assert rc == 2
    _assert_escaped(both)
    assert len(both.strip().splitlines()) == 1, both
