"""The CLI run in-process for the attack tests, and a port nothing listens on."""

from __future__ import annotations

import socket

import pytest

from ckptstore.cli.main import main


def closed_port() -> int:
    """A local port with nothing listening (closed once the with-block ends)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """``ckptstore-tool argv`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def run_cli_text(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    """``run_cli`` with stdout and stderr together: (exit code, everything printed)."""
    rc, out, err = run_cli(capsys, argv)
    return rc, out + err
