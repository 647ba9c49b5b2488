"""``ckptstore-tool ls ROOT``: every checkpoint under a root, and unfinished uploads.

Status comes from each step's marker and manifest (``committed`` / ``incomplete`` /
``corrupt``), never from the listing; ``--verify`` re-reads every committed checkpoint's
bytes, so damage after commit shows as ``corrupt``. Exit 1 if any checkpoint is corrupt.
Each committed row names the run that wrote it (``run``); a step without a marker whose
save holds a fresh lease is marked in flight (``in_flight``), and the root's live owner,
if any, is shown (``owner``; ``engine.owner``). ``--local-tier DIR`` (a node's local tier
directory, repeatable) adds which tiers hold each committed step: the bucket, and how many
of its data files each local tier holds with the recorded size in the directory of the
job (root and run) that wrote it (``tier.jobs``: its own shards and its peers'
replicas), lists the steps saved to the local tier alone (``local_every``), which the
bucket does not hold (``"durable": false``), and reports whose copies each tier holds:
every job's root, run, steps and bytes, job directories whose stamp is refused, and step
directories of the layout before job directories. ``ls --local-tier DIR`` without a ROOT
prints that report alone.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ckptstore import Store, open_committed, verify_checkpoint
from ckptstore.cli.context import Context, non_negative
from ckptstore.cli.render import Progress, dump_json, format_time, human_bytes, safe, table
from ckptstore.cli.sources import classify, is_dcp_listing, list_or_missing
from ckptstore.engine.catalog import Skipped, scan_root
from ckptstore.engine.committed import METADATA_NAME
from ckptstore.engine.deletion import step_in_flight
from ckptstore.engine.names import step_name
from ckptstore.engine.owner import read_owner
from ckptstore.engine.store import Multipart
from ckptstore.errors import CkptStoreError, ConfigError, StoreNotFoundError
from ckptstore.stores.local import LocalStore
from ckptstore.tier.jobs import TierEntry, TierJob, TierSpec, survey
from ckptstore.tier.rules import LOCAL_ONLY, local_files

__all__ = ["add_parser", "run", "list_root", "tier_report", "upload_age_s"]


def add_parser(sub: Any, common: Any) -> None:
    """Register ``ls`` on the subparsers ``sub`` (``common``: the shared flags)."""
    p = sub.add_parser(
        "ls",
        help="every checkpoint under a root: step, status, size, world size, created",
        description="List every step_* checkpoint under ROOT with its status (from the commit "
        "marker), size, world size, creation time and format version, and count unfinished "
        "multipart uploads. --verify re-reads every committed checkpoint. --local-tier DIR "
        "(without ROOT too) reports whose copies a node's local tier holds.",
    )
    p.add_argument(
        "root",
        metavar="ROOT",
        nargs="?",
        help="folder / prefix holding step_* checkpoints (optional with --local-tier)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="re-read every committed checkpoint against its manifest (slow: reads it all)",
    )
    p.add_argument(
        "--local-tier",
        action="append",
        default=[],
        metavar="DIR",
        help="a node's local tier directory (repeatable): which tiers hold each step, and "
        "whose copies each tier holds",
    )
    p.add_argument(
        "--stale-after-hours",
        type=non_negative,
        default=24.0,
        help="unfinished uploads older than this count as stale (default 24)",
    )
    common(p)
    p.set_defaults(func=run)


def upload_age_s(upload: Multipart, now: float | None = None) -> float | None:
    """Seconds since ``upload`` began, when its store records it (``extra["initiated"]``)."""
    started = upload.extra.get("initiated")
    if started is None:
        return None
    return (now or time.time()) - float(started)


def _size_of(store: Store) -> int:
    total = 0
    for name in store.find():
        try:
            total += store.size(name)
        except StoreNotFoundError:
            continue  # deleted while we listed
    return total


#: Other folders of a root ``ls`` looks into at most (a root may also hold a dataset).
OTHERS_EXAMINED = 200


def other_checkpoints(root: Store, foreign: list[Skipped]) -> tuple[list[dict[str, Any]], int]:
    """The checkpoints among a root's other folders (``checkpoint_step5/``, ``mymodel/``, a
    6-digit ``step_000042/``): name and status (``committed``, ``incomplete``, ``corrupt``
    or ``stock``), by the same test ``inspect`` makes; and how many folders were not
    looked into (beyond ``OTHERS_EXAMINED``). Links are never followed."""
    folders = sorted(f.name for f in foreign if f.kind == "dir")
    out = []
    for name in folders[:OTHERS_EXAMINED]:
        try:
            status = classify(root.child(name))
        except CkptStoreError:  # a name the store refuses, or gone meanwhile
            continue
        if status not in ("not-a-checkpoint", "missing"):
            out.append({"name": name, "status": status})
    return out, max(0, len(folders) - OTHERS_EXAMINED)


def _job_dir(tier: str, root_url: str, run: Any) -> Store | None:
    """The directory of the job (``root_url``, ``run``) in local tier ``tier``, its stamp
    checked; None when there is none or it is refused (the tier report says why)."""
    try:
        return TierSpec(tier, TierJob(root_url, run)).open()
    except (OSError, CkptStoreError):  # ConfigError: a run that is no run; TierStampError
        return None


def tier_counts(tiers: list[str], root_url: str, name: str, manifest: Any) -> list[dict[str, Any]]:
    """For each local tier directory in ``tiers``: how many of the committed step's data
    files (``manifest``'s, bar ``.metadata``) the directory of the job that wrote it (root
    ``root_url``, the manifest's run) holds with the recorded size. A link is never
    followed (it holds nothing)."""
    data = {n: e for n, e in manifest.files.items() if n != METADATA_NAME}
    out = []
    for d in tiers:
        held = 0
        job = _job_dir(d, root_url, manifest.extra.get("run"))
        if job is not None:
            try:
                held = len(set(local_files(job.child(name), manifest)) & set(data))
            except (OSError, CkptStoreError):
                held = 0
        out.append({"dir": d, "files": held, "of": len(data)})
    return out


def local_only_rows(tiers: list[str], root_url: str, listed: set[int]) -> list[dict[str, Any]]:
    """A row for each step saved to the local tier alone by a job of root ``root_url``
    (any run) that a directory of ``tiers`` can open (a node holding its marker: the
    coordinator's, and its peers), other than the steps ``listed`` already; what each tier
    holds of it, as ``tier_counts`` says."""
    rows: dict[int, dict[str, Any]] = {}
    for d in tiers:
        try:
            jobs = [e for e in survey(LocalStore(d)) if e.kind == "job" and e.root == root_url]
        except (OSError, CkptStoreError):
            continue
        for e in jobs:
            job = _job_dir(d, root_url, e.run)
            if job is None:
                continue
            for s in e.steps:
                if s in listed or s in rows:
                    continue
                try:
                    m = open_committed(job.child(step_name(s))).manifest
                except (OSError, CkptStoreError):
                    continue  # no marker on this node, or damaged: another tier may say
                if m.extra.get("tier") != LOCAL_ONLY or m.extra.get("run") != e.run:
                    continue
                rows[s] = {
                    **_row(s, step_name(s), "committed"),
                    **_manifest_fields(m),
                    "durable": False,
                    "tiers": tier_counts(tiers, root_url, step_name(s), m),
                }
    return list(rows.values())


def tier_report(tier: str, root_url: str | None) -> list[dict[str, Any]]:
    """Whose copies local tier directory ``tier`` holds: one dict per entry directly
    under it (``tier.jobs.survey``), ``this_root`` set on the jobs of
    ``root_url``."""
    return [
        {**_entry_fields(e), "this_root": e.root is not None and e.root == root_url}
        for e in survey(LocalStore(tier))
    ]


def _entry_fields(e: TierEntry) -> dict[str, Any]:
    return {
        "name": e.name,
        "kind": e.kind,
        "root": e.root,
        "run": e.run,
        "steps": list(e.steps),
        "bytes": e.bytes,
        "problem": e.problem,
    }


#: How a report names each kind of tier entry.
_KIND_TEXT = {"job": "", "legacy": "older layout", "other": "not ckptstore's"}


def print_tier_report(index: int, tier: str, entries: list[dict[str, Any]]) -> None:
    """The report of ``tier_report`` as a table, then one line per refused entry."""
    print(f"local tier {index}: {safe(tier)}")
    if not entries:
        print("  (empty)")
        return
    rows = []
    for e in entries:
        who = "this root" if e["this_root"] else _KIND_TEXT[e["kind"]]
        if e["kind"] == "job" and e["problem"]:
            who = "refused"
        steps = ", ".join(str(s) for s in e["steps"][-4:])
        more = len(e["steps"]) - 4
        rows.append(
            [
                e["name"],
                e["root"] if e["root"] is not None else "-",
                e["run"] if e["run"] is not None else "-",
                (f"... {steps}" if more > 0 else steps) or "-",
                human_bytes(e["bytes"]),
                who,
            ]
        )
    table_text = table(["ENTRY", "ROOT", "RUN", "STEPS", "SIZE", ""], rows, right={4})
    print("\n".join("  " + line.rstrip() for line in table_text.splitlines()))
    for e in entries:
        if e["problem"] and e["kind"] == "job":
            print(f"  {safe(e['name'])}: {safe(e['problem'])}")
    if any(e["kind"] == "legacy" for e in entries):
        print(
            "  older layout: step directories an older ckptstore wrote directly under the "
            "tier; nothing records their root, so no job uses or deletes them"
        )


def _row(step: int, name: str, status: str) -> dict[str, Any]:
    """A row of ``list_root`` with nothing known but the step and its status."""
    return {
        "step": step,
        "name": name,
        "status": status,
        "size": None,
        "world_size": None,
        "created": None,
        "format_version": None,
        "codec": None,
        "run": None,
        "in_flight": None,
        "problem": "",
        "durable": status == "committed",
    }


def _manifest_fields(m: Any) -> dict[str, Any]:
    """The row's fields a committed step's manifest ``m`` gives."""
    return {
        "size": m.total_bytes,
        "world_size": m.world_size,
        "created": m.created,
        "format_version": m.version,
        "codec": m.codec,
        "run": m.extra.get("run") if isinstance(m.extra.get("run"), str) else None,
    }


def tiers_text(row: dict[str, Any]) -> str:
    """``bucket, local 1: all, local 2: 2/3`` for a row with ``tiers`` (``not in the
    bucket, ...`` for a step saved to the local tier alone)."""
    parts = ["bucket" if row["durable"] else "not in the bucket"]
    for i, t in enumerate(row["tiers"], start=1):
        held = "all" if t["files"] == t["of"] else f"{t['files']}/{t['of']}"
        parts.append(f"local {i}: {held}")
    return ", ".join(parts)


def list_root(
    ctx: Context,
    root: Store,
    verify: bool = False,
    progress: Any = None,
    skipped: list[Skipped] | None = None,
    foreign: list[Skipped] | None = None,
    tiers: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One dict per ``step_%09d`` directory under ``root`` (ascending step); with
    ``tiers`` (local tier directories), each committed one says what each holds of it,
    and the steps saved to those tiers alone are listed too (``durable`` False).

    Step-named entries that are not directories (a symlink, a file) are never followed or
    read: they go into ``skipped`` when it is given; every other entry into ``foreign``.
    """
    out = []
    listing = scan_root(root)
    if skipped is not None:
        skipped.extend(listing.skipped)
    if foreign is not None:
        foreign.extend(listing.foreign)
    for e in listing.steps:
        store = root.child(e.name)
        row = _row(e.step, e.name, e.status)
        if e.status == "committed":
            committed = open_committed(store)
            m = committed.manifest
            row.update(_manifest_fields(m))
            if tiers:
                row["tiers"] = tier_counts(tiers, root.url, e.name, m)
            if verify:
                report = verify_checkpoint(
                    store, ctx.engine, committed=committed, on_bytes=progress
                )
                if not report.ok:
                    row["status"] = "corrupt"
                    row["problem"] = "; ".join(
                        f"{f.name}: {f.problem or 'bad ranges'}" for f in report.bad_files
                    )
        else:
            row["size"] = _size_of(store)
            holder = step_in_flight(root, e.name)
            if holder is not None:
                row["in_flight"] = holder.describe()
            if e.status == "corrupt":
                try:
                    open_committed(store)
                except CkptStoreError as exc:
                    row["problem"] = str(exc)
        out.append(row)
    if tiers:
        listed = {r["step"] for r in out}
        out = sorted(out + local_only_rows(tiers, root.url, listed), key=lambda r: r["step"])
    return out


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Run ``ls``; the exit status."""
    for d in args.local_tier:
        if not os.path.isdir(d):
            raise ConfigError(f"--local-tier {d}: not a directory (a node's local tier)")
    if args.root is None:
        if not args.local_tier:
            raise ConfigError("ls needs a ROOT, or --local-tier DIR for a tier's report")
        return _tiers_only(args.local_tier, ctx)
    root = ctx.open(args.root)
    names = list_or_missing(root, args.root)
    skipped: list[Skipped] = []
    foreign: list[Skipped] = []
    with Progress(None, "verify", ctx.progress_enabled and args.verify) as bar:
        rows = list_root(
            ctx,
            root,
            verify=args.verify,
            progress=bar.update,
            skipped=skipped,
            foreign=foreign,
            tiers=args.local_tier,
        )
    reports = [tier_report(d, root.url) for d in args.local_tier]
    others, unexamined = other_checkpoints(root, foreign)
    now = time.time()
    uploads = root.list_multipart()
    ages = [upload_age_s(u, now) for u in uploads]
    stale = sum(1 for a in ages if a is not None and a > args.stale_after_hours * 3600)
    corrupt = sum(1 for r in rows if r["status"] == "corrupt")
    owner = read_owner(root)
    live_owner = owner if owner is not None and owner.fresh(now) else None
    if ctx.json:
        dump_json(
            {
                "root": root.url,
                "checkpoints": rows,
                "skipped": [{"name": k.name, "reason": k.reason} for k in skipped],
                "other_checkpoints": others,
                "other_folders_not_examined": unexamined,
                "owner": None
                if live_owner is None
                else {
                    "run": live_owner.run,
                    "host": live_owner.host,
                    "pid": live_owner.pid,
                    "heartbeat_age_s": round(live_owner.age(now), 1),
                },
                "uploads": {
                    "unfinished": len(uploads),
                    "stale": stale,
                    "stale_after_hours": args.stale_after_hours,
                    "paths": [u.path for u in uploads],
                },
                "local_tiers": [{"dir": d, "entries": r} for d, r in zip(args.local_tier, reports)],
            }
        )
        return 1 if corrupt else 0
    if rows:
        head = ["STEP", "STATUS", "SIZE", "WORLD", "CREATED", "FORMAT"]
        print(
            table(
                head + (["TIERS"] if args.local_tier else []),
                [
                    [
                        r["step"],
                        r["status"],
                        human_bytes(r["size"]),
                        r["world_size"] if r["world_size"] is not None else "-",
                        format_time(r["created"]),
                        f"v{r['format_version']} {r['codec']}" if r["format_version"] else "-",
                    ]
                    + ([tiers_text(r) if "tiers" in r else "-"] if args.local_tier else [])
                    for r in rows
                ],
                right={0, 2, 3},
            )
        )
        for r in rows:
            if r["problem"]:
                print(f"step {r['step']}: {safe(r['problem'])}")
            if r["in_flight"]:
                print(f"step {r['step']}: a save is in flight ({safe(r['in_flight'])})")
    elif is_dcp_listing(names):
        print(f"{args.root} is itself a checkpoint, not a root of step_* checkpoints; use inspect")
    else:
        print(f"no step_* checkpoints under {args.root}")
    for k in skipped:
        print(f"{safe(k.name)}: skipped ({safe(k.reason)})")
    if others:
        print(
            "other checkpoints under this root (not named step_NNNNNNNNN: listed here, never "
            "pruned by gc or retention; inspect / verify / convert take their paths):"
        )
        print(table(["NAME", "STATUS"], [[safe(o["name"]), o["status"]] for o in others]))
    if unexamined:
        print(f"({unexamined} more folders under this root were not looked into)")
    if live_owner is not None:
        print(f"owned by a live job: {safe(live_owner.describe(now))}")
    for i, (d, report) in enumerate(zip(args.local_tier, reports), start=1):
        print_tier_report(i, d, report)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"
    print(
        f"{len(rows)} checkpoints ({summary}); {len(uploads)} unfinished multipart uploads"
        + (
            f", {stale} older than {args.stale_after_hours:g} h (`ckptstore-tool gc` aborts them)"
            if stale
            else ""
        )
    )
    return 1 if corrupt else 0


def _tiers_only(tiers: list[str], ctx: Context) -> int:
    """``ls --local-tier DIR ...`` without a ROOT: each tier's report alone."""
    reports = [tier_report(d, None) for d in tiers]
    if ctx.json:
        dump_json({"local_tiers": [{"dir": d, "entries": r} for d, r in zip(tiers, reports)]})
        return 0
    for i, (d, report) in enumerate(zip(tiers, reports), start=1):
        print_tier_report(i, d, report)
    return 0
