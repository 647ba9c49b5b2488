"""Simulated nodes: several torchrun agents on this machine, one c10d rendezvous.

    with NodeJob(script, args, run_dir=d, nnodes=2, max_restarts=1) as job:
        job.start()              # one agent per node, node 0 first (it hosts the store)
        job.wait_commit(8)       # every node logged the commit of step 8
        job.kill_worker(1)       # SIGKILL node 1's worker (its agent restarts the group)
        job.replace_node(1)      # or: SIGKILL node 1's agent and workers, wipe its local
                                 # dirs, start a new agent in its place
        job.wait_until("node 1's new worker", lambda: job.joined(1), within=20)
                                 # NodeError (every agent killed) unless node 1's worker
                                 # is in the group within 20 s (the job's deadline stays)
        job.remove_node(1)       # or: SIGKILL it whole and leave it out (an elastic job
                                 # shrinks; nothing waits for it any more)
        job.wait()               # every agent exited; NodeError if one failed
                                 # (leaving the block kills whatever still runs)

Each node is ``torchrun --nnodes N --nproc-per-node P --rdzv-backend ckptstore-c10d
--rdzv-endpoint 127.0.0.1:PORT --rdzv-id ID --max-restarts K`` with torchrun's defaults
otherwise (``rdzv_backend="c10d"``: the stock backend, for the upstream canaries)
(``nnodes`` may be elastic, ``"1:3"``; ``rdzv_conf`` adds ``--rdzv-conf``;
``nproc_per_node`` may name each node's count). Node ``i`` passes the training script its
own node-local directories, ``run_dir/node<i>/tier`` (``--local-tier``) and
``run_dir/node<i>/cache`` (``--cache``), and an event log directory of the node's
incarnation, ``run_dir/log/node<i>.<n>`` (``--events``): each agent counts its own restarts,
so after a replacement two nodes' ``TORCHELASTIC_RESTART_COUNT`` differ and one directory
per incarnation keeps their logs apart; ``node_args(i)`` adds arguments of node ``i``'s
own (its link to the store), and a named ``job`` (a later job on the same nodes, same
``run_dir``) logs under ``log/<job>-node<i>.<n>``. The agent of node 0 hosts the rendezvous
store (it binds the endpoint first), so it is the one node that cannot be replaced, unless
``external_store=True``: then the harness hosts the store, as a job's launcher would, the
agents are its clients (``--rdzv-conf is_host=false``), and any node can be replaced.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptstore.errors import CkptStoreError
from harness import checkout_root
from harness.runlog import Attempt, read_attempts

__all__ = ["Node", "NodeError", "NodeJob", "free_port"]


class NodeError(CkptStoreError, RuntimeError):
    """A node's agent failed, or the job hung; the message has the agents' output."""


#: Set in each node's environment (the agent's, so its workers' and theirs): how
#: ``kill_node`` finds every process of a node, also those the agent's death orphaned.
MARK = "CKPTSTORE_TEST_NODE"


def _marked(mark: str) -> list[int]:
    """Pids of this user's live processes whose environment has ``MARK=mark``."""
    needle = f"{MARK}={mark}\0".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read() + b"\0"
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except OSError:  # gone, or not ours
            continue
        if needle in env and state != b"Z":
            pids.append(int(entry))
    return pids


def _kill_marked(mark: str, within: float = 10.0) -> None:
    """SIGKILL every process marked ``mark`` until none is left (a dying agent may still
    start one) or ``within`` seconds passed."""
    deadline = time.monotonic() + within
    while (pids := _marked(mark)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


#: The launcher's rendezvous store (``NodeJob(external_store=True)``): a TCPStore server
#: on the port in argv[1], until killed.
_STORE_SERVER = (
    "import sys, time, torch.distributed as d\n"
    "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False)\n"
    "while True: time.sleep(3600)\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One simulated node: its local directories and its current agent."""

    index: int
    dir: str
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    started: list[float] = field(default_factory=list)  # time.time() of each agent launch
    exited: float = 0.0  # time.time() the current agent was seen gone (0: not yet)
    job: str = ""  # the job's name: a later job on the same nodes logs apart
    left: bool = False  # taken out of the job for good (remove_node): not waited for
    mark: str = ""  # MARK's value in the environment of every process of this node

    @property
    def _tag(self) -> str:
        return f"{self.job}-" if self.job else ""

    @property
    def local_tier(self) -> str:
        return os.path.join(self.dir, "tier")

    @property
    def cache(self) -> str:
        return os.path.join(self.dir, "cache")

    def output(self, incarnation: int | None = None) -> str:
        n = self.incarnation if incarnation is None else incarnation
        return os.path.join(os.path.dirname(self.dir), f"agent-{self._tag}node{self.index}.{n}.log")

    def events(self, incarnation: int | None = None) -> str:
        n = self.incarnation if incarnation is None else incarnation
        return os.path.join(os.path.dirname(self.dir), "log", f"{self._tag}node{self.index}.{n}")


class NodeJob:
    """``nnodes`` torchrun agents of one job; see the module docstring."""

    def __init__(
        self,
        script: str,
        args: Sequence[str],
        *,
        run_dir: str,
        nnodes: int | str = 2,
        nodes: int | None = None,
        nproc_per_node: int | Sequence[int] = 1,
        max_restarts: int = 1,
        rdzv_conf: str = "",
        rdzv_backend: str = "ckptstore-c10d",
        external_store: bool = False,
        node_args: Callable[[int], Sequence[str]] | None = None,
        env: dict[str, str] | None = None,
        job: str = "",
        timeout_s: float = 120.0,
        python: str = sys.executable,
    ) -> None:
        self.script, self.args, self.run_dir = script, list(args), run_dir
        self.nnodes = str(nnodes)
        count = nodes if nodes is not None else int(self.nnodes.rpartition(":")[2])
        procs = [nproc_per_node] * count if isinstance(nproc_per_node, int) else nproc_per_node
        if len(procs) != count:
            raise ValueError(f"nproc_per_node names {len(procs)} nodes, the job has {count}")
        self.nproc_per_node, self.max_restarts = list(procs), max_restarts
        self.rdzv_backend, self.node_args = rdzv_backend, node_args
        # An external store: the launcher (this harness) hosts the rendezvous store, every
        # agent is a client of it (is_host=false), and node 0 is a node like any other.
        self.external_store = external_store
        self.rdzv_conf = ",".join(
            c for c in (rdzv_conf, "is_host=false" if external_store else "") if c
        )
        self.store_proc: subprocess.Popen[bytes] | None = None
        self.python = python
        self.port = free_port()
        self.rdzv_id = uuid.uuid4().hex[:12]
        self.store_mark = f"{self.rdzv_id}.store"  # MARK of the external store's process
        self.deadline = time.monotonic() + timeout_s
        root = checkout_root()
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.env.update(
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(p for p in (root, self.env.get("PYTHONPATH")) if p),
        )
        self.nodes = [
            Node(i, os.path.join(run_dir, f"node{i}"), job=job, mark=f"{self.rdzv_id}.{i}")
            for i in range(count)
        ]

    def __enter__(self) -> NodeJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()  # whatever is still running: a failed test leaves no agent behind

    # -- launching -------------------------------------------------------------------
    def command(self, node: Node) -> list[str]:
        return [
            self.python, "-m", "torch.distributed.run",
            "--nnodes", self.nnodes,
            "--nproc-per-node", str(self.nproc_per_node[node.index]),
            "--rdzv-backend", self.rdzv_backend,
            "--rdzv-endpoint", f"127.0.0.1:{self.port}",
            "--rdzv-id", self.rdzv_id,
            *(["--rdzv-conf", self.rdzv_conf] if self.rdzv_conf else []),
            "--max-restarts", str(self.max_restarts),
            self.script, *self.args,
            "--local-tier", node.local_tier, "--cache", node.cache, "--events", node.events(),
            *(self.node_args(node.index) if self.node_args else []),
        ]  # fmt: skip

    def start_node(self, i: int) -> Node:
        node = self.nodes[i]
        for d in (node.local_tier, node.cache, node.events()):
            os.makedirs(d, exist_ok=True)
        with open(node.output(), "wb") as out:
            node.proc = subprocess.Popen(
                self.command(node),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, MARK: node.mark},
                start_new_session=True,
            )
        node.started.append(time.time())
        node.exited = 0.0
        return node

    def start(self, count: int | None = None) -> None:
        """Start the first ``count`` nodes (all), node 0 first: it binds the endpoint (with
        ``external_store``, the store this harness starts first does)."""
        if self.external_store:
            self.store_proc = subprocess.Popen(
                [self.python, "-c", _STORE_SERVER, str(self.port)],
                env={**self.env, MARK: self.store_mark},
                start_new_session=True,
            )
            self._until("the rendezvous store", self._store_up)
        for i in range(count if count is not None else len(self.nodes)):
            self.start_node(i)
            if i == 0 and not self.external_store:
                self._until("node 0's rendezvous store", self._store_up)

    def _store_up(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    # -- watching --------------------------------------------------------------------
    def attempts(self, i: int, incarnation: int | None = None) -> list[Attempt]:
        """The attempts node ``i``'s workers logged (this incarnation, or the one named)."""
        d = self.nodes[i].events(incarnation)
        return read_attempts(d) if os.path.isdir(d) else []

    def last_step(self) -> int:
        steps = [
            e["step"]
            for node in self.nodes
            for a in self.attempts(node.index)
            for ranks in a.ranks.values()
            for e in ranks
            if e["ev"] == "step"
        ]
        return max(steps, default=0)

    def _until(self, what: str, cond: Callable[[], bool], poll: float = 0.02) -> None:
        while not cond():
            if time.monotonic() > self.deadline:
                self.kill_all()
                raise NodeError(f"timed out waiting for {what}:\n{self.tails()}")
            dead = [
                n
                for n in self.nodes
                if n.proc is not None and not n.left and n.proc.poll() not in (None, 0)
            ]
            if dead:
                self.kill_all()
                raise NodeError(
                    f"node {dead[0].index}'s agent failed (exit {dead[0].proc.returncode}) "  # type: ignore[union-attr]
                    f"while waiting for {what}:\n{self.tails()}"
                )
            time.sleep(poll)

    def wait_until(self, what: str, cond: Callable[[], bool], within: float | None = None) -> None:
        """Wait until ``cond()`` holds; NodeError (every agent killed) if an agent fails or
        the job's deadline passes first, or ``within`` seconds from now if given (``what``
        names the wait in the message). The job's deadline is left as it was."""
        deadline = self.deadline
        if within is not None:
            self.deadline = min(deadline, time.monotonic() + within)
        try:
            self._until(what, cond)
        finally:
            self.deadline = deadline

    def events(self, ev: str, incarnations: bool = False) -> list[dict[str, Any]]:
        """Every ``ev`` event the current incarnation of each node logged (``incarnations``:
        every incarnation's), each with ``node`` set to its node's index."""
        out = []
        for node in self.nodes:
            for n in range(node.incarnation + 1) if incarnations else [node.incarnation]:
                for a in self.attempts(node.index, n):
                    for evs in a.ranks.values():
                        out += [{**e, "node": node.index} for e in evs if e["ev"] == ev]
        return out

    def wait_commit(self, step: int) -> None:
        """Wait until every node logged the commit of ``step``."""
        self._until(
            f"the commit of step {step} on every node",
            lambda: {
                e["node"] for e in self.events("commit")
                if e["step"] == step and e["status"] == "committed"
            } >= {n.index for n in self.nodes if n.proc is not None and not n.left},
        )  # fmt: skip

    def wait_step(self, step: int) -> None:
        """Wait until some rank of the current incarnations logged ``step``."""
        self._until(f"step {step}", lambda: self.last_step() >= step)

    def joined(self, i: int, world: int | None = None) -> bool:
        """True once a worker of node ``i``'s current incarnation logged ``start``, which
        the training script does once its process group has formed (``world``: a group of
        that many ranks)."""
        return any(
            e["ev"] == "start" and world in (None, e.get("world"))
            for a in self.attempts(i)
            for evs in a.ranks.values()
            for e in evs
        )

    def worker_pid(self, i: int) -> int:
        """The pid of node ``i``'s (first) worker in its latest attempt."""
        attempts = self.attempts(i)
        starts = [
            e for a in attempts[-1:] for r in a.ranks.values() for e in r if e["ev"] == "start"
        ]
        if not starts:
            raise NodeError(f"node {i} has no running worker yet:\n{self.tails()}")
        return int(starts[-1]["pid"])

    # -- failures --------------------------------------------------------------------
    def kill_worker(self, i: int) -> int:
        """SIGKILL node ``i``'s worker (not its agent); returns the pid."""
        pid = self.worker_pid(i)
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_node(self, i: int) -> None:
        """SIGKILL every process of node ``i``: its agent, the workers (torchrun starts each
        in a session of its own) and what they started (writer processes), found by the
        node's mark in their environment, so that none outlives the node, orphans
        included. Returns once they are gone."""
        node = self.nodes[i]
        _kill_marked(node.mark)
        if node.proc is not None:
            node.proc.wait()
            node.exited = node.exited or time.time()

    def replace_node(self, i: int) -> Node:
        """Kill node ``i`` whole, wipe its local directories, start a new agent there."""
        if i == 0 and not self.external_store:
            raise ValueError("node 0 hosts the rendezvous store; replace another node")
        self.kill_node(i)
        node = self.nodes[i]
        shutil.rmtree(node.dir, ignore_errors=True)
        node.incarnation += 1
        return self.start_node(i)

    def remove_node(self, i: int) -> None:
        """Kill node ``i`` whole and take it out of the job for good (an elastic job
        shrinks): its failure is not the job's, and nothing waits for it any more."""
        if i == 0 and not self.external_store:
            raise ValueError("node 0 hosts the rendezvous store; remove another node")
        self.kill_node(i)
        self.nodes[i].left = True

    def kill_all(self) -> None:
        """Kill every node (and the external store); NodeError if a process of the job is
        still there after that."""
        for node in self.nodes:
            self.kill_node(node.index)
        _kill_marked(self.store_mark)
        if self.store_proc is not None:
            self.store_proc.wait()
        marks = [node.mark for node in self.nodes] + [self.store_mark]
        left = [pid for mark in marks for pid in _marked(mark)]
        if left:
            raise NodeError(f"processes of the job outlived kill_all: {sorted(left)}")

    def wait(self) -> None:
        """Wait for every agent to exit; NodeError (after killing the rest) if one failed."""
        self._until("the agents to exit", self._all_exited)

    def _all_exited(self) -> bool:
        now = time.time()
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is not None and not n.exited:
                n.exited = now
        return all(n.proc is None or n.left or n.exited for n in self.nodes)

    # -- logs ------------------------------------------------------------------------
    def tails(self, lines: int = 40) -> str:
        out = []
        for node in self.nodes:
            for n in range(node.incarnation + 1):
                try:
                    with open(node.output(n), errors="replace") as f:
                        text = "".join(f.readlines()[-lines:])
                except OSError:
                    continue
                out.append(f"--- node {node.index}.{n} ---\n{text}")
        return "\n".join(out)
