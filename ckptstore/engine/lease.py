"""Leases: a live writer's heartbeat object, which deletion and other jobs honour.

Two kinds share one small JSON document (``parse_lease``): a **step lease**,
``step_<n>/ckptstore.lease.<attempt>.json``, which the coordinator of a save writes before
any rank writes a file and keeps until the save commits or fails (while it is fresh, gc,
retention, torn-leftover cleanup, stale-upload aborts and another attempt's commit delete
nothing in that step); and the **root owner**, ``<root>/ckptstore.owner.json``
(``engine.owner``), which rank 0 of a ``CheckpointManager`` keeps from its first save until
``close``, so a second job on the same root is refused instead of mixed in. The staleness
bound every reader and holder keeps is :class:`Heartbeat`'s docstring. Pure bytes and
store calls.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from ckptstore.engine.bounded import get_capped
from ckptstore.engine.store import Store
from ckptstore.errors import CkptStoreError, CorruptCheckpointError, InUseError, StoreNotFoundError

__all__ = [
    "HEARTBEAT_S",
    "STALE_AFTER_S",
    "SAFE_S",
    "MAX_LEASE_BYTES",
    "LeaseInfo",
    "Heartbeat",
    "hold_step_lease",
    "parse_lease",
    "parse_document",
    "parse_holder",
    "lease_name",
    "is_lease_name",
    "read_lease",
    "live_leases",
    "check_run_id",
    "holder_is_dead",
    "process_is_gone",
    "node_id",
    "this_host",
]

log = logging.getLogger(__name__)

#: How often a holder rewrites its lease.
HEARTBEAT_S = 5.0
#: A lease whose time is further than this from the reader's clock is a dead holder's.
STALE_AFTER_S = 60.0
#: A holder whose last successful refresh is older than this no longer vouches for it.
SAFE_S = STALE_AFTER_S - 2 * HEARTBEAT_S
#: A lease document is a few hundred bytes; anything bigger is refused before parsing.
MAX_LEASE_BYTES = 4096

_LEASE = re.compile(r"^ckptstore\.lease\.([0-9a-f]{1,64})\.json$")
#: Run ids, hosts, node ids and tokens: printable ASCII without spaces (never escaped
#: wrongly into a message or a terminal), bounded.
_WORD = re.compile(r"^[\x21-\x7e]{1,200}$")


def check_run_id(run_id: object, what: str = "run_id") -> str:
    """``run_id`` if it is a usable run identity (1-200 printable ASCII characters, no
    spaces), else ``ValueError`` saying so."""
    if not isinstance(run_id, str) or not _WORD.match(run_id):
        raise ValueError(
            f"{what} must be 1-200 printable ASCII characters without spaces, got {run_id!r}"
        )
    return run_id


@dataclass(frozen=True)
class LeaseInfo:
    """One lease as its holder wrote it."""

    run: str  # the holder's run identity
    host: str  # socket.gethostname() of the holder
    pid: int  # the holding process
    node: str  # boot id + pid namespace: tells whether ``pid`` can be checked from here
    token: str  # this holder's own id (two holders of one run differ here)
    time: float  # when it was last refreshed, by the holder's clock (seconds since epoch)
    attempt: str = ""  # a step lease: the coordinator's attempt id

    def age(self, now: float | None = None) -> float:
        """Seconds since the last refresh, by this process's clock (negative: ahead)."""
        return (time.time() if now is None else now) - self.time

    def fresh(self, now: float | None = None) -> bool:
        """True while the holder is taken to be alive (the bound: :class:`Heartbeat`)."""
        return abs(self.age(now)) <= STALE_AFTER_S

    def describe(self, now: float | None = None) -> str:
        """``run 'x' (host h, pid 12), heartbeat 3 s ago``."""
        return (
            f"run {self.run!r} (host {self.host}, pid {self.pid}), heartbeat "
            f"{self.age(now):.0f} s ago"
        )

    def to_bytes(self) -> bytes:
        """The lease document."""
        doc = {
            "ckptstore_lease": 1,
            "run": self.run,
            "host": self.host,
            "pid": self.pid,
            "node": self.node,
            "token": self.token,
            "time": self.time,
            "attempt": self.attempt,
        }
        return json.dumps(doc, sort_keys=True).encode()


def _word(doc: dict, key: str, where: str, kind: str = "lease", empty: bool = False) -> str:
    value = doc.get(key, "")
    if isinstance(value, str) and (_WORD.match(value) or (empty and value == "")):
        return value
    raise CorruptCheckpointError(f"{where}: {kind} field {key!r} is not a plain name")


def parse_document(data: bytes, kind: str, where: str) -> dict:
    """``data`` (read from ``where``) as a version-1 ckptstore ``kind`` document, a JSON
    object holding ``"ckptstore_<kind>": 1`` (a lease, a fence: ``engine.fence``), else
    ``CorruptCheckpointError``. The caller has capped ``data``'s size."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CorruptCheckpointError(f"{where}: not a {kind} document (not JSON)") from None
    if not isinstance(doc, dict) or doc.get(f"ckptstore_{kind}") != 1:
        raise CorruptCheckpointError(f"{where}: not a version-1 ckptstore {kind}")
    return doc


def parse_holder(doc: dict, kind: str, where: str) -> tuple[str, int, str, float]:
    """The ``host``, ``pid``, ``node`` and ``time`` of the process a ``kind`` document
    (``parse_document``) names, each checked, else ``CorruptCheckpointError``."""
    pid, stamp = doc.get("pid"), doc.get("time")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < 1 << 32:
        raise CorruptCheckpointError(f"{where}: {kind} field 'pid' is not a process id")
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not 0 <= stamp < 1e11:
        raise CorruptCheckpointError(f"{where}: {kind} field 'time' is not a time")
    host, node = _word(doc, "host", where, kind), _word(doc, "node", where, kind)
    return host, pid, node, float(stamp)


def parse_lease(data: bytes, where: str) -> LeaseInfo:
    """The lease in ``data`` (read from ``where``), or ``CorruptCheckpointError``."""
    if len(data) > MAX_LEASE_BYTES:
        raise CorruptCheckpointError(
            f"{where}: a lease of {len(data)} bytes (at most {MAX_LEASE_BYTES}): not ckptstore's"
        )
    doc = parse_document(data, "lease", where)
    host, pid, node, stamp = parse_holder(doc, "lease", where)
    attempt = _word(doc, "attempt", where, empty=True)
    if attempt and not re.match(r"^[0-9a-f]{1,64}$", attempt):
        raise CorruptCheckpointError(f"{where}: lease field 'attempt' is not an attempt id")
    return LeaseInfo(
        _word(doc, "run", where), host, pid, node, _word(doc, "token", where), stamp, attempt
    )


def lease_name(attempt: str) -> str:
    """The step lease of save attempt ``attempt``: ``ckptstore.lease.<attempt>.json``."""
    return f"ckptstore.lease.{attempt}.json"


def is_lease_name(name: str) -> bool:
    """True for a step lease's name (relative to its step directory)."""
    return _LEASE.match(name) is not None


def read_lease(store: Store, name: str) -> LeaseInfo | None:
    """The lease ``name`` of ``store``; None if it is missing or not a valid lease (a
    damaged one is logged: it protects nothing)."""
    try:
        data = get_capped(store, name, MAX_LEASE_BYTES, advice="")
        return parse_lease(data, store.describe(name))
    except StoreNotFoundError:
        return None
    except CorruptCheckpointError as exc:
        log.warning("%s; it is ignored (protects nothing)", exc)
        return None


def live_leases(
    store: Store, names: Iterable[str], now: float | None = None, exclude: Iterable[str] = ()
) -> list[LeaseInfo]:
    """The fresh step leases among ``names`` (a listing of step directory ``store``),
    leaving out those named in ``exclude`` (a commit's own)."""
    skip = set(exclude)
    out = []
    for name in names:
        if name in skip or not is_lease_name(name):
            continue
        info = read_lease(store, name)
        if info is not None and info.fresh(now) and not holder_is_dead(info):
            out.append(info)
    return out


_NODE: str | None = None


def node_id() -> str:
    """This machine's boot id and pid namespace: two processes with the same node id see
    the same process ids (a host name alone does not say so across containers)."""
    global _NODE
    if _NODE is None:
        parts = []
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                parts.append(f.read().strip())
            parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
        except OSError:
            parts = [f"nodeid-{uuid.uuid4().hex}"]  # unknown: never equal to another's
        _NODE = ":".join(parts)
    return _NODE


def holder_is_dead(info: LeaseInfo) -> bool:
    """True when ``info``'s holder process is known to be gone: it ran on this machine
    (same boot and pid namespace) and its pid is not alive. Its lease then protects
    nothing at once, without waiting ``STALE_AFTER_S`` (a job killed and restarted)."""
    return process_is_gone(info.node, info.pid)


def process_is_gone(node: str, pid: int) -> bool:
    """True when process ``pid`` of node ``node`` (``node_id()`` where it ran) is known
    to be gone: it ran on this machine and no process has its pid. A reused pid, another
    machine's process or this process itself is never taken for gone."""
    if node != node_id() or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def this_host() -> str:
    """This machine's host name, as leases record it (printable, bounded)."""
    host = re.sub(r"[^\x21-\x7e]", "?", socket.gethostname() or "unknown")[:200]
    return host or "unknown"


class Heartbeat:
    """Keeps the lease ``name`` of ``store`` fresh from a background thread until ``stop``.

    ``start`` writes it once (raising if it cannot) and starts the thread, which rewrites
    it every ``interval`` seconds; a failed refresh is logged and retried at the next
    beat. With ``guard_run`` (the root owner) each beat first reads the lease, and one
    that names another run (it took a stale lease over) ends this holder's claim:
    ``ensure_fresh`` raises from then on. ``stop`` deletes the lease (if still ours).

    Staleness bound (the contract every reader and holder keeps): the holder rewrites its
    lease every ``HEARTBEAT_S`` (5 s) from a background thread; a reader takes a lease whose
    recorded time is more than ``STALE_AFTER_S`` (60 s) away from its own clock (either way)
    for a dead holder's. So the clocks of writers and of whoever runs gc must agree within
    ``STALE_AFTER_S - HEARTBEAT_S`` (NTP keeps them within milliseconds). A holder that could
    not refresh its lease for ``SAFE_S`` (``STALE_AFTER_S - 2 * HEARTBEAT_S``) stops vouching
    for it: ``Heartbeat.ensure_fresh`` raises (the root owner's is checked before each
    save). A step lease only spares a live save's files from deletion; what keeps a marker
    true however long a writer is stopped is the commit's fence (``engine.fence``), never
    a clock.

    A lease whose holder ran on this machine (same boot id and pid namespace) and whose
    process is gone protects nothing at once (``holder_is_dead``: a job killed and started
    again need not wait for the bound). A lease that cannot be parsed (not one of ours, or
    damaged) counts as stale: a live holder never writes one.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        run: str,
        *,
        attempt: str = "",
        guard_run: bool = False,
        interval: float = HEARTBEAT_S,
    ) -> None:
        self.store = store
        self.name = name
        self.guard_run = guard_run
        self.interval = interval
        self.info = LeaseInfo(
            check_run_id(run), this_host(), os.getpid(), node_id(), uuid.uuid4().hex, 0.0, attempt
        )
        self.lost: LeaseInfo | None = None  # the other run that took it over
        self._last_ok = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def document(self) -> bytes:
        """The lease as of now (the bytes each beat writes)."""
        return dataclasses.replace(self.info, time=time.time()).to_bytes()

    def _put(self) -> None:
        self.store.put(self.name, self.document())
        self._last_ok = time.monotonic()

    def start(self) -> Heartbeat:
        """Write the lease now and keep it fresh in the background; returns ``self``."""
        self._put()
        self._thread = threading.Thread(
            target=self._loop, name=f"ckptstore-lease-{self.name}", daemon=True
        )
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.guard_run:
                    other = read_lease(self.store, self.name)
                    if other is not None and other.run != self.info.run:
                        self.lost = other
                        log.error(
                            "%s was taken over by %s; this job no longer owns it",
                            self.store.describe(self.name),
                            other.describe(),
                        )
                        return
                self._put()
            except CkptStoreError as exc:
                log.warning("could not refresh %s: %s", self.store.describe(self.name), exc)
            except Exception as exc:  # noqa: BLE001 - a heartbeat thread must not die
                log.warning("could not refresh %s: %r", self.store.describe(self.name), exc)

    def ensure_fresh(self) -> None:
        """Raise ``InUseError`` unless this holder still vouches for its lease: taken over
        by another run, or not refreshed for ``SAFE_S`` (gc may take it for stale)."""
        where = self.store.describe(self.name)
        if self.lost is not None:
            raise InUseError(f"{where} was taken over by {self.lost.describe()}")
        since = time.monotonic() - self._last_ok
        if since > SAFE_S:
            raise InUseError(
                f"{where} could not be refreshed for {since:.0f} s (more than {SAFE_S:.0f} s): "
                f"after {STALE_AFTER_S:.0f} s gc and other jobs take it for a dead writer's, "
                "so it no longer protects this save's files"
            )

    def stop(self, delete: bool = True) -> None:
        """Stop refreshing; with ``delete`` remove the lease if it is still this holder's.
        Idempotent; never raises (a lease left behind goes stale). A forked child (a data
        loader's worker) never touches its parent's lease."""
        if os.getpid() != self.info.pid:
            return
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if not delete or self.lost is not None:
            return
        try:
            if self.guard_run:
                current = read_lease(self.store, self.name)
                if current is None or current.token != self.info.token:
                    return
            self.store.delete(self.name)
        except Exception as exc:  # noqa: BLE001 - best effort: a stale lease protects nothing
            log.warning("could not remove %s: %s", self.store.describe(self.name), exc)


def hold_step_lease(store: Store, attempt: str, run: str) -> Heartbeat | None:
    """Start the step lease of save attempt ``attempt`` in step directory ``store``; None
    (logged) when it cannot be written: the save's own writes meet the same store and
    fail with their own error, and its commit still checks every file it vouches for."""
    lease = Heartbeat(store, lease_name(attempt), run, attempt=attempt)
    try:
        return lease.start()
    except Exception as exc:  # noqa: BLE001 - the save's own writes report the store
        log.warning("%s: writing without a lease (%s)", store.url, exc)
        return None
