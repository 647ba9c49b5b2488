"""One aiobotocore session per process for S3Store's clients, its botocore data loaded once.

A process's first S3 request used to cost 0.5-2.6 s on a shared 2-core machine before a byte
moved (benchmarks/bench_data_client.py, cProfile of the request's event-loop thread, issue
18): about half of it botocore reading and parsing its JSON data (the S3 service model, its
endpoint rules, endpoints/partitions) and listing its data directories to find them, about
an eighth creating the session (registering its built-in event handlers), the rest the
client and the round trip. Every DataLoader worker paid all of it again, in every epoch,
because torch forks fresh workers at every ``iter()`` and a worker must build its own client
(no event loop or socket may cross a fork: fsspec makes a new loop in the child).

What can cross a fork safely is data, and a session no client was ever made from:

- **the loader**: one botocore ``Loader`` per data path for the whole process (and so for
  the processes forked from it), warmed with what an S3 client loads
  (aiobotocore's ``warm_up_loader_caches("s3")``) by :func:`process_session` in the process
  that builds an ``S3Store``, before any DataLoader forks. A child finds it warm: its JSON
  is plain dicts, inherited copy-on-write; botocore itself shares one loader between the
  clients of a session the same way.
- **the session**: :func:`process_session` gives each process one ``AioSession`` per
  profile, used only there: a child never uses its parent's (it may hold resolved
  credentials, whose refresh lock binds to the parent's event loop). Before a process that
  holds one forks, it makes a spare, from which no client is made in that process
  (``os.register_at_fork``; once, reused by every later fork); a child adopts its copy of the
  spare instead of building a session. A child makes no spare of its own until it forks.

A session serves every client of the process (each ``S3FileSystem`` still makes its own
client, with its own endpoint, credentials and connection pool), so a second dataset or
store on the same options reuses the first one's client: fsspec caches the filesystem per
process and argument set, and the session passed is the same object each time.

Call order: ``process_session(profile)`` from the thread building a store (``make_s3fs``),
any number of times; nothing to close (sessions hold no connections; clients do).
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["process_session", "shared_loader"]

#: botocore data path -> the one Loader of this process and its forked children.
_LOADERS: dict[str | None, Any] = {}
#: (pid, profile) -> the session that process uses (a child ignores its parent's entries).
_SESSIONS: dict[tuple[int, str | None], Any] = {}
#: (pid, profile) -> a session made in process pid before it forked, never used there.
_SPARES: dict[tuple[int, str | None], Any] = {}
_lock = threading.Lock()


def shared_loader(data_path: str | None) -> Any:
    """The botocore ``Loader`` for ``data_path`` shared by this process's sessions."""
    loader = _LOADERS.get(data_path)
    if loader is None:
        from botocore.loaders import create_loader

        loader = _LOADERS.setdefault(data_path, create_loader(data_path))
    return loader


def _new_session(profile: str | None) -> Any:
    from aiobotocore.session import AioSession

    session = AioSession(profile=profile)
    session.register_component(
        "data_loader", shared_loader(session.get_config_variable("data_path"))
    )
    return session


def process_session(profile: str | None = None) -> Any:
    """This process's ``AioSession`` for ``profile``, its loader warm for S3 clients.

    Made on first use in each process (a forked child adopts its copy of the spare its
    parent made before forking, if any); the loader is warmed on every call, which costs
    nothing once it is (every load is a cache hit).
    """
    key = (os.getpid(), profile)
    with _lock:
        session = _SESSIONS.get(key)
        if session is None:
            session = _adopt_spare(profile) or _new_session(profile)
            _SESSIONS[key] = session
        session.warm_up_loader_caches("s3")
    return session


def _adopt_spare(profile: str | None) -> Any:
    """The spare an ancestor made before forking this process (now this process's)."""
    pid = os.getpid()
    for key in [k for k in _SPARES if k[0] != pid and k[1] == profile]:
        return _SPARES.pop(key)
    return None


def _before_fork() -> None:
    """Make, once per process and profile in use, the spare a forked child adopts."""
    pid = os.getpid()
    try:
        for _, profile in [k for k in _SESSIONS if k[0] == pid]:
            if (pid, profile) not in _SPARES:
                _SPARES[(pid, profile)] = _new_session(profile)
    except Exception:  # noqa: BLE001 - a child without a spare just builds its own session
        pass


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    pid = os.getpid()
    for table in (_SESSIONS,):  # the parent's in-use sessions are never ours
        for key in [k for k in table if k[0] != pid]:
            del table[key]


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
