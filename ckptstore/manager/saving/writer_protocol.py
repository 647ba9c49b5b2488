"""What travels between a ``CheckpointManager`` and its writer process, in this order.

Each message is an 8-byte length then a pickle, over a Unix socket pair (fds ride on the
length, with SCM_RIGHTS)::

    manager -> writer  (sys.path, WriterSettings)  once, at start (the path first: a root
                                                   Store of the user's must unpickle)
    writer -> manager  Outcome(step=-1)            ready (joined its group), or why not
    manager -> writer  SaveJob [+ arena fd]        a save; the fd when the arena is new
    writer -> manager  Fetch(step, round, last)    a state in rounds, any number of times:
    manager -> writer  Fetched(round, ...)         ``round`` staged over the written one
    writer -> manager  Outcome(step)               committed, or the error (pickled + text)
    manager -> writer  None                        exit

The writers meet through rank 0's TCPStore (``Rendezvous``): their gloo group under
``<prefix>/gen<g>/pg/``, and ``<prefix>/gen<g>/broken`` where a rank says its writer died.
"""

from __future__ import annotations

import pickle
import socket
import struct
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ckptstore.engine.store import Store
from ckptstore.errors import CkptStoreError, ConfigError
from ckptstore.manager.options import SaveOptions
from ckptstore.manager.saving.shared_arena import StagedState

__all__ = [
    "Fetch",
    "Fetched",
    "Outcome",
    "Rendezvous",
    "SaveJob",
    "WriterSettings",
    "connect",
    "failure",
    "rebuild_error",
    "recv",
    "send",
]

PG_TIMEOUT = timedelta(minutes=30)  # the writers' gloo group (a peer's upload may be slow)


@dataclass(frozen=True)
class Rendezvous:
    """Where the writers of all ranks meet: the TCPStore rank 0 hosts, and a key prefix."""

    host: str
    port: int
    prefix: str  # unique per manager; writer generation g meets under <prefix>/gen<g>/


@dataclass(frozen=True)
class WriterSettings:
    """Everything a writer process needs, sent once when it starts."""

    root: str | Store
    options: SaveOptions
    rank: int = 0
    world_size: int = 1
    rendezvous: Rendezvous | None = None
    generation: int = 0
    parent_pid: int = 0
    sys_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class SaveJob:
    """One save for a writer: the step, its state staged in the arena, manifest timings.

    ``timings`` go into the manifest's ``extra["timings"]``; ``overwrite`` replaces a
    committed step found damaged; ``local`` saves it to the local tier alone.
    """

    step: int
    staged: StagedState
    timings: dict[str, float]
    overwrite: bool = False  # replace a committed step found damaged
    local: bool = False  # the local tier alone (``save_step``'s ``local``)


@dataclass(frozen=True)
class Fetch:
    """A writer's request during a save: stage ``round`` (None: no round) over the round it
    has written; ``last`` says it needs no round after this one."""

    step: int
    round: int | None
    last: bool


@dataclass(frozen=True)
class Fetched:
    """The manager's answer to a ``Fetch``: the round is in the arena (``error`` empty), and
    for the ``last`` one the seconds training waited for it (the manifest's
    ``blocking_s`` includes them)."""

    round: int | None
    waited_s: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class Outcome:
    """A writer's answer: ready (step -1) or a save's result."""

    step: int
    error: bytes | None = None  # the pickled exception (None: success)
    error_text: str = ""  # "Type: message", should the exception not unpickle
    traceback: str = ""
    write_s: float = 0.0
    arenas_mapped: int = 0  # arenas this writer has mapped so far
    warnings: tuple[str, ...] = ()  # a committed save's post-commit problems


# -- framing: an 8-byte length, then a pickle; fds ride on the length ------------------------
def send(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    """Send ``obj`` as one message, ``fds`` (if any) riding on its length with SCM_RIGHTS."""
    data = pickle.dumps(obj, protocol=5)
    header = struct.pack("!Q", len(data))
    if fds:
        sent = socket.send_fds(sock, [header], fds)
        sock.sendall(header[sent:])
    else:
        sock.sendall(header)
    sock.sendall(data)


def recv(sock: socket.socket) -> tuple[Any, list[int]]:
    """One message: the unpickled object and the fds that came with it (at most 4).

    Only for a socket whose peer is this manager's own process (its pickle is trusted).

    Raises:
        EOFError: the peer closed the socket before or during the message.
    """
    header, fds, _, _ = socket.recv_fds(sock, 8, 4)
    while header and len(header) < 8:
        more = sock.recv(8 - len(header))
        if not more:
            break
        header += more
    if len(header) < 8:
        raise EOFError("the peer closed the socket")
    (n,) = struct.unpack("!Q", header)
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the peer closed the socket mid-message")
        got += k
    return pickle.loads(buf), list(fds)


def connect(rendezvous: Rendezvous, rank: int) -> Any:
    """A client of the rendezvous store; ConfigError naming the fix if it is unreachable."""
    try:
        return dist.TCPStore(
            rendezvous.host, rendezvous.port, is_master=False, timeout=timedelta(seconds=60)
        )
    except (RuntimeError, OSError) as exc:
        raise ConfigError(
            f"rank {rank} cannot reach the checkpoint writers' rendezvous store at "
            f"{rendezvous.host}:{rendezvous.port} (hosted by rank 0): {exc}. Set MASTER_ADDR "
            "to an address of rank 0 that every node can reach, or use background='thread'"
        ) from exc


def failure(step: int, exc: BaseException, write_s: float, mapped: int) -> Outcome:
    """The Outcome that carries ``exc`` (as a CkptStoreError if it does not pickle)."""
    try:
        blob: bytes | None = pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an exception that does not pickle
        blob = None
    return Outcome(
        step,
        error=blob if blob is not None else pickle.dumps(CkptStoreError(str(exc))),
        error_text=f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(exc)),
        write_s=write_s,
        arenas_mapped=mapped,
    )


def rebuild_error(outcome: Outcome) -> BaseException:
    """The writer's exception again, with its traceback there as a note."""
    exc: BaseException
    try:
        exc = pickle.loads(outcome.error) if outcome.error else CkptStoreError("unknown")
    except Exception:  # noqa: BLE001 - an exception class this process cannot import
        exc = CkptStoreError(outcome.error_text)
    if outcome.traceback and hasattr(exc, "add_note"):
        exc.add_note(f"in the background writer process:\n{outcome.traceback}")
    return exc
