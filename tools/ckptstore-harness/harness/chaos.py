"""Chaos harness: run a torchrun job, SIGKILL its ranks, stop it, restart it resized.

    segments = [
        Segment(2, kills=(Kill("after_shards:2", rank=1), Kill("random")), stop_at_step=20),
        Segment(3, kills=(Kill("mid_upload"),), stop_at_step=34),
        Segment(1),                                   # runs to the end
    ]
    result = run_chaos("train.py", ["--steps", "48", ...], segments, run_dir=d, total_steps=48)

Each segment is one ``torchrun --standalone --nproc-per-node N --max-restarts K`` run
(TorchElastic restarts the worker group after each kill; K is the number of kills, so an
unplanned failure fails the run). Kill i of a segment hits its attempt i (the workers'
``TORCHELASTIC_RESTART_COUNT``):

- ``Kill("random")``: once that attempt has trained a step, the harness waits a random
  0..``random_kill_s`` seconds (drawn from ``seed``) and SIGKILLs one worker's PID, whatever
  it is doing: a training step, a save's staging copy, a background upload or commit.
- ``Kill("<point>[:N]")``: the named crash point of ``ckptstore.engine.crashpoints``
  (``after_shards`` while a save is staged locally, ``mid_upload``, ``before_marker``,
  ``after_marker``) kills the worker from inside that phase, on its Nth visit.

A segment with ``stop_at_step`` is stopped like a scheduler preempts a job: SIGTERM to
torchrun once rank 0 has logged that step; torchrun forwards it, the workers'
``CheckpointManager(handle_sigterm=True)`` take a final checkpoint and exit. The next
segment may use another number of processes.

The training script cooperates through the environment (``ENV_PLAN``: the crash point of
each attempt, ``ENV_SEGMENT``, ``ENV_LOG``) and its run log there: it arms its attempt's
crash point first and logs ``start`` (with its pid), ``step`` and ``preempted`` events
(``examples/resilience/eventlog.py`` is that half: the worker imports nothing from here).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptstore.errors import CkptStoreError
from harness import checkout_root

__all__ = [
    "Kill",
    "Segment",
    "KillRecord",
    "SegmentRecord",
    "ChaosResult",
    "ChaosError",
    "run_chaos",
    "torchrun_command",
]

# The workers' half of these names: examples/resilience/eventlog.py (a test checks they agree).
ENV_PLAN = "CKPTSTORE_CHAOS_PLAN"
ENV_SEGMENT = "CKPTSTORE_CHAOS_SEGMENT"
ENV_LOG = "CKPTSTORE_CHAOS_LOG"
COORDINATOR_POINTS = ("before_marker", "after_marker")  # reached on rank 0 only
POINTS = ("after_shards", "mid_upload", *COORDINATOR_POINTS)


class ChaosError(CkptStoreError, RuntimeError):
    """The job failed in a way the plan did not ask for, or hung; the message has its log."""


@dataclass(frozen=True)
class Kill:
    """One failure: ``"random"`` (SIGKILL at a random time) or a crash point spec."""

    at: str = "random"
    rank: int | None = None  # None: a random rank (rank 0 for commit crash points)

    def __post_init__(self) -> None:
        point, _, nth = self.at.partition(":")
        if self.at != "random" and (point not in POINTS or (nth and not nth.isdigit())):
            raise ValueError(f"Kill.at must be 'random' or one of {POINTS}[:N]; got {self.at!r}")


@dataclass(frozen=True)
class Segment:
    """One torchrun run on ``nproc`` processes; see the module docstring."""

    nproc: int
    kills: tuple[Kill, ...] = ()
    stop_at_step: int | None = None


@dataclass
class KillRecord:
    segment: int
    restart: int  # the attempt that was killed
    at: str  # "random" or the crash point
    rank: int
    pid: int | None = None
    t: float | None = None  # when the harness sent SIGKILL (None: a crash point fired)
    step: int | None = None  # rank 0's last logged step when the harness killed


@dataclass
class SegmentRecord:
    nproc: int
    launched: float
    exited: float = 0.0
    returncode: int | None = None
    stopped: float | None = None  # when SIGTERM was sent
    output: str = ""  # torchrun's stdout + stderr file


@dataclass
class ChaosResult:
    run_dir: str
    log_dir: str
    segments: list[SegmentRecord] = field(default_factory=list)
    kills: list[KillRecord] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return self.segments[-1].exited - self.segments[0].launched if self.segments else 0.0

    def save(self) -> str:
        """Write ``chaos.json`` in the run directory (what :meth:`load` reads back)."""
        path = os.path.join(self.run_dir, "chaos.json")
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)
        return path

    @classmethod
    def load(cls, run_dir: str) -> ChaosResult:
        with open(os.path.join(run_dir, "chaos.json")) as f:
            doc = json.load(f)
        return cls(
            doc["run_dir"],
            doc["log_dir"],
            [SegmentRecord(**s) for s in doc["segments"]],
            [KillRecord(**k) for k in doc["kills"]],
        )


def torchrun_command(
    script: str, args: Sequence[str], nproc: int, max_restarts: int, python: str = sys.executable
) -> list[str]:
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(max_restarts),
        script,
        *args,
    ]


def _events(log_dir: str, segment: int, restart: int, rank: int = 0) -> list[dict[str, Any]]:
    path = os.path.join(log_dir, f"s{segment:02d}-a{restart:02d}-r{rank:02d}.jsonl")
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    except FileNotFoundError:
        pass
    return out


def _last_step(events: list[dict[str, Any]]) -> int | None:
    steps = [e["step"] for e in events if e["ev"] == "step"]
    return steps[-1] if steps else None


def _tail(path: str, lines: int = 60) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class _Run:
    """One segment's torchrun process and its attempts' logs, polled until a condition holds."""

    def __init__(
        self, proc: subprocess.Popen[bytes], output: str, log_dir: str, seg: int, deadline: float
    ) -> None:
        self.proc, self.output, self.deadline = proc, output, deadline
        self.log_dir, self.seg = log_dir, seg

    def events(self, attempt: int, rank: int = 0) -> list[dict[str, Any]]:
        return _events(self.log_dir, self.seg, attempt, rank)

    def last_step(self, attempt: int) -> int | None:
        return _last_step(self.events(attempt))

    def until(self, what: str, cond: Callable[[], bool], poll: float = 0.02) -> bool:
        """Wait for ``cond``; False if torchrun exited first. Raises ChaosError on timeout."""
        while not cond():
            if self.proc.poll() is not None:
                return cond()
            if time.monotonic() > self.deadline:
                raise ChaosError(
                    f"timed out waiting for {what}; torchrun said:\n{_tail(self.output)}"
                )
            time.sleep(poll)
        return True

    def kill_all(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def attempt(
        self, att: int, kill: Kill, rank: int, rng: random.Random, kill_s: float, horizon: int
    ) -> KillRecord:
        """Let attempt ``att`` train, kill it as planned, wait for the next attempt.

        A random kill fires after 0..``kill_s`` seconds of training, or as rank 0 reaches
        step ``horizon - 1``, whichever comes first, so it always lands in the attempt."""
        kr = KillRecord(self.seg, att, kill.at, rank)
        if not self.until(f"attempt {att} to train", lambda: self.last_step(att) is not None):
            raise ChaosError(f"attempt {att} ended before its kill ({kill.at}):\n" + self.tail())
        if kill.at == "random":
            fire = time.monotonic() + rng.uniform(0.0, kill_s)
            self.until(
                "the random kill time",
                lambda: time.monotonic() >= fire or (self.last_step(att) or 0) >= horizon - 1,
                poll=0.005,
            )
            kr.pid = next(int(e["pid"]) for e in self.events(att, rank) if e["ev"] == "start")
            kr.step = self.last_step(att)
            kr.t = time.time()
            os.kill(kr.pid, signal.SIGKILL)
        if not self.until(f"attempt {att + 1} to start", lambda: bool(self.events(att + 1))):
            raise ChaosError(
                f"segment {self.seg} ended instead of restarting after kill {att} "
                f"({kill.at} on rank {rank}):\n" + self.tail()
            )
        return kr

    def tail(self) -> str:
        return _tail(self.output)


def run_chaos(
    script: str,
    args: Sequence[str],
    segments: Sequence[Segment],
    *,
    run_dir: str,
    total_steps: int,
    seed: int = 0,
    random_kill_s: float = 3.0,
    env: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    python: str = sys.executable,
) -> ChaosResult:
    """Run ``segments`` of ``script`` under torchrun with the planned kills and stops.

    ``total_steps`` is the job's last step (a random kill fires before rank 0 reaches it).
    ``env`` is added to the workers' environment; PYTHONPATH gets this checkout's root first.
    Raises ChaosError when a segment fails without being stopped, or exceeds ``timeout_s``.
    """
    rng = random.Random(seed)
    log_dir = os.path.join(run_dir, "log")
    os.makedirs(log_dir, exist_ok=True)
    result = ChaosResult(run_dir, log_dir)
    root = checkout_root()
    deadline = time.monotonic() + timeout_s
    for si, seg in enumerate(segments):
        ranks = [
            k.rank
            if k.rank is not None
            else (0 if k.at.partition(":")[0] in COORDINATOR_POINTS else rng.randrange(seg.nproc))
            for k in seg.kills
        ]
        plan = {
            str(i): {"at": k.at, "rank": r}
            for i, (k, r) in enumerate(zip(seg.kills, ranks))
            if k.at != "random"
        }
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTSTORE_CRASH")}
        child_env.update(env or {})
        child_env.update(
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH")) if p),
            **{ENV_PLAN: json.dumps(plan), ENV_SEGMENT: str(si), ENV_LOG: log_dir},
        )
        output = os.path.join(run_dir, f"torchrun-s{si:02d}.log")
        cmd = torchrun_command(script, args, seg.nproc, len(seg.kills), python)
        record = SegmentRecord(seg.nproc, time.time(), output=output)
        result.segments.append(record)
        with open(output, "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True
            )
        run = _Run(proc, output, log_dir, si, deadline)
        last = len(seg.kills)  # the attempt that survives
        horizon = min(total_steps, seg.stop_at_step or total_steps)  # kill before this step
        try:
            for att, (kill, rank) in enumerate(zip(seg.kills, ranks)):
                result.kills.append(run.attempt(att, kill, rank, rng, random_kill_s, horizon))
            stop = seg.stop_at_step
            if stop is not None:
                run.until(f"step {stop}", lambda: (run.last_step(last) or 0) >= stop)  # noqa: B023
                record.stopped = time.time()
                proc.send_signal(signal.SIGTERM)
            run.until("torchrun to exit", lambda: proc.poll() is not None)  # noqa: B023
        except BaseException:
            run.kill_all()
            raise
        finally:
            record.exited = time.time()
            record.returncode = proc.returncode
        if seg.stop_at_step is not None:
            ends = [e for e in run.events(last) if e["ev"] == "preempted"]
            if not ends or not ends[-1].get("ok"):
                raise ChaosError(
                    f"segment {si} was stopped but took no final checkpoint:\n" + run.tail()
                )
        elif proc.returncode != 0:
            raise ChaosError(f"segment {si} failed (exit {proc.returncode}):\n" + run.tail())
        result.save()
    return result
