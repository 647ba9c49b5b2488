"""Real object-store servers on 127.0.0.1 for tests and benchmarks.

Each server is a subprocess on free ports with its own temp data directory, started on
demand and stopped (and its directory deleted) by ``stop()``. Subclasses say how to
launch and how to build a client ``Store`` for a bucket/container on it.

    with SeaweedFS() as server:                 # (each backend module defines its class)
        store = server.store("bucket/prefix")   # a ckptstore Store rooted there
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

from harness.dist import free_port

__all__ = ["ServerProcess", "free_port", "wait_for_port"]


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f} s")


class ServerProcess:
    """A server subprocess with a temp data dir. Subclasses implement ``command`` etc."""

    name = "server"
    ready_timeout = 60.0
    #: Tries with fresh ports: a port checked free can be taken before the server binds it.
    start_attempts = 3

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"ckptstore-{self.name}-")
        self.port = 0
        self.pick_ports()
        self.proc: subprocess.Popen | None = None
        self._log = open(os.path.join(self.dir, "server.log"), "wb")  # noqa: SIM115

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def wait_ready(self) -> None:
        wait_for_port(self.port, self.ready_timeout, self.proc)

    def pick_ports(self) -> None:
        """Choose fresh ports; called again before each retried start."""
        self.port = free_port()

    def start(self) -> ServerProcess:
        for attempt in range(1, self.start_attempts + 1):
            self.proc = subprocess.Popen(
                self.command(),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.dir,
                start_new_session=True,
            )
            try:
                self.wait_ready()
                return self
            except (RuntimeError, TimeoutError) as exc:
                log = self.log_tail()
                self._kill()
                if attempt == self.start_attempts:
                    self.stop()
                    raise RuntimeError(
                        f"{self.name} did not start in {attempt} tries ({exc}); its log:\n{log}"
                    ) from None
                self.pick_ports()
        raise AssertionError("unreachable")

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(os.path.join(self.dir, "server.log"), "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        self._kill()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill(self) -> None:
        """End the server process: SIGTERM, then SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 15)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, 9)
                except ProcessLookupError:
                    pass
                self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
