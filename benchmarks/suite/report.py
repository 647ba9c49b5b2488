"""Markdown tables and PNG plots from the suite's records (see ``scenarios.py``).

Ratios are time ÷ reference time, medians of one run: < 1 means faster than the reference.
A floor measured at another size is scaled linearly to the row's bytes.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["markdown", "plots"]

# Which references each kind's rows are compared with: (column title, kind, metric, contender)
REFS: dict[str, list[tuple[str, str, str, str]]] = {
    "save": [
        ("× torch.save", "local", "save", "torch.save"),
        ("× stock DCP", "local", "save", "stock DCP"),
        ("× write floor", "floor", "write", "raw write + fsync"),
    ],
    "load": [
        ("× stock DCP", "local", "load", "stock DCP"),
        ("× read floor", "floor", "read", "raw read (page cache)"),
    ],
    "reshard": [
        ("× stock DCP", "reshard", "*", "stock DCP"),
        ("× read floor", "floor", "read", "raw read (page cache)"),
    ],
    "blocking": [
        ("× torch.save", "async", "blocking", "rank-0 torch.save"),
        ("× dcp.async_save", "async", "blocking", "dcp.async_save"),
        ("× copy_ floor", "async", "blocking", "copy_ floor"),
    ],
    "committed": [
        ("× torch.save", "async", "committed", "rank-0 torch.save"),
        ("× dcp.async_save", "async", "committed", "dcp.async_save"),
        ("× write floor", "floor", "write", "raw write + fsync"),
    ],
    "objstore": [
        ("× raw ceiling", "objstore", "ceiling", ""),
        ("× torch.save + upload", "objstore", "*", "rank-0 torch.save"),
        ("× FsspecWriter/Reader", "objstore", "*", "Fsspec"),
        ("× s3torchconnector", "objstore", "*", "s3torchconnector"),
    ],
    "data": [("× fsspec", "data", "data_fetch", "(a) fsspec DataLoader")],
}


def _find(recs: list[dict], row: dict, kind: str, metric: str, cont: str) -> dict | None:
    """The reference record for ``row``: same scenario where possible, else the floor of the
    nearest size."""
    if kind == "floor":
        cands = [r for r in recs if r["kind"] == "floor" and r["metric"] == metric]
        if not cands:
            return None
        return min(cands, key=lambda r: abs(r["bytes"] - row["bytes"]))
    same = [r for r in recs if r["scenario"] == row["scenario"]]
    if kind == "objstore":
        same = [r for r in same if r["dest"] == row["dest"]]
        if metric == "ceiling":
            want = "put" if row["metric"] in ("save", "put") else "get"
            return next((r for r in same if r["metric"] == want), None)
        op = "save" if row["metric"] in ("save", "put") else "load"
        return next(
            (
                r
                for r in same
                if r["metric"] == op
                and r["contender"].startswith(cont)
                and "sync_files" not in r["contender"]
            ),
            None,
        )
    if metric == "*":
        return next(
            (r for r in same if r["metric"] == row["metric"] and r["contender"] == cont), None
        )
    return next((r for r in same if r["metric"] == metric and r["contender"] == cont), None)


def _ratio(row: dict, ref: dict | None) -> str:
    if ref is None:
        return "—"
    ref_s = ref["median_s"]
    if ref["kind"] == "floor" and ref["bytes"] and row["bytes"]:
        ref_s = ref_s * row["bytes"] / ref["bytes"]
    return f"{row['median_s'] / ref_s:.2f}" if ref_s > 0 else "—"


def _group_key(r: dict) -> str:
    if r["kind"] in ("local", "async") and r["metric"] in ("save", "load", "blocking", "committed"):
        return r["metric"]
    if r["kind"] == "reshard":
        return "reshard"
    return r["kind"]


TITLES = {
    "floor": "Floors (one process, local volume)",
    "save": "Save to the local volume (blocking = durable)",
    "load": "Load from the local volume, same world size (page cache warm)",
    "reshard": "Load on a different world size (page cache warm)",
    "blocking": "Async save: blocking time (steady saves; first save apart)",
    "committed": "Async save: time until durable / committed",
    "objstore": "Object store (SeaweedFS started by the suite)",
    "data": "Data loader, one epoch from a shaped store (fetch_s = time the loop waited)",
}


def _fmt_row(r: dict, refs: list[tuple[str, str, str, str]], recs: list[dict]) -> str:
    gbs = f"{r['gb_per_s']:.2f}" if r["gb_per_s"] else "—"
    rss = f"{r['peak_rss_mib']:.0f}" if r["peak_rss_mib"] else "—"
    what = r["contender"]
    if r["kind"] == "objstore":
        what = f"{r['metric']}: {r['contender']}"
    if r["kind"] == "reshard":
        what = f"{r['contender']} (saved on {r['extra']['saved_on']})"
    cells = [
        what,
        r["dest"],
        str(r["world"]),
        f"{r['bytes'] / 2**20:.0f}",
        f"{r['median_s']:.3f}",
        f"{r['min_s']:.3f}–{r['max_s']:.3f}",
        gbs,
        rss,
    ]
    if r["kind"] == "async":
        cells.append(f"{r['extra'].get('first_s', 0):.3f}")
    if r["kind"] == "data":
        sps = sorted(r["extra"]["samples_per_s"])
        cells.append(f"{sps[len(sps) // 2]:.0f}")
    cells += [_ratio(r, _find(recs, r, *ref[1:])) for ref in refs]
    return "| " + " | ".join(cells) + " |"


def markdown(recs: list[dict], meta: dict[str, Any]) -> str:
    groups: dict[str, list[dict]] = {}
    for r in recs:
        groups.setdefault(_group_key(r), []).append(r)
    out = []
    for key in TITLES:
        if key not in groups:
            continue
        refs = REFS.get(key, [])
        head = [
            "what",
            "destination",
            "ranks",
            "MiB",
            "median s",
            "min–max s",
            "GB/s",
            "peak RSS MiB/rank",
        ]
        if key in ("blocking", "committed"):
            head.append("first save s")
        if key == "data":
            head.append("samples/s")
        head += [t for t, *_ in refs]
        out += [
            f"### {TITLES[key]}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * 2 + "---:|" * (len(head) - 2),
        ]
        out += [_fmt_row(r, refs, recs) for r in groups[key]]
        out.append("")
    m = meta.get("machine", {})
    out.append(
        f"Machine: {m.get('nproc')} cores ({m.get('cpu', '')}), {m.get('mem_gib')} GiB RAM, "
        f"disk {m.get('disk', '')}; load average before {m.get('loadavg_before')}, after "
        f"{m.get('loadavg_after')}. Wall {meta.get('wall_s', 0):.0f} s. Command: "
        f"`{meta.get('command', '')}`."
    )
    if meta.get("errors"):
        out.append("")
        out += [f"- scenario **{k}** failed: `{v}`" for k, v in meta["errors"].items()]
    return "\n".join(out) + "\n"


def _hbar(rows: list[tuple[str, float, float, float]], path: str, title: str, xlabel: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(rows) + 1.2), dpi=80)
    labels = [r[0] for r in rows]
    vals = [r[1] for r in rows]
    err = [[max(0.0, r[1] - r[2]) for r in rows], [max(0.0, r[3] - r[1]) for r in rows]]
    ax.barh(range(len(rows)), vals, xerr=err, color="#4c72b0", capsize=2)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plots(recs: list[dict], outdir: str) -> list[str]:
    """save_blocking.png, committed.png, load.png, throughput.png, rss.png (median, min–max)."""

    def t(r: dict) -> tuple[str, float, float, float]:
        return (f"{r['contender']} [{r['scenario']}]", r["median_s"], r["min_s"], r["max_s"])

    def gb(r: dict, label: str) -> tuple[str, float, float, float]:
        g = r["bytes"] / 1e9
        return (label, g / r["median_s"], g / r["max_s"], g / r["min_s"])

    made = []
    blocking = [r for r in recs if r["metric"] == "blocking"]
    blocking += [r for r in recs if r["kind"] == "local" and r["metric"] == "save"]
    made.append(
        _hbar(
            [t(r) for r in blocking],
            os.path.join(outdir, "save_blocking.png"),
            "Blocking time of a save (s; async: steady saves)",
            "seconds",
        )
    )
    committed = [r for r in recs if r["metric"] == "committed"]
    made.append(
        _hbar(
            [t(r) for r in committed],
            os.path.join(outdir, "committed.png"),
            "Time until durable / committed (s)",
            "seconds",
        )
    )
    loads = [r for r in recs if r["metric"].startswith("load") or r["metric"] == "read"]
    made.append(
        _hbar([t(r) for r in loads], os.path.join(outdir, "load.png"), "Load time (s)", "seconds")
    )
    tp = [
        r
        for r in recs
        if r["gb_per_s"]
        and r["metric"] in ("save", "put", "write", "load", "get", "read", "committed")
    ]
    made.append(
        _hbar(
            [gb(r, f"{r['metric']} {r['contender']} [{r['dest']}, {r['world']}r]") for r in tp],
            os.path.join(outdir, "throughput.png"),
            "Throughput (GB/s, state bytes / time)",
            "GB/s",
        )
    )
    rss = [r for r in recs if r["peak_rss_mib"] and r["metric"] != "committed"]
    made.append(
        _hbar(
            [
                (
                    f"{r['metric']} {r['contender']} [{r['scenario']}]",
                    r["peak_rss_mib"],
                    r["peak_rss_mib"],
                    r["peak_rss_mib"],
                )
                for r in rss
            ],
            os.path.join(outdir, "rss.png"),
            "Peak RSS per rank during the operation",
            "MiB",
        )
    )
    return [p for p in made if p]
