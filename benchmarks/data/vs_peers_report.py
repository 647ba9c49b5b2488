"""data.vs_peers' tables: one row per (dataset, contender), and the first batch by phase.

Every cell is the median over the runs with min–max where it matters; the columns are those
``vs_peers.py``'s docstring explains.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["convert_lines", "phases_table", "table"]


def convert_lines(report: dict[str, Any]) -> str:
    """Seconds each format conversion took (local files in, local shards out; not counted in
    the cold epoch, as a real job converts once ahead of time)."""
    lines = []
    for kind, d in report.get("data", {}).items():
        cells = ", ".join(f"{name} {sec:.2f} s" for name, sec in d.get("convert_s", {}).items())
        lines.append(f"- conversion of {kind}: {cells or 'none (read as they are)'}")
    return "\n".join(lines)


def _med(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    vals = [r[key] for r in runs]
    return statistics.median(vals), min(vals), max(vals)


def _cell(runs: list[dict[str, Any]], key: str, scale: float = 1.0) -> str:
    m, lo, hi = (v / scale for v in _med(runs, key))
    return f"{m:.2f} ({lo:.2f}–{hi:.2f})" if len(runs) > 1 else f"{m:.2f}"


def _clean(text: str, n: int = 90) -> str:
    return " ".join(str(text).split()).replace("|", "/")[-n:]


HEADER = (
    "| dataset | contender | cold epoch s | warm epoch s | first batch s | steady wait % of step "
    "p50 / p99 | disk MiB | epoch 0 repeated / skipped | resume 2x2 → 3x1 repeated / skipped |"
)


def table(report: dict[str, Any]) -> str:
    """The README table: medians (min–max) over the runs that finished."""
    lines = [HEADER, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key, entry in report["runs"].items():
        kind, name = key.split("/")
        runs = [r for r in entry["runs"] if "error" not in r]
        failed = [r["error"] for r in entry["runs"] if "error" in r]
        note = (
            f" ({len(failed)} of {len(entry['runs'])} runs failed: {_clean(failed[0])})"
            if failed
            else ""
        )
        res = entry.get("resume", {})
        if "repeated" in res:
            resume = f"{res['repeated']} / {res['skipped']}"
            resume += f" (of {res['checkpointed']} + {res['resumed']})"
        else:
            resume = f"failed: {_clean(res.get('error', ''))}" if res else "not run"
        if not runs:
            lines.append(f"| {kind} | {name} | failed{note} | | | | | | {resume} |")
            continue
        p50, p99 = _med(runs, "wait_p50_pct")[0], _med(runs, "wait_p99_pct")[0]
        lines.append(
            f"| {kind} | {name}{note} | {_cell(runs, 'cold_s')} | "
            f"{_cell(runs, 'warm_s')} | {_cell(runs, 'first_batch_s')} | {p50:.1f} / {p99:.1f} | "
            f"{_med(runs, 'disk_bytes')[0] / 2**20:.1f} | "
            f"{runs[0]['repeated']} / {runs[0]['skipped']} | {resume} |"
        )
    return "\n".join(lines)


PHASES = (
    ("import_s", "import"),
    ("client_s", "store client"),
    ("listing_s", "listing (footers)"),
    ("loader_s", "loader"),
    ("iter_s", "iter() (workers, prefetch)"),
    ("first_next_s", "first next()"),
)


def phases_table(report: dict[str, Any]) -> str:
    """Time to the first batch, phase by phase (slowest rank, median over the runs).

    Every contender has ``iter()`` and the first ``next()``; the rest of its build time is
    "build" (ckptstore splits it into its phases).
    """
    head = ["dataset", "contender", "build", *(label for _, label in PHASES), "first batch"]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for key, entry in report["runs"].items():
        kind, name = key.split("/")
        runs = [r for r in entry["runs"] if "error" not in r and "phases" in r]
        if not runs:
            continue
        cells = []
        builds = [
            r["first_batch_s"] - r["phases"].get("iter_s", 0) - r["phases"]["first_next_s"]
            for r in runs
            if "first_next_s" in r["phases"]
        ]
        build = max(0.0, statistics.median(builds)) if builds else 0.0
        cells.append(f"{build:.2f}")
        for k, _ in PHASES:
            vals = [r["phases"][k] for r in runs if k in r["phases"]]
            cells.append(f"{statistics.median(vals):.2f}" if vals else "")
        cells.append(f"{statistics.median(r['first_batch_s'] for r in runs):.2f}")
        lines.append(f"| {kind} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
