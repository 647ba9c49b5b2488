"""``background="auto"``: the writer process where this node leaves room for it, else the thread.

The process backend takes a save's Python off the training step (the thread backend's
runs beside it, under the GIL), for a writer process per rank: a core to run on while it
saves and ~0.3-0.8 GiB of memory. The rule, from the step-rate benchmark on 2 cores
(benchmarks/README.md, "Background saves: thread vs process"): with 2 cores or more
per rank the process backend cost training less than the thread in every cell measured (1
rank); with 1 core per rank it tied or cost more in 3 of 4 (2 ranks: the writer has no
core of its own). So:

* the process backend when saves are asynchronous (``async_save``; a save that blocks
  training gains nothing from a writer process), the root is a URL (a ``Store`` object
  the caller built lives in this process: its state, hooks and counters would stay here
  while a writer process worked on a copy), this rank's share of the cores the
  process may run on (CPU affinity and a cgroup CPU quota, divided by the ranks on this
  node) is at least ``MIN_CORES`` and its share of the available memory (``MemAvailable``,
  and a cgroup memory limit) at least ``MIN_MEMORY``, on every rank;
* and the state of the first save can go to a writer process (plain dense tensors,
  picklable values: no DTensor / FSDP state), on every rank;
* the thread backend otherwise.

The choice is made once, agreed by all ranks, and kept for the manager's life
(``AutoBackend.name`` and ``reason``; the manager reports it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ckptstore.engine.cores import node_cores
from ckptstore.manager.agreement import Agreement

__all__ = ["MIN_CORES", "MIN_MEMORY", "AutoBackend", "choose", "node_share"]

#: The least share of the cores per rank for the process backend (see the module docstring).
MIN_CORES = 2.0
#: The least available memory per rank for it: the writer's ~0.3-0.8 GiB at most a fifth.
MIN_MEMORY = 4 << 30


def choose(
    cores: float, memory: int, asynchronous: bool = True, url: bool = True
) -> tuple[bool, str]:
    """Whether a rank with ``cores`` cores and ``memory`` bytes available as its share
    leaves room for a writer process, and why (for the report). Saves that are not
    ``asynchronous`` (``async_save=False``) block training anyway: the writer process
    would take nothing off it, so the thread is chosen; so it is for a root that is not a
    ``url`` (a ``Store`` object: see the module docstring)."""
    if not asynchronous:
        return False, "async_save=False: training waits for each save, a writer gains nothing"
    if not url:
        return False, (
            "the root is a Store object of this process, which a writer process would only "
            "copy (pass its URL, or background='process', to save from a writer process)"
        )
    have = f"{cores:.1f} cores and {memory / 2**30:.1f} GiB available per rank"
    if cores < MIN_CORES:
        return False, f"{have}: the writer process needs a core of its own ({MIN_CORES:g}+)"
    if memory < MIN_MEMORY:
        return False, f"{have}: under the {MIN_MEMORY >> 30} GiB a writer process needs room in"
    return True, have


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read(4096)
    except (OSError, ValueError):
        return ""


def _cpu_quota() -> float | None:
    """The cgroup v2 CPU quota of this process in cores (None: none)."""
    parts = _read("/sys/fs/cgroup/cpu.max").split()
    if len(parts) == 2 and parts[0] != "max":
        try:
            return int(parts[0]) / int(parts[1])
        except (ValueError, ZeroDivisionError):
            return None
    return None


def _available_memory() -> int:
    """``MemAvailable``, at most what the cgroup v2 memory limit leaves (0: unknown)."""
    available = 0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
    limit, used = _read("/sys/fs/cgroup/memory.max").strip(), _read("/sys/fs/cgroup/memory.current")
    if limit.isdigit() and used.strip().isdigit():
        left = int(limit) - int(used)
        available = min(available, left) if available else left
    return max(available, 0)


def node_share(local_ranks: int) -> tuple[float, int]:
    """This rank's share of the cores it may run on and of the available memory, for
    ``local_ranks`` ranks on this node."""
    cores = float(node_cores())
    quota = _cpu_quota()
    if quota is not None:
        cores = min(cores, quota)
    ranks = max(local_ranks, 1)
    return cores / ranks, _available_memory() // ranks


class AutoBackend:
    """A ``SaveBackend`` that is the process or the thread backend (see the module
    docstring), chosen by all ranks together: by the node's resources in the constructor
    (which starts the writer process when they leave room for it) and, at the first
    ``settle``, by whether that save's state can go to a writer process on every rank (if
    not, the writer is closed and the thread backend saves). Every other call goes to the
    chosen one.

    Call order: ``SaveBackend``'s; the constructor and the first ``settle`` are
    collectives (every rank calls them, as it does the manager's constructor and ``save``).
    """

    def __init__(
        self,
        thread: Callable[[], Any],
        process: Callable[[], Any],
        agree: Agreement,
        share: tuple[float, int],
        asynchronous: bool = True,
        url: bool = True,
    ) -> None:
        self._thread = thread
        self._agree = agree
        room, why = choose(*share, asynchronous, url)
        everywhere = agree.all(room)
        if room and not everywhere:
            why = f"{why}, but another rank has not"
        #: "process" or "thread", and why (what the manager reports).
        self.name = "process" if everywhere else "thread"
        self.reason = f"background='auto': {why}"
        self.inner: Any = process() if everywhere else thread()
        self._decided = not everywhere

    def settle(self, state: dict[str, Any] | None) -> None:
        """At the first save (a collective), keep the writer process only if every rank's
        ``state`` (None: this rank could not flatten it) can go to it; later, nothing."""
        if self._decided:
            return
        self._decided = True
        error: Exception | None = None
        try:
            if state is not None:
                self.inner.prepare(state)
        except Exception as exc:  # noqa: BLE001 - not a state a writer process takes
            error = exc
        if self._agree.all(state is not None and error is None):
            return
        self.inner.close()
        self.inner = self._thread()
        self.name = "thread"
        self.reason = (
            "background='auto': the state cannot go to a writer process "
            f"({error if error is not None else 'on another rank'})"
        )

    def prepare(self, state: dict[str, Any]) -> Any:
        """See ``SaveBackend``."""
        return self.inner.prepare(state)

    def start_error(self) -> BaseException | None:
        """See ``SaveBackend``."""
        return self.inner.start_error()  # type: ignore[no-any-return]

    def needs_restart(self) -> bool:
        """See ``SaveBackend``."""
        return self.inner.needs_restart()  # type: ignore[no-any-return]

    def reserve(self, prepared: Any) -> None:
        """See ``SaveBackend``."""
        self.inner.reserve(prepared)

    def ensure_ready(self, restart: bool) -> None:
        """See ``SaveBackend``."""
        self.inner.ensure_ready(restart)

    def stage(self, prepared: Any, defer: Callable[[Any], bool] | None) -> tuple[Any, int]:
        """See ``SaveBackend``."""
        return self.inner.stage(prepared, defer)  # type: ignore[no-any-return]

    def deferred_bytes(self, staged: Any) -> int:
        """See ``SaveBackend``."""
        return self.inner.deferred_bytes(staged)  # type: ignore[no-any-return]

    def write(
        self, step: int, staged: Any, timings: dict[str, float], overwrite: bool, local: bool
    ) -> list[str]:
        """See ``SaveBackend``."""
        return self.inner.write(step, staged, timings, overwrite, local)  # type: ignore[no-any-return]

    def wait_staged(self, staged: Any) -> float:
        """See ``SaveBackend``."""
        return self.inner.wait_staged(staged)  # type: ignore[no-any-return]

    def close(self) -> None:
        """See ``SaveBackend``."""
        self.inner.close()
