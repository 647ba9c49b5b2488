"""``ckptstore-tool gc ROOT --keep-last N [--keep-every K] [--dry-run]``;
``ckptstore-tool gc ROOT --repair [--apply]``.

Applies the retention policy the checkpoint manager uses (``ckptstore.manager.retention``), removes
torn leftovers and aborts stale multipart uploads (``ckptstore.manager.prune``). Never deletes the
newest committed checkpoint, a ``--protect``-ed step, or an incomplete step newer than the
newest commit (it may be a save in flight). Deletes only ckptstore's own files of canonical
``step_%09d`` directories; everything else under ROOT is listed as "not ckptstore's: left
alone".

``--repair`` looks at what only a person can clear. The root's owner file
(``ckptstore.owner.json``, ``ckptstore.format.plan_repair``): it removes one that is not a valid
lease (a link as a link, a FIFO, an oversized or garbled file) or a valid one whose holder
is stale or dead; never a live job's fresh lease, never a directory (it says to remove
that by hand). And save attempts whose commit fence keeps their files with no marker
(``ckptstore.format.held_fences``: a writer stopped or killed between its fence and its
marker; pruning leaves them, as that writer may still commit): it releases them, files and
fence, unless their writer's lease is fresh. Unlike pruning it is a dry run unless ``--apply`` is
given: it acts on the user's word that no writer of those is left, so only when asked.
"""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore import KeepEvery, KeepLast, RetentionPolicy, Store, apply_prune, plan_prune
from ckptstore.cli.context import Context, non_negative
from ckptstore.cli.render import dump_json, human_bytes, safe, table
from ckptstore.cli.sources import list_or_missing
from ckptstore.errors import ConfigError, InUseError
from ckptstore.format import HeldFence, apply_repair, held_fences, plan_repair, release_held

__all__ = ["add_parser", "run", "policy_from_args"]


def add_parser(sub: Any, common: Any) -> None:
    """Register ``gc`` on the subparsers ``sub`` (``common``: the shared flags)."""
    p = sub.add_parser(
        "gc",
        help="apply retention, remove torn leftovers, abort stale uploads",
        description="Delete committed checkpoints the retention policy lets go (never the "
        "newest), torn leftovers older than the newest commit, and stale multipart uploads.",
    )
    p.add_argument("root", metavar="ROOT", help="folder / prefix holding step_* checkpoints")
    p.add_argument("--keep-last", type=int, metavar="N", help="keep the N newest committed")
    p.add_argument(
        "--keep-every",
        type=int,
        metavar="K",
        help="also keep the first committed checkpoint of every K training steps",
    )
    p.add_argument(
        "--protect",
        type=int,
        action="append",
        default=[],
        metavar="STEP",
        help="never delete this step (repeatable): one being restored or saved",
    )
    p.add_argument(
        "--stale-after-hours",
        type=non_negative,
        default=24.0,
        help="abort unfinished multipart uploads older than this (default 24)",
    )
    p.add_argument("--dry-run", action="store_true", help="show what would go; change nothing")
    p.add_argument(
        "--repair",
        action="store_true",
        help="only look at the root's owner file (ckptstore.owner.json) and at save "
        "attempts whose commit fence keeps their files without a marker: show what would be "
        "removed (an owner file that is not a valid lease or is a stale/dead job's; attempts "
        "whose writer has no fresh lease); a dry run unless --apply is given",
    )
    p.add_argument(
        "--apply", action="store_true", help="with --repair: remove what it shows, as shown"
    )
    common(p)
    p.set_defaults(func=run)


def policy_from_args(keep_last: int | None, keep_every: int | None) -> RetentionPolicy:
    """``KeepLast(n) | KeepEvery(k)`` from the flags; at least one is required."""
    parts: list[RetentionPolicy] = []
    if keep_last is not None:
        parts.append(KeepLast(keep_last))
    if keep_every is not None:
        parts.append(KeepEvery(keep_every))
    if not parts:
        raise ConfigError("gc needs a retention policy: --keep-last N and/or --keep-every K")
    policy = parts[0]
    for p in parts[1:]:
        policy = policy | p
    return policy


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Run ``gc``; the exit status."""
    if args.repair:
        return _repair(args, ctx)
    if args.apply:
        raise ConfigError("--apply goes with --repair; gc prunes unless --dry-run is given")
    policy = policy_from_args(args.keep_last, args.keep_every)
    root = ctx.open(args.root)
    list_or_missing(root, args.root)
    plan = plan_prune(
        root, policy, protected=set(args.protect), stale_after_s=args.stale_after_hours * 3600
    )
    held = [] if args.dry_run else apply_prune(root, plan)
    verb = "would delete" if args.dry_run else "deleted"
    if ctx.json:
        dump_json(
            {
                "root": plan.root,
                "policy": plan.policy,
                "dry_run": args.dry_run,
                "steps": plan.steps,
                "uploads": [
                    {"path": u.path, "action": u.action, "reason": u.reason, "age_s": u.age_s}
                    for u in plan.uploads
                ],
                "left_alone": [{"path": a.path, "reason": a.reason} for a in plan.left_alone],
                "held": held,
                "deleted_steps": [d.step for d in plan.deletions],
                "aborted_uploads": len(plan.aborts),
                "freed_bytes": plan.freed_bytes,
            }
        )
        return 0
    if plan.steps:
        print(
            table(
                ["STEP", "STATUS", "SIZE", "ACTION", "REASON"],
                [
                    [
                        s.step,
                        s.status,
                        human_bytes(s.size),
                        (("would " if args.dry_run else "") + s.action)
                        if s.action == "delete"
                        else s.action,
                        s.reason,
                    ]
                    for s in plan.steps
                ],
                right={0, 2},
            )
        )
    for u in plan.uploads:
        act = ("would abort" if args.dry_run else "aborted") if u.action == "abort" else "kept"
        print(f"upload {safe(u.path)}: {act} ({safe(u.reason)})")
    uploads = {u.path for u in plan.uploads}
    for a in plan.left_alone:
        if a.path not in uploads:
            print(f"{safe(a.path)}: {safe(a.reason)}")
    for line in held:
        print(safe(line))
    print(
        f"policy {plan.policy}: {verb} {len(plan.deletions)} checkpoints "
        f"({human_bytes(plan.freed_bytes)}), "
        f"{'would abort' if args.dry_run else 'aborted'} {len(plan.aborts)} uploads"
    )
    return 0


def _repair(args: argparse.Namespace, ctx: Context) -> int:
    """``gc ROOT --repair [--apply]``: 0 when the owner file is fine or removed (or would
    be, in a dry run), 1 when something there needs removing by hand, 2 (``InUseError``)
    when ``--apply`` meets a live job's fresh owner lease. Held fences are shown (and
    released with ``--apply``) whatever the owner file's state."""
    if args.keep_last is not None or args.keep_every is not None or args.protect:
        raise ConfigError(
            "gc --repair takes no retention policy: run gc ROOT --keep-last N separately"
        )
    root = ctx.open(args.root)
    list_or_missing(root, args.root)
    act = args.apply and not args.dry_run
    try:
        plan = apply_repair(root) if act else plan_repair(root)
    except InUseError as exc:
        raise InUseError(f"{exc}; nothing was removed") from None
    attempts = [(h, _release(root, h, act)) for h in held_fences(root)]
    done = {
        "remove": "removed" if act else "would remove (add --apply to remove it)",
        "by_hand": "left alone: remove it by hand",
        "none": "nothing to do",
    }[plan.action]
    if ctx.json:
        dump_json(
            {
                "root": plan.root,
                "dry_run": not act,
                "action": plan.action,
                "done": act and plan.action == "remove",
                "reason": plan.reason,
                "held_fences": [
                    {"step": h.step, "attempt": h.attempt, "files": len(h.files), "done": d}
                    for h, d in attempts
                ],
            }
        )
    else:
        print(f"owner file: {done}: {safe(plan.reason)}")
        for h, d in attempts:
            print(f"{safe(h.describe())}, no marker: {d}")
    return 1 if plan.action == "by_hand" else 0


def _release(root: Store, held: HeldFence, act: bool) -> str:
    """Release ``held`` when ``act`` (and its writer is not alive); what was done."""
    if held.live is not None:
        return f"left alone: its writer is alive ({held.live.describe()})"
    if not act:
        return "would release its files and fence (add --apply to release them)"
    try:
        release_held(root, held)
    except InUseError as exc:  # its writer heartbeats again
        return f"left alone: {exc}"
    return "released"
