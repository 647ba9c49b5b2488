"""The object-store benchmark's rows from its samples, its tables and the issue's targets.

``summarise`` turns every rank's rounds of ``save_load`` into one row per (operation,
contender, link): median, min–max, MB/s, % of the raw ceiling, speed-up over the stock
fsspec writer/reader, and the CPU of clients, server and link; ``format_table`` /
``format_cpu`` print them as Markdown and ``targets`` checks the issue's targets.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import cell, markdown_table
from benchmarks.objstore.contenders import LOAD_FNS, BenchConfig, labels

__all__ = ["format_cpu", "format_table", "summarise", "targets"]


def summarise(rounds_by_rank: list[list[dict[str, Any]]], cfg: BenchConfig) -> list[dict]:
    """One row per (operation, contender, link): medians, ranges, ratios."""
    labs = labels(cfg)
    rows: list[dict[str, Any]] = []
    for op in cfg.ops:
        for link in cfg.links:
            base: dict[str, float] = {}
            for name in cfg.contenders:
                if op == "load" and name not in LOAD_FNS:
                    continue
                walls, cpu, server, link_cpu, moved = [], [], [], [], []
                for r in range(cfg.repeats):
                    per_rank = [rounds[r][link][name][op] for rounds in rounds_by_rank]
                    walls.append(max(p["s"] for p in per_rank))
                    cpu.append(sum(p["cpu_s"] for p in per_rank))
                    server.append(per_rank[0].get("server_cpu_s", 0.0))
                    link_cpu.append(per_rank[0].get("link_cpu_s", 0.0))
                    moved.append(per_rank[0].get("link_bytes", 0))
                med = statistics.median(walls)
                base.setdefault(name, med)
                lab = labs[name]
                rows.append(
                    {
                        "op": op,
                        "contender": name,
                        "label": lab.save if op == "save" else lab.load,
                        "link": link,
                        "median_s": med,
                        "min_s": min(walls),
                        "max_s": max(walls),
                        "mb_per_s": cfg.state_bytes / 1e6 / med,
                        "samples_s": walls,
                        "client_cpu_s": statistics.median(cpu),
                        "server_cpu_s": statistics.median(server),
                        "link_cpu_s": statistics.median(link_cpu),
                        "link_mb": statistics.median(moved) / 1e6,
                    }
                )
            for row in rows:
                if row["op"] == op and row["link"] == link:
                    raw, fsspec = base.get("raw"), base.get("fsspec")
                    row["pct_of_ceiling"] = 100 * raw / row["median_s"] if raw else None
                    row["x_fsspec"] = fsspec / row["median_s"] if fsspec else None
    return rows


def format_table(rows: list[dict[str, Any]], op: str) -> str:
    head = "FsspecWriter" if op == "save" else "FsspecReader"
    header = [op, "link", "median s", "min–max s", "MB/s", "% of ceiling", f"× {head} (speed-up)"]
    cells = [
        [
            r["label"],
            r["link"],
            cell(r["median_s"]),
            f"{cell(r['min_s'])}–{cell(r['max_s'])}",
            cell(r["mb_per_s"], ".0f"),
            cell(r["pct_of_ceiling"], ".0f", " %"),
            cell(r["x_fsspec"]),
        ]
        for r in rows
        if r["op"] == op
    ]
    return markdown_table(header, "llrrrrr", cells)


def format_cpu(rows: list[dict[str, Any]]) -> str:
    """CPU seconds of clients, server and link per operation; MB through the shaped link."""
    header = ["contender", "op", "link", "clients CPU s (all ranks)", "SeaweedFS CPU s"]
    header += ["link CPU s", "MB through the link"]
    cells = [
        [
            r["label"],
            r["op"],
            r["link"],
            cell(r["client_cpu_s"], ".1f"),
            cell(r["server_cpu_s"], ".1f"),
            cell(r["link_cpu_s"] if r["link"] == "shaped" else None, ".1f"),
            cell(r["link_mb"] if r["link"] == "shaped" else None, ".0f"),
        ]
        for r in rows
    ]
    return markdown_table(header, "lllrrrr", cells)


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's targets, checked against ckptstore's default and tuned rows."""
    out = []
    for r in rows:
        if r["contender"] not in ("ckptstore", "tuned"):
            continue
        if r["link"] == "direct" and r["pct_of_ceiling"] is not None:
            ok = r["pct_of_ceiling"] >= 90
            out.append(
                f"direct {r['op']}: {r['label']} at {r['pct_of_ceiling']:.0f} % of the raw "
                f"ceiling (target >= 90 %): {'met' if ok else 'MISSED'}"
            )
        if r["link"] == "shaped" and r["x_fsspec"] is not None:
            ok = r["x_fsspec"] >= 3
            base = "FsspecWriter" if r["op"] == "save" else "FsspecReader"
            out.append(
                f"shaped {r['op']}: {r['label']} {r['x_fsspec']:.2f}x faster than {base} "
                f"(target >= 3x): {'met' if ok else 'MISSED'}"
            )
    return out
