"""Run a function on N real torch.distributed (gloo) processes on this machine.

    def body(rank, world_size, tmp):      # a module-level function (it is pickled)
        ...
        return something_picklable

    results = run_distributed(body, 2, tmp_path)   # [result of rank 0, result of rank 1]

Each process gets MASTER_ADDR=127.0.0.1, a free MASTER_PORT, GLOO_SOCKET_IFNAME=lo and an
initialised default process group. If any rank raises or the run exceeds ``timeout``,
every process is killed and ``DistributedRunError`` carries each rank's traceback.

Ranks are forked from multiprocessing's fork server, which imports torch and DCP once per
test session: a spawned rank spent 5-6 s of CPU importing them, about a quarter of the whole
suite's CPU on a 2-core CI machine. The server is a clean, single-threaded process, so a fork
of it is as safe as a spawn; each rank still gets the caller's current environment and
working directory, as a spawned one would.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

__all__ = ["run_distributed", "free_port", "DistributedRunError"]


class DistributedRunError(RuntimeError):
    """One or more ranks failed (or hung); the message holds their tracebacks."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# What every rank imports anyway; the fork server imports it once.
_PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint"]


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # read when the server starts: the first run only
    return ctx


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: tuple,
    env: dict[str, str],
    cwd: str,
    results: Any,
) -> None:
    # The fork server's environment and directory are those of the session's first run.
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GLOO_SOCKET_IFNAME="lo",
    )
    import torch.distributed as dist

    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
        )
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    daemon: bool = True,
    exits: Collection[int] = (),
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes; their results.

    ``daemon=False`` lets ranks start child processes of their own (DataLoader workers);
    the ranks are still killed here on failure or timeout. Ranks in ``exits`` are meant
    to die (a fault the test injects): one that ends without a result has its exit code
    as its result instead of failing the run.
    """
    ctx = _context()
    results = ctx.Queue()
    rank_env = {**os.environ, **(env or {})}
    port = free_port()
    procs = [
        ctx.Process(
            target=_entry,
            args=(fn, rank, world_size, port, args, rank_env, os.getcwd(), results),
            daemon=daemon,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) + len(errors) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DistributedRunError(
                    f"ranks {sorted(set(range(world_size)) - set(out) - set(errors))} did not "
                    f"finish within {timeout:.0f} s" + _format(errors)
                )
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                for r in exits:
                    if r not in out and r not in errors and procs[r].exitcode is not None:
                        out[r] = procs[r].exitcode
                if _exited(procs, out) and results.empty():
                    time.sleep(0.5)
                    if results.empty():
                        raise DistributedRunError(
                            f"ranks exited without a result: {_exited(procs, out)}"
                            + _format(errors)
                        ) from None
                continue
            (out if ok else errors)[rank] = value
            if errors:
                # Give the other ranks a moment to report, then stop.
                grace = time.monotonic() + 10
                while len(out) + len(errors) < world_size and time.monotonic() < grace:
                    try:
                        rank, ok, value = results.get(timeout=0.5)
                        (out if ok else errors)[rank] = value
                    except queue.Empty:
                        pass
                # A rank killed by a signal (SIGBUS: -7) is often the cause of the others'
                # errors ("connection reset"): name it first.
                killed = _exited(procs, {**out, **errors})
                lead = f"ranks exited without a result: {killed}" if killed else ""
                raise DistributedRunError(lead + _format(errors))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(world_size)]


def _exited(procs: list[Any], reported: dict[int, Any]) -> dict[int, int]:
    """{rank: exit code} of the ranks not in ``reported`` that have exited non-zero."""
    return {
        r: p.exitcode
        for r, p in enumerate(procs)
        if r not in reported and p.exitcode not in (None, 0)
    }


def _format(errors: dict[int, str]) -> str:
    return "".join(f"\n--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
