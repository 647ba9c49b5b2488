"""The writer process of ``CheckpointManager(background="process")``.

Started by ``ckptstore.writer_process`` as ``python -m ckptstore.writer_main <fd>`` (a fresh
interpreter: never a fork, and the training script's ``__main__`` is not imported again).
Its life, in the order of ``ckptstore.writer_protocol``'s messages::

    settings = recv()            # WriterSettings
    join the writers' gloo group (rendezvous through rank 0's store); answer ready or why not
    loop: job = recv()           # None, or the socket closing: exit
          map the arena if its fd came with the job (once per arena)
          state = job.staged.rebuild(arena)        # the tensors over the shared bytes
          write_step(state, ...)                   # the thread mode's serialise / upload /
                                                   # commit path, on the writers' group
          answer the Outcome (the error, pickled, if it failed)

It ignores SIGINT and SIGTERM (the manager decides when it stops, within its grace
period) and exits within a second of the training process dying.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time

import torch.distributed as dist

from ckptstore.dcp.shared_staging import ArenaView
from ckptstore.engine.commit import collect_warnings
from ckptstore.engine.transfer import TransferEngine
from ckptstore.writer_process import write_step
from ckptstore.writer_protocol import (
    PG_TIMEOUT,
    Outcome,
    SaveJob,
    WriterSettings,
    connect,
    failure,
    recv,
    send,
)

__all__ = ["main"]

log = logging.getLogger(__name__)


def _exit_with(parent_pid: int) -> None:
    """Leave within a second of the training process: nobody would read our answers."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, name="ckptstore-writer-watchdog", daemon=True).start()


def _join_group(s: WriterSettings) -> None:
    assert s.rendezvous is not None
    client = connect(s.rendezvous, s.rank)
    store = dist.PrefixStore(f"{s.rendezvous.prefix}/gen{s.generation}/pg/", client)
    dist.init_process_group(
        "gloo", store=store, rank=s.rank, world_size=s.world_size, timeout=PG_TIMEOUT
    )


def _serve(sock: socket.socket, s: WriterSettings) -> None:
    from ckptstore.stores import open_store

    engine = TransferEngine(s.config)
    root = open_store(s.root, s.storage_options)
    view: ArenaView | None = None
    mapped = 0
    try:
        while True:
            try:
                job, fds = recv(sock)
            except (EOFError, OSError):
                return  # the training process closed the socket (or died)
            if job is None:
                return
            assert isinstance(job, SaveJob)
            if fds:
                view = None
                view = ArenaView(fds[0], job.staged.arena_size, job.staged.arena_id)
                mapped += 1
            t = time.perf_counter()
            try:
                assert view is not None, "no staging arena was sent"
                state = job.staged.rebuild(view)
                with collect_warnings() as notes:
                    write_step(
                        state,
                        root,
                        job.step,
                        staging_dir=s.staging_dir,
                        codec=s.codec,
                        key_layout=s.key_layout,
                        engine=engine,
                        timings=job.timings,
                        overwrite=job.overwrite,
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
            state = None
            send(sock, outcome)
    finally:
        engine.close()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the manager says when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[0]))
    try:
        (sys_path, blob), _ = recv(sock)
    except (EOFError, OSError):
        return 2
    sys.path.extend(p for p in sys_path if p not in sys.path)
    settings = pickle.loads(blob)
    assert isinstance(settings, WriterSettings)
    if os.getppid() != settings.parent_pid:
        return 3
    _exit_with(settings.parent_pid)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"ckptstore-writer[rank {settings.rank}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        if settings.rendezvous is not None:
            _join_group(settings)
    except BaseException as exc:  # noqa: BLE001 - reported to the manager
        send(sock, failure(-1, exc, 0.0, 0))
        return 1
    try:
        send(sock, Outcome(-1))
        _serve(sock, settings)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
