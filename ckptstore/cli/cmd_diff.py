"""``ckptstore-tool diff A B``: compare two checkpoints entry by entry.

Each entry is ``equal``, ``close`` (max abs difference <= ``--atol``), ``differs`` (with the
max abs difference for tensors of one dtype and shape, else what differs) or ``missing`` on
one side. Exit 1 if any entry differs or is missing. A and B may be any formats (DCP,
torch.save, safetensors) on any URLs; entries are matched by DCP's flattened names. DCP
checkpoints are loaded in batches of about ``--batch-mib`` so memory stays bounded.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from ckptstore.cli.context import Context, non_negative, positive
from ckptstore.cli.render import Progress, dump_json, table
from ckptstore.cli.sources import Entry, Located, dcp_entries, entries_of, flatten, load_state
from ckptstore.cli.sources import locate as locate_url

__all__ = ["add_parser", "run", "compare_values"]


def add_parser(sub: Any, common: Any) -> None:
    """Register ``diff`` on the subparsers ``sub`` (``common``: the shared flags)."""
    p = sub.add_parser(
        "diff",
        help="per-entry equal / max abs difference / missing (exit 1 if they differ)",
        description="Compare two checkpoints (any formats, any URLs) entry by entry.",
    )
    p.add_argument("a", metavar="A", help="first checkpoint (DCP folder, .pt, .safetensors)")
    p.add_argument("b", metavar="B", help="second checkpoint")
    p.add_argument(
        "--atol",
        type=non_negative,
        default=0.0,
        help="tensors whose max abs difference is <= ATOL count as equal (default 0: exact)",
    )
    p.add_argument(
        "--all", action="store_true", help="list equal entries too (default: only differences)"
    )
    p.add_argument(
        "--batch-mib", type=positive, default=1024.0, help="DCP entries loaded per batch (MiB)"
    )
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="let torch.load run arbitrary pickled objects (torch.save files, DCP object "
        "entries); trusted checkpoints only. Default: torch.load(weights_only=True)",
    )
    common(p, two_sided=True)
    p.set_defaults(func=run)


def compare_values(a: Any, b: Any, atol: float = 0.0) -> tuple[str, float | None, str]:
    """``(status, max_abs_diff, detail)`` for two entry values."""
    import torch

    ta, tb = isinstance(a, torch.Tensor), isinstance(b, torch.Tensor)
    if ta != tb:
        kinds = ("tensor" if ta else type(a).__name__, "tensor" if tb else type(b).__name__)
        return "differs", None, f"{kinds[0]} vs {kinds[1]}"
    if not ta:
        try:
            same = bool(a == b)
        except Exception:  # noqa: BLE001 - objects that cannot be compared are not equal
            same = False
        return ("equal", None, "") if same else ("differs", None, f"{a!r:.40} vs {b!r:.40}")
    if a.dtype != b.dtype:
        return "differs", None, f"dtype {a.dtype} vs {b.dtype}".replace("torch.", "")
    if a.shape != b.shape:
        return "differs", None, f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if torch.equal(a, b):
        return "equal", 0.0, ""
    if a.is_floating_point() or a.is_complex():
        x, y = (
            a.to(torch.complex128 if a.is_complex() else torch.float64),
            b.to(torch.complex128 if b.is_complex() else torch.float64),
        )
        both_nan = torch.isnan(x) & torch.isnan(y)
        delta = (x - y).abs()
        delta = torch.where(both_nan, torch.zeros_like(delta), delta)
        worst = float(delta.max()) if delta.numel() else 0.0
        if math.isnan(worst) or torch.isnan(delta).any():
            return "differs", math.nan, "NaN in one side only"
    else:
        worst = float((a.to(torch.int64) - b.to(torch.int64)).abs().max())
    if worst == 0.0:
        return "equal", 0.0, ""  # e.g. NaNs in the same places
    return ("close", worst, "") if worst <= atol else ("differs", worst, "")


class _Side:
    """One side of the diff: its entries and a way to load some of them."""

    def __init__(self, ctx: Context, loc: Located, allow_pickle: bool) -> None:
        self.ctx, self.loc, self.allow_pickle = ctx, loc, allow_pickle
        self._flat: dict[str, Any] | None = None
        if loc.format == "dcp":
            from ckptstore.cli.sources import dcp_reader

            self.entries: dict[str, Entry] = dcp_entries(dcp_reader(ctx, loc.store).read_metadata())
        else:
            self._flat = flatten(load_state(ctx, loc, allow_pickle=allow_pickle))
            self.entries = entries_of(self._flat)

    def load(self, names: list[str]) -> dict[str, Any]:
        if self._flat is not None:
            return {n: self._flat[n] for n in names}
        flat = flatten(
            load_state(
                self.ctx, self.loc, keys=names, allow_pickle=self.allow_pickle, note_stock=False
            )
        )  # the constructor's reader noted a stock checkpoint once
        return {n: flat[n] for n in names}


def _batches(names: list[str], entries: dict[str, Entry], limit: int) -> list[list[str]]:
    out: list[list[str]] = [[]]
    size = 0
    for n in names:
        nbytes = entries[n].nbytes or 0
        if out[-1] and size + nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(n)
        size += nbytes
    return [b for b in out if b]


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Run ``diff``; the exit status (1 if the checkpoints differ)."""
    side_a = _Side(ctx, locate_url(ctx, args.a, "src"), args.allow_pickle)
    side_b = _Side(ctx, locate_url(ctx, args.b, "dst"), args.allow_pickle)
    names_a, names_b = set(side_a.entries), set(side_b.entries)
    rows: list[dict[str, Any]] = []
    for n in sorted(names_a - names_b):
        rows.append({"name": n, "status": "missing in B", "max_abs_diff": None, "detail": ""})
    for n in sorted(names_b - names_a):
        rows.append({"name": n, "status": "missing in A", "max_abs_diff": None, "detail": ""})
    common_names = sorted(names_a & names_b)
    limit = max(1, int(args.batch_mib * 2**20))
    with Progress(len(common_names), "diff", ctx.progress_enabled, unit="entry") as bar:
        for batch in _batches(common_names, side_a.entries, limit):
            va, vb = side_a.load(batch), side_b.load(batch)
            for n in batch:
                status, worst, detail = compare_values(va[n], vb[n], args.atol)
                rows.append({"name": n, "status": status, "max_abs_diff": worst, "detail": detail})
                bar.update(1)
            del va, vb
    rows.sort(key=lambda r: r["name"])
    counts: dict[str, int] = {}
    for r in rows:
        key = "missing" if r["status"].startswith("missing") else r["status"]
        counts[key] = counts.get(key, 0) + 1
    same = counts.get("differs", 0) == 0 and counts.get("missing", 0) == 0
    if ctx.json:
        dump_json({"a": args.a, "b": args.b, "same": same, "counts": counts, "entries": rows})
        return 0 if same else 1
    shown = rows if args.all else [r for r in rows if r["status"] != "equal"]
    if shown:
        print(
            table(
                ["ENTRY", "STATUS", "MAX ABS DIFF", "DETAIL"],
                [
                    [
                        r["name"],
                        r["status"],
                        "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.6g}",
                        r["detail"],
                    ]
                    for r in shown
                ],
                right={2},
            )
        )
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"{'SAME' if same else 'DIFFERENT'}: {len(rows)} entries ({summary or 'none'})")
    return 0 if same else 1
