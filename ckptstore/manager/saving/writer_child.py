"""One writer process, training side: starting it, talking to it, telling how it ended.

Call order (``BackgroundWriter`` in ``ckptstore.manager.saving.writer_process`` drives it)::

    child = WriterChild(settings)     # starts ``python -m ckptstore.manager.saving.writer_main``
                                      # (through ``spawn``: from a thread that lives as long
                                      # as this process) and sends it the settings
    child.answered()                  # True once its ready answer (or its exit) is there
    child.wait(broken, on_fetch)      # its ready answer, then each save's Outcome (each
                                      # Fetch before it answered by ``on_fetch``); raises
                                      # WriterDied if it died, GroupBroken (after killing
                                      # it) when ``broken()`` says another rank's writer did
    child.request(job, arena)         # a SaveJob, with the arena's fd when it is new to it
    child.close()                     # asks it to exit, kills it after STOP_GRACE_S, reaps
                                      # it (``kill()`` at once; a finalizer if forgotten)
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ckptstore.manager.saving.shared_arena import Arena
from ckptstore.manager.saving.writer_protocol import (
    Fetch,
    Fetched,
    Outcome,
    SaveJob,
    WriterSettings,
    recv,
    send,
)

__all__ = [
    "POLL_S",
    "STOP_GRACE_S",
    "GroupBroken",
    "Spawner",
    "WriterChild",
    "WriterDied",
    "exit_description",
    "spawn",
]

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0  # a writer asked to exit is killed after this
POLL_S = 0.2  # how often a waiting rank looks for a broken group in the store


def exit_description(code: int | None) -> str:
    """How a writer process ended, in words (exit code or signal name)."""
    if code is None:
        return "was stopped"
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (kill -9, or the out-of-memory killer)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


class WriterDied(Exception):
    """The writer process exited (``code``: its exit status, None if unknown)."""

    def __init__(self, code: int | None) -> None:
        super().__init__(code)
        self.code = code


class GroupBroken(Exception):
    """Another rank said its writer died or failed; ``args[0]`` says how."""


def _answer(request: Fetch, on_fetch: Callable[[Fetch], Fetched] | None) -> Fetched:
    """``on_fetch``'s answer to ``request``; an error answer (the writer then fails its
    save) if there is none or it raised."""
    if on_fetch is None:
        return Fetched(request.round, error="no save staged in rounds is in flight")
    try:
        return on_fetch(request)
    except Exception as exc:  # noqa: BLE001 - the writer fails the save with it
        log.exception("staging round %s of step %d failed", request.round, request.step)
        return Fetched(request.round, error=f"{type(exc).__name__}: {exc}")


def _reap(proc: subprocess.Popen, sock: socket.socket) -> None:
    sock.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()


class Spawner:
    """Starts processes from one thread that lives as long as this process.

    A writer arms PR_SET_PDEATHSIG, which Linux fires when the *thread* that started it
    ends: a writer started from a short-lived thread (a user's, calling ``save``) would be
    killed with that thread. The main thread lives as long as the process, so a call from
    it starts the process directly; any other call hands the start to this thread.
    """

    _lock = threading.Lock()
    _jobs: queue.SimpleQueue | None = None

    @classmethod
    def popen(cls, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """``subprocess.Popen(argv)``, started from a thread that outlives the call."""
        if threading.current_thread() is threading.main_thread():
            return subprocess.Popen(argv, **kwargs)
        with cls._lock:
            if cls._jobs is None:
                cls._jobs = queue.SimpleQueue()
                threading.Thread(
                    target=cls._serve, args=(cls._jobs,), name="ckptstore-spawner", daemon=True
                ).start()
        done: queue.SimpleQueue = queue.SimpleQueue()
        cls._jobs.put((argv, kwargs, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    @staticmethod
    def _serve(jobs: queue.SimpleQueue) -> None:
        while True:
            argv, kwargs, done = jobs.get()
            try:
                done.put((True, subprocess.Popen(argv, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                done.put((False, exc))


spawn = Spawner.popen


class WriterChild:
    """One writer process and its socket (training side)."""

    def __init__(self, settings: WriterSettings) -> None:
        ours, theirs = socket.socketpair()
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, RANK=str(settings.rank))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_parent, os.environ.get("PYTHONPATH")) if p
        )
        try:
            self.proc = spawn(
                [
                    sys.executable,
                    "-m",
                    "ckptstore.manager.saving.writer_main",
                    str(theirs.fileno()),
                    str(os.getpid()),
                ],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False
        self.arena_id = 0  # the arena this writer has mapped (ids start at 1: 0, no job yet)
        self._finalizer = weakref.finalize(self, _reap, self.proc, self.sock)
        try:
            send(self.sock, (settings.sys_path, pickle.dumps(settings, protocol=5)))
        except OSError:
            pass  # it died at once: the first wait says so

    def alive(self) -> bool:
        """True while the writer process runs."""
        return self.proc.poll() is None

    def request(self, job: SaveJob, arena: Arena) -> None:
        """Send one save job and the arena's file descriptor to the writer process."""
        fds = [arena.fd] if arena.arena_id != self.arena_id else None
        try:
            send(self.sock, job, fds)
        except OSError:
            raise WriterDied(self._exit_code()) from None
        self.arena_id = arena.arena_id

    def answered(self) -> bool:
        """True when a message (or the end of the socket) waits to be read: ``wait``
        returns without waiting for the writer."""
        readable, _, _ = select.select([self.sock], [], [], 0)
        return bool(readable) or not self.alive()

    def wait(
        self,
        broken: Callable[[], str | None],
        on_fetch: Callable[[Fetch], Fetched] | None = None,
    ) -> Outcome:
        """The writer's next Outcome, answering each Fetch before it with ``on_fetch``;
        raises WriterDied or (after stopping it) GroupBroken."""
        while True:
            readable, _, _ = select.select([self.sock], [], [], POLL_S)
            if not readable and not self.alive():  # its socket may live on in a fork
                readable, _, _ = select.select([self.sock], [], [], 0)
                if not readable:
                    raise WriterDied(self.proc.returncode)
            if readable:
                try:
                    message, _ = recv(self.sock)
                    if isinstance(message, Fetch):
                        send(self.sock, _answer(message, on_fetch))
                        continue
                except (EOFError, OSError):
                    raise WriterDied(self._exit_code()) from None
                return message
            why = broken()
            if why:
                self.kill()
                raise GroupBroken(why)

    def _exit_code(self) -> int | None:
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its socket closed but it lingers: finish it
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the writer process and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Ask the writer process to exit, then reap it (killed if it does not). One that
        was never sent a job holds nothing of a save: it is killed at once rather than
        waited for while it is still importing torch (a manager used only to restore, to
        list steps or refused at its first save closes in milliseconds, not seconds)."""
        if self.proc.poll() is None and self.arena_id:  # it was sent a job
            try:
                send(self.sock, None)
                self.proc.wait(timeout=STOP_GRACE_S)
            except OSError:
                pass  # it is gone already
            except subprocess.TimeoutExpired:
                log.warning("the background writer process did not exit in time; killing it")
        self._finalizer()  # closes the socket; kills and reaps it if still running
