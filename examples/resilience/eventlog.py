"""What ``train.py`` logs, and the chaos plan it honours: the standard library and torch only.

Every rank appends one JSON line per event (``start``, ``ready``, ``step``, ``save``,
``commit``, then ``end`` or ``preempted``) to ``<log_dir>/s<segment>-a<restart>-r<rank>.jsonl``;
``tools/demo.py`` and the chaos tests read the files back (``harness.runlog``) and prove from
them that every sample was trained once and every restore was a state that was saved.
When ``harness.chaos`` runs the job, the environment says which segment it is, where to log
and which crash point to arm for this attempt; run on its own, nothing is armed. Lives
beside the example (a script's own folder is on ``sys.path``), so the example needs no
test code.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from dataclasses import dataclass
from typing import Any

__all__ = ["ENV_LOG", "ENV_PLAN", "ENV_SEGMENT", "ChaosContext", "RunLog", "chaos_context"]
__all__ += ["tensor_crc"]

#: The environment ``harness.chaos`` gives each worker: a JSON plan {attempt: {"at", "rank"}}
#: of crash points (``ckptstore.engine.crashpoints`` names), the segment, the log directory.
ENV_PLAN = "CKPTSTORE_CHAOS_PLAN"
ENV_SEGMENT = "CKPTSTORE_CHAOS_SEGMENT"
ENV_LOG = "CKPTSTORE_CHAOS_LOG"


@dataclass(frozen=True)
class ChaosContext:
    segment: int
    restart: int
    log_dir: str
    crash: str  # the crash point armed in this process ('' for none)


def chaos_context(log_dir: str | None = None) -> ChaosContext:
    """Call first (before anything saves): segment, restart count, log dir; arms a crash point.

    Under the chaos harness (``CKPTSTORE_CHAOS_PLAN`` set) the crash point planned for this
    attempt replaces any ``CKPTSTORE_CRASH_AT`` inherited from the environment.
    """
    segment = int(os.environ.get(ENV_SEGMENT, "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    crash = ""
    if ENV_PLAN in os.environ:
        os.environ.pop("CKPTSTORE_CRASH_AT", None)
        os.environ.pop("CKPTSTORE_CRASH_RANK", None)
        spec = json.loads(os.environ[ENV_PLAN]).get(str(restart))
        if spec:
            crash = spec["at"]
            os.environ["CKPTSTORE_CRASH_AT"] = crash
            os.environ["CKPTSTORE_CRASH_RANK"] = str(spec["rank"])
    return ChaosContext(segment, restart, log_dir or os.environ.get(ENV_LOG, "log"), crash)


class RunLog:
    """Append-only JSON-lines log of one rank in one attempt.

    Every line is written with one ``os.write`` on an ``O_APPEND`` descriptor, so a SIGKILL
    loses at most the line being written (readers skip a torn last line). Log ``start``
    (with ``pid``) first: the chaos harness finds the process to kill there.
    """

    def __init__(self, log_dir: str, segment: int, restart: int, rank: int) -> None:
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, f"s{segment:02d}-a{restart:02d}-r{rank:02d}.jsonl")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, ev: str, **fields: Any) -> None:
        fields.setdefault("t", time.time())
        line = json.dumps({"ev": ev, **fields}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def tensor_crc(obj: Any) -> str:
    """CRC-32 of every tensor and scalar in a nested state dict, keys in sorted order.

    The job logs it for the state it saves and restores; a checkpoint loaded back in full
    hashes to the same value when it holds exactly that state (``harness.ckptcheck``).
    """
    import torch

    crc = 0

    def walk(o: Any) -> None:
        nonlocal crc
        if isinstance(o, dict):
            for k in sorted(o, key=str):
                walk(k)
                walk(o[k])
            return
        if isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
            return
        if torch.is_tensor(o):
            data = o.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
        else:
            data = repr(o).encode()
        crc = zlib.crc32(data, crc)

    walk(obj)
    return f"{crc:08x}"
