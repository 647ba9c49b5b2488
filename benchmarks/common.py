"""What the benchmark scripts share to report a run: Markdown tables, machine facts, JSON.

markdown_table(["contender", "median s"], "lr", [["ckptstore", cell(1.234)]])
cell(None) == "—"; cell(0.5) == "0.50"; cell(97.2, ".0f", " %") == "97 %"
machine = {"nproc": os.cpu_count(), "mem_gib": mem_gib(), ...}
machine["loadavg_before"] = load_average()      # around the timed run
print(machine_line(machine))                     # cores, memory, load before / after
path = write_results("bench_local", result)      # benchmarks/results/<name>-<time>.json
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "cell",
    "load_average",
    "machine_line",
    "markdown_table",
    "mem_gib",
    "write_results",
]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


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


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"machine: {m['nproc']} cores, {m['mem_gib']} GiB; load average (1/5/15 min) "
        f"before {m['loadavg_before']}, after {m['loadavg_after']}"
    )


def write_results(name: str, result: dict[str, Any]) -> str:
    """Write ``result`` as ``RESULTS_DIR/<name>-<timestamp>.json``; the file's path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    out = os.path.join(RESULTS_DIR, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    return out
