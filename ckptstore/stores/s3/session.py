"""One aiobotocore session per process for S3Store's clients, its botocore data loaded once.

A process's first S3 request cost 0.5-2.6 s on a shared 2-core machine before a byte moved
(botocore parsing its JSON data, creating the session, loading the CA bundle; issue 18),
and every DataLoader worker paid it again in every epoch: torch forks fresh workers at each
``iter()``, and a worker must build its own client (no event loop or socket may cross a
fork). What can cross a fork is data, and objects made for the child and never used before
the fork: the warmed botocore loader, a spare session and a spare TLS context (how each is
shared is :func:`process_session`'s docstring). A session serves every client of the
process, so a second dataset or store on the same options reuses the first one's client.

Call order: ``process_session(profile)`` from the thread building a store (``make_s3fs``),
any number of times; nothing to close (sessions hold no connections; clients do).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["process_session", "shared_loader", "http_session_class"]

#: botocore data path -> the one Loader of this process and its forked children.
_LOADERS: dict[str | None, Any] = {}
#: (pid, profile) -> the session that process uses (a child ignores its parent's entries).
_SESSIONS: dict[tuple[int, str | None], Any] = {}
#: (pid, profile) -> a session made in process pid before it forked, never used there.
_SPARES: dict[tuple[int, str | None], Any] = {}
#: (pid, CA bundle) -> the TLS context that process's clients verify servers with.
_CONTEXTS: dict[tuple[int, str], Any] = {}
#: (pid, CA bundle) -> a context made in process pid before it forked, never used there.
_SPARE_CONTEXTS: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()
_ctx_lock = threading.Lock()


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

    - **the loader**: one botocore ``Loader`` per data path for the whole process (and so for
      the processes forked from it), warmed with what an S3 client loads
      (the files and calls the client makes) by :func:`process_session` in the process
      that builds an ``S3Store``, before any DataLoader forks. A child finds it warm: its JSON
      is plain dicts, inherited copy-on-write; botocore itself shares one loader between the
      clients of a session the same way.
    - **the session**: :func:`process_session` gives each process one ``AioSession`` per
      profile, used only there: a child never uses its parent's (it may hold resolved
      credentials, whose refresh lock binds to the parent's event loop). Before a process that
      holds one forks, it makes a spare, from which no client is made in that process
      (``os.register_at_fork``; once, reused by every later fork); a child adopts its copy of the
      spare instead of building a session. A child makes no spare of its own until it forks.
    - **the TLS context**: :func:`http_session_class` (the clients' ``http_session_cls``) shares
      one certificate-verifying context per process and CA bundle, with a never-used spare
      made before a fork for the child to adopt, the same way.
    """
    key = (os.getpid(), profile)
    with _lock:
        session = _SESSIONS.get(key)
        if session is None:
            session = _adopt_spare(profile) or _new_session(profile)
            _SESSIONS[key] = session
        _warm(session.get_component("data_loader"))
    return session


#: Loaders (by id) already warmed for S3 clients, in this process or an ancestor.
_WARM: set[int] = set()


def _warm(loader: Any) -> None:
    """Load what creating an S3 client loads, called as botocore calls it (the loader
    caches by the arguments), so that the client's own loads are all cache hits.

    Written out rather than aiobotocore's ``warm_up_loader_caches("s3")``, which also loads
    the paginators, waiters and examples with other argument forms: each such call scans
    botocore's ~400 service directories again, which cost more than the warm-up saved
    (bench_data_client: the rank's open_store 0.9-1.1 s -> 1.3-1.7 s with it, at load 4-6).
    """
    if id(loader) in _WARM:
        return
    for name in ("endpoints", "partitions", "_retry", "sdk-default-configuration"):
        loader.load_data_with_path(name)  # session.py / client.py / args.py load these
    for type_name in ("service-2", "endpoint-rule-set-1"):  # ClientCreator's two models
        loader.load_service_model("s3", type_name, api_version=None)
    _WARM.add(id(loader))


def _adopt_spare(profile: str | None) -> Any:
    """The spare session an ancestor made before forking this process (now this one's)."""
    return _adopt(_SPARES, profile)


def _adopt(spares: dict[tuple[int, Any], Any], name: Any) -> Any:
    pid = os.getpid()
    for key in [k for k in spares if k[0] != pid and k[1] == name]:
        return spares.pop(key)
    return None


@functools.cache
def http_session_class() -> type:
    """aiobotocore's ``AIOHTTPSession``, its certificate-verifying TLS context shared.

    aiobotocore builds that context for every client, loading the CA bundle (about 140
    certificates; 50 ms unloaded, the largest single cost left in a forked worker's first
    request) even for an ``http://`` endpoint. Here it is built once per process and CA
    bundle, shared by that process's clients (aiohttp never changes a context it is given),
    and a forked child adopts a copy made before the fork and never used in the parent
    (so no lock inside it was held by a handshake at the fork). A context that will get a
    client certificate (``client_cert``) stays each client's own.
    """
    from aiobotocore.httpsession import AIOHTTPSession
    from botocore.httpsession import get_cert_path

    class SharedContextSession(AIOHTTPSession):  # type: ignore[misc]
        def _build_verify_context(self) -> Any:
            ca_certs = get_cert_path(self._verify) if self._verify else None
            if self._cert_file or not ca_certs:
                return super()._build_verify_context()
            return _verify_context(str(ca_certs), self._own_verify_context)

        def _own_verify_context(self) -> Any:
            return super()._build_verify_context()

    SharedContextSession.__qualname__ = SharedContextSession.__name__
    return SharedContextSession


def _verify_context(ca_certs: str, build: Callable[[], Any]) -> Any:
    key = (os.getpid(), ca_certs)
    with _ctx_lock:
        context = _CONTEXTS.get(key)
        if context is None:
            context = _CONTEXTS[key] = _adopt(_SPARE_CONTEXTS, ca_certs) or build()
    return context


def _spare_context(ca_certs: str) -> Any:
    session = http_session_class()(verify=ca_certs)
    return session._own_verify_context()


def _before_fork() -> None:
    """Make, once per process, the spares a forked child adopts: a session per profile in
    use, a TLS context per CA bundle in use."""
    pid = os.getpid()
    try:
        for _, profile in [k for k in _SESSIONS if k[0] == pid]:
            if (pid, profile) not in _SPARES:
                _SPARES[(pid, profile)] = _new_session(profile)
        for _, ca_certs in [k for k in _CONTEXTS if k[0] == pid]:
            if (pid, ca_certs) not in _SPARE_CONTEXTS:
                _SPARE_CONTEXTS[(pid, ca_certs)] = _spare_context(ca_certs)
    except Exception:  # noqa: BLE001 - a child without a spare just builds its own
        pass


def _after_fork_in_child() -> None:
    global _lock, _ctx_lock
    _lock, _ctx_lock = threading.Lock(), threading.Lock()  # maybe held by a thread at fork
    pid = os.getpid()
    # The parent's, maybe in use at the fork, are never ours.
    for key in [k for k in _SESSIONS if k[0] != pid]:
        del _SESSIONS[key]
    for ctx_key in [k for k in _CONTEXTS if k[0] != pid]:
        del _CONTEXTS[ctx_key]


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
