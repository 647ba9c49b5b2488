"""What every benchmark shares: the state it saves, the order, the summary, RSS and the report.

    state = make_state(rank, cfg)                    # cfg: a StateShape (size, world, tensors)
    for r in range(cfg.repeats): order = rotated(names, r)   # repeat r starts with name r mod n
    reset_peak(); ...; peak_rss_mib()                # this process's peak RSS around an operation
    with TreeMemory() as tree: ...                   # ... and with its child processes (sampled)
    record(scn, kind, metric, contender, samples)    # median, min, max, GB/s of one contender
    markdown_table(["contender", "median s"], "lr", [["ckptstore", cell(1.234)]])
    machine = machine_facts(); machine["loadavg_before"] = load_average()
    print(machine_line(machine)); write_results("local", result)   # results/<name>-<time>.json

Run the benchmarks as modules from the repository root (``python -m benchmarks.<area>.<name>``):
no module edits ``sys.path``. RSS is Linux's: ``reset_peak`` writes "5" to
``/proc/self/clear_refs`` so that ``VmHWM`` restarts at the current RSS; where the kernel
refuses, the peak is the process's lifetime peak (``peak_is_reset()`` says which).
``TreeMemory`` samples the process and its live descendants (a writer process) together.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "rank_env",
    "FIGURES_DIR",
    "MiB",
    "REPO_ROOT",
    "RESULTS_DIR",
    "StateShape",
    "TreeMemory",
    "add_state_args",
    "cell",
    "command_line",
    "current_rss_mib",
    "exit_on_sigterm",
    "fsync_path",
    "load_average",
    "machine_busy_s",
    "machine_facts",
    "machine_line",
    "machine_load",
    "make_state",
    "markdown_table",
    "mem_gib",
    "peak_is_reset",
    "peak_rss_mib",
    "record",
    "reset_peak",
    "rotated",
    "write_results",
]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
RESULTS_DIR = os.path.join(HERE, "results")
FIGURES_DIR = os.path.join(HERE, "figures")
MiB = 1024 * 1024
T = TypeVar("T")


# -- the state and the order ---------------------------------------------------------------
@dataclass(frozen=True)
class StateShape:
    """``size_mib`` of float32 over ``world`` ranks, ``tensors_per_rank`` tensors each."""

    size_mib: int = 1024
    world: int = 2
    repeats: int = 3
    tensors_per_rank: int = 8

    @property
    def tensor_numel(self) -> int:
        per_tensor = self.size_mib * MiB // (self.world * self.tensors_per_rank)
        return max(1024, per_tensor // 4 // 1024 * 1024)

    @property
    def state_bytes(self) -> int:
        return self.tensor_numel * 4 * self.tensors_per_rank * self.world


def add_state_args(p: argparse.ArgumentParser, size_mib: int, repeats: int) -> None:
    """The ``StateShape`` flags: --size-mib, --world, --repeats, --tensors-per-rank (the
    defaults named in the help; ``None`` on the command line means "the default")."""
    p.add_argument("--size-mib", type=int, default=None, help=f"total state (default {size_mib})")
    p.add_argument("--world", type=int, default=2, help="gloo ranks (default 2)")
    p.add_argument(
        "--repeats", type=int, default=None, help=f"repeats; median reported ({repeats})"
    )
    p.add_argument("--tensors-per-rank", type=int, default=8)


def make_state(rank: int, cfg: StateShape, numel: int | None = None) -> dict[str, Any]:
    """This rank's share: ``rank<r>.t<i>`` float32 tensors, seeded by the rank."""
    import torch

    numel = numel or cfg.tensor_numel
    g = torch.Generator().manual_seed(1234 + rank)
    return {
        f"rank{rank}.t{i}": torch.randn(numel // 1024, 1024, generator=g)
        for i in range(cfg.tensors_per_rank)
    }


def rotated(names: Sequence[T], i: int) -> tuple[T, ...]:
    """``names`` starting at ``i mod len(names)``: repeat i's order, so that every contender
    goes first as often and the machine's drift falls on all of them alike."""
    k = i % len(names)
    return (*names[k:], *names[:k])


def record(scn: str, kind: str, metric: str, contender: str, samples: list[float], **kw: Any):
    """One (metric, contender) of one scenario: samples, median, min, max, GB/s; the other
    keywords (``bytes``, ``dest``, ``world``, ``peak_rss_mib``) or ``extra``."""
    nbytes = kw.pop("bytes", 0)
    med = statistics.median(samples)
    return {
        "scenario": scn,
        "kind": kind,
        "metric": metric,
        "contender": contender,
        "dest": kw.pop("dest", "volume"),
        "world": kw.pop("world", 1),
        "bytes": nbytes,
        "samples_s": samples,
        "median_s": med,
        "min_s": min(samples),
        "max_s": max(samples),
        "gb_per_s": nbytes / 1e9 / med if nbytes and med > 0 else None,
        "peak_rss_mib": kw.pop("peak_rss_mib", None),
        "extra": kw,
    }


def fsync_path(path: str, flags: int = os.O_RDONLY) -> None:
    """fsync a file or a directory by its path."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- peak resident memory ------------------------------------------------------------------
_RESET_OK: bool | None = None


def machine_busy_s() -> float:
    """CPU seconds all cores of the machine have been busy since boot (``/proc/stat``).

    Busy is user + nice + system + irq + softirq; idle, iowait and the hypervisor's steal
    are not. Over a save, the difference says how much CPU the whole machine (every rank,
    writer process, kernel copy) spent on it: ``busy / wall`` near ``nproc`` means the
    save is bound by the cores, and ``busy / nproc`` is the least wall time it could take.
    """
    with open("/proc/stat") as f:
        t = [int(x) for x in f.readline().split()[1:]]
    return (t[0] + t[1] + t[2] + t[5] + t[6]) / os.sysconf("SC_CLK_TCK")


def reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS; False where the kernel refuses."""
    global _RESET_OK
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _RESET_OK = True
    except OSError:
        _RESET_OK = False
    return _RESET_OK


def peak_is_reset() -> bool:
    return bool(_RESET_OK)


def _status_mib(field: str) -> float | None:
    kib = _proc_kib("/proc/self/status", field)
    return None if kib is None else kib / 1024


def _proc_kib(path: str, field: str) -> int | None:
    """A ``<field>: <n> kB`` line of a /proc file, in KiB; None where it is not there."""
    try:
        with open(path) as f:
            m = re.search(rf"^{field}:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def current_rss_mib() -> float:
    """This process's resident memory now (``VmRSS``), MiB; 0.0 where it is unknown."""
    return _status_mib("VmRSS") or 0.0


def peak_rss_mib() -> float:
    """Peak RSS in MiB since the last ``reset_peak()`` (else since the process started)."""
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class TreeMemory:
    """The peak resident memory of this process plus its live descendants (a writer
    process, a multiprocessing helper), sampled every ``interval`` s by a thread, as RSS and
    as PSS. RSS counts a page each process maps in full (a shared-memory arena mapped by a
    rank and its writer counts twice); PSS (``/proc/<pid>/smaps_rollup``) splits each
    shared page among the processes that map it (libraries shared with other ranks too).
    Read from /proc by hand: psutil is not a dependency, and these are two files a process.
    Sampling misses spikes shorter than ``interval``; the rank's own ``VmHWM`` does not.

        with TreeMemory() as tree:
            ...                                     # children started here are counted
        tree.peak_rss_mib, tree.peak_pss_mib        # 0.0 where /proc cannot tell
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak_rss_mib = 0.0
        self.peak_pss_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)

    def __enter__(self) -> TreeMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """Add the tree's memory now to the peaks."""
        rss = pss = 0.0
        for pid in _tree(os.getpid()):
            rss += (_proc_kib(f"/proc/{pid}/status", "VmRSS") or 0) / 1024
            pss += (_proc_kib(f"/proc/{pid}/smaps_rollup", "Pss") or 0) / 1024
        self.peak_rss_mib = max(self.peak_rss_mib, rss)
        self.peak_pss_mib = max(self.peak_pss_mib, pss)


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (``/proc/<pid>/task/<tid>/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:  # it exited
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                continue
    return out


# -- the report ----------------------------------------------------------------------------
def cell(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    """``value`` formatted for a table cell, or "—" where there is none."""
    return "—" if value is None else f"{value:{fmt}}{suffix}"


def markdown_table(header: Sequence[str], align: str, rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table; ``align`` has a letter a column: "l" (text) or "r" (numbers)."""
    rule = ["---:" if a == "r" else "---" for a in align]
    return "\n".join("| " + " | ".join(r) + " |" for r in [header, rule, *rows])


def mem_gib() -> float:
    """This machine's memory (MemTotal), in GiB to one decimal."""
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return round(mem_kib / 1024**2, 1)


def load_average() -> list[float]:
    """The 1/5/15-minute load averages, to two decimals."""
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def machine_facts(df_path: str = "", modules: Sequence[str] = ()) -> dict[str, Any]:
    """Cores, CPU, memory, Python, torch, platform; ``df -hT df_path`` and each of
    ``modules``' version (None where it is not installed) where asked."""
    import torch

    facts: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "mem_gib": mem_gib(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    if df_path:
        try:
            df = subprocess.run(
                ["df", "-hT", df_path], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            df = ""
        facts["df"] = df
    for mod in modules:
        try:
            facts[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            facts[mod] = None
    return facts


def machine_load(before: list[float]) -> dict[str, Any]:
    """Cores, memory and the load average ``before`` the run (``load_average()``) and now:
    what ``machine_line`` prints."""
    return {
        "nproc": os.cpu_count(),
        "mem_gib": mem_gib(),
        "loadavg_before": before,
        "loadavg_after": load_average(),
    }


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"machine: {m['nproc']} cores, {m['mem_gib']} GiB; load average (1/5/15 min) "
        f"before {m['loadavg_before']}, after {m['loadavg_after']}"
    )


def command_line() -> str:
    """How this process was started, for the results: ``python -m <module> <args>``."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is not None and spec.name:
        name = spec.name.removesuffix(".__main__")
        return " ".join(["python", "-m", name, *sys.argv[1:]])
    return " ".join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def rank_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """This process's environment plus what torchrun gives rank ``rank`` of ``world`` on one
    machine (loopback rendezvous on ``port``), this checkout first on ``PYTHONPATH``, one
    OpenMP thread, and ``extra``."""
    return dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
        PYTHONPATH=REPO_ROOT,
        OMP_NUM_THREADS="1",
        **extra,
    )


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit`` so that ``finally:`` blocks stop servers and links."""

    def _raise(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)


def write_results(name: str, result: dict[str, Any]) -> str:
    """Write ``result`` as ``RESULTS_DIR/<name>-<timestamp>.json``; the file's path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    out = os.path.join(RESULTS_DIR, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    return out
