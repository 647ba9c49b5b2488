"""The writer process of ``CheckpointManager(background="process")``.

Started by ``writer_child`` as ``python -m ckptstore.manager.saving.writer_main <fd>
<pid>``: a fresh interpreter (never a fork; the training script's ``__main__`` is not
imported again), ``pid`` the training process's. It runs ``save_step``, the thread
mode's serialise / upload / commit path, on the writers' own gloo group, over each
save's state rebuilt from the shared-memory arena (``main`` lists its life). It ignores
SIGINT and SIGTERM (the manager decides when it stops) and exits within a second of the
training process dying, whenever that happens (``watch_parent``).
"""

from __future__ import annotations

# Only the standard library above the parent-death watch: the heavy imports (torch, gloo,
# the stores) take seconds, and the writer must not outlive its trainer while they run.
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from ckptstore.engine.store import Store
    from ckptstore.engine.transfer import TransferEngine
    from ckptstore.manager.saving.shared_arena import ArenaView
    from ckptstore.manager.saving.writer_protocol import WriterSettings

__all__ = ["main", "watch_parent", "PARENT_POLL_S"]

log = logging.getLogger(__name__)

PARENT_POLL_S = 0.1  # how often the watch thread looks at its parent pid
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _set_parent_death_signal() -> bool:
    """Have Linux SIGKILL this process when the thread that started it ends (the
    training side starts writers from a thread that lives as long as its process:
    ``writer_child.spawn``); False where prctl is not there."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def watch_parent(parent_pid: int) -> None:
    """Exit within a second of the training process ``parent_pid``, at any point of this
    process's life: PR_SET_PDEATHSIG on Linux (the kernel kills us, even inside a long C
    call that holds the GIL), and everywhere a thread that polls our parent pid (it
    changes when the parent dies). Call it first, before any heavy import."""
    _set_parent_death_signal()
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(3)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(3)

    threading.Thread(target=watch, name="ckptstore-writer-watchdog", daemon=True).start()


def _join_group(s: WriterSettings) -> None:
    import torch.distributed as dist

    from ckptstore.manager.saving.writer_protocol import PG_TIMEOUT, connect

    assert s.rendezvous is not None
    client = connect(s.rendezvous, s.rank)
    store = dist.PrefixStore(f"{s.rendezvous.prefix}/gen{s.generation}/pg/", client)
    dist.init_process_group(
        "gloo", store=store, rank=s.rank, world_size=s.world_size, timeout=PG_TIMEOUT
    )


def _fetcher(sock: socket.socket, step: int) -> Callable[[int | None, bool], float]:
    """``Rounds``' fetch over ``sock``: ask the training side to stage a round; wait."""
    from ckptstore.errors import CkptStoreError
    from ckptstore.manager.saving.writer_protocol import Fetch, Fetched, recv, send

    def fetch(round: int | None, last: bool) -> float:
        send(sock, Fetch(step, round, last))
        reply, _ = recv(sock)
        if not isinstance(reply, Fetched) or reply.error or reply.round != round:
            why = reply.error if isinstance(reply, Fetched) else f"the answer {reply!r}"
            raise CkptStoreError(
                f"the training process did not stage round {round} of step {step} for "
                f"its writer ({why}); the step is not committed"
            )
        return reply.waited_s

    return fetch


def _serve(sock: socket.socket, s: WriterSettings, engine: TransferEngine, root: Store) -> None:
    from ckptstore.manager.saving.save_step import save_step
    from ckptstore.manager.saving.shared_arena import ArenaView
    from ckptstore.manager.saving.write_order import Rounds
    from ckptstore.manager.saving.writer_protocol import Outcome, SaveJob, failure, recv, send

    view: ArenaView | None = None
    mapped = 0
    while True:
        try:
            job, fds = recv(sock)
        except (EOFError, OSError):
            return  # the training process closed the socket (or died)
        if job is None:
            return
        assert isinstance(job, SaveJob)
        if fds:
            if view is not None:
                view.close()
            view = None
            view = ArenaView(fds[0], job.staged.arena_size, job.staged.arena_id)
            mapped += 1
        t = time.perf_counter()
        try:
            assert view is not None, "no staging arena was sent"
            refusal: BaseException | None = None
            try:
                state = job.staged.rebuild(view)
            except Exception as exc:  # noqa: BLE001 - failed on every rank by save_step
                state, refusal = {}, exc
            rounds = (
                Rounds(view, _fetcher(sock, job.step))
                if job.staged.rounds > 1 and refusal is None
                else None
            )
            notes = save_step(
                state,
                root,
                job.step,
                s.options,
                engine=engine,
                timings=job.timings,
                overwrite=job.overwrite,
                local=job.local,
                rounds=rounds,
                refusal=refusal,
            )
            outcome = Outcome(
                job.step,
                write_s=time.perf_counter() - t,
                arenas_mapped=mapped,
                warnings=tuple(notes),
            )
        except BaseException as exc:  # noqa: BLE001 - every failure goes to the manager
            log.error("saving step %d failed: %s: %s", job.step, type(exc).__name__, exc)
            outcome = failure(job.step, exc, time.perf_counter() - t, mapped)
        state = rounds = None
        send(sock, outcome)


def main(argv: list[str]) -> int:
    """``argv``: the socket's fd, and the training process's pid (else our parent's).

    Its life, in the order of ``writer_protocol``'s messages::

        watch_parent(pid)          # first, before any heavy import
        settings = recv()          # WriterSettings
        import what a save needs, open the root and the transfer engine, join the
        writers' gloo group (through rank 0's store); answer ready or why not
        loop: job = recv()         # None, or the socket closing: exit
              map the arena if its fd came with the job (once per arena)
              state = job.staged.rebuild(arena)  # tensors over the shared bytes (if that
                                                 # fails, save_step refuses on every rank)
              save_step(state, ...)              # a state in rounds asks for each (Fetch)
              answer the Outcome (the error, pickled, if it failed)
    """
    parent_pid = int(argv[1]) if len(argv) > 1 else os.getppid()
    watch_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the manager says when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import pickle

    import torch.distributed as dist

    from ckptstore.manager.saving.writer_protocol import (
        Outcome,
        WriterSettings,
        failure,
        recv,
        send,
    )

    sock = socket.socket(fileno=int(argv[0]))
    try:
        (sys_path, blob), _ = recv(sock)
    except (EOFError, OSError):
        return 2
    sys.path.extend(p for p in sys_path if p not in sys.path)
    settings = pickle.loads(blob)
    assert isinstance(settings, WriterSettings)
    if settings.parent_pid != parent_pid or os.getppid() != parent_pid:
        return 3
    logging.basicConfig(
        level=logging.WARNING,
        format=f"ckptstore-writer[rank {settings.rank}] %(levelname)s %(name)s: %(message)s",
    )
    engine = None
    try:
        # Everything a save needs is imported and opened before the ready answer: the
        # manager starts this process with itself, and the first save should find it done.
        import ckptstore.manager.saving.save_step  # noqa: F401 - DCP, the writers, the engine
        from ckptstore.engine.transfer import TransferEngine
        from ckptstore.stores import open_store

        engine = TransferEngine(settings.options.writer.transfer)
        root = open_store(settings.root, settings.options.storage_options)
        if settings.rendezvous is not None:
            _join_group(settings)
    except BaseException as exc:  # noqa: BLE001 - reported to the manager
        send(sock, failure(-1, exc, 0.0, 0))
        if engine is not None:
            engine.close()
        return 1
    try:
        send(sock, Outcome(-1))
        _serve(sock, settings, engine, root)
    finally:
        engine.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
