"""What ``ckptstore-tool ls --local-tier DIR`` reads from a node's local tiers.

For each committed step of the root: how many of its data files each local tier holds
with the recorded size, in the directory of the job (root and run) that wrote it
(``tier_counts``: its own shards and its peers' replicas); the steps saved to the local
tier alone (``local_only_steps``), which the bucket does not hold; and whose copies each
tier holds (``tier_report``): every job's root, run, steps and bytes, job directories whose
stamp is refused, and step directories of the layout before job directories. Everything
is read through ``ckptstore.format``'s local-tier names; a link is never followed.
"""

from __future__ import annotations

from typing import Any

from ckptstore import Store
from ckptstore.cli.render import human_bytes, safe, table
from ckptstore.errors import CkptStoreError
from ckptstore.format import (
    LOCAL_ONLY,
    METADATA_NAME,
    Manifest,
    TierEntry,
    TierJob,
    open_committed,
    open_local_tier,
    open_tier_job,
    step_name,
    survey_tier,
    tier_copy_files,
)

__all__ = ["local_only_steps", "print_tier_report", "tier_counts", "tier_report", "tiers_text"]


def _job_dir(tier: str, root_url: str, run: Any) -> Store | None:
    """The directory of the job (``root_url``, ``run``) in local tier ``tier``, its stamp
    checked; None when there is none or it is refused (the tier report says why)."""
    try:
        return open_tier_job(open_local_tier(tier), TierJob(root_url, run))
    except (OSError, CkptStoreError):  # ConfigError: a run that is no run; TierStampError
        return None


def tier_counts(
    tiers: list[str], root_url: str, name: str, manifest: Manifest
) -> list[dict[str, Any]]:
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
                held = len(set(tier_copy_files(job.child(name), manifest)) & set(data))
            except (OSError, CkptStoreError):
                held = 0
        out.append({"dir": d, "files": held, "of": len(data)})
    return out


def local_only_steps(tiers: list[str], root_url: str, listed: set[int]) -> dict[int, Manifest]:
    """The steps saved to the local tier alone by a job of root ``root_url`` (any run)
    that a directory of ``tiers`` can open (a node holding its marker: the coordinator's,
    and its peers), other than the steps ``listed`` already, each with its manifest."""
    found: dict[int, Manifest] = {}
    for d in tiers:
        try:
            jobs = [
                e for e in survey_tier(open_local_tier(d)) if e.kind == "job" and e.root == root_url
            ]
        except (OSError, CkptStoreError):
            continue
        for e in jobs:
            job = _job_dir(d, root_url, e.run)
            if job is None:
                continue
            for s in e.steps:
                if s in listed or s in found:
                    continue
                try:
                    m = open_committed(job.child(step_name(s))).manifest
                except (OSError, CkptStoreError):
                    continue  # no marker on this node, or damaged: another tier may say
                if m.extra.get("tier") != LOCAL_ONLY or m.extra.get("run") != e.run:
                    continue
                found[s] = m
    return found


def tier_report(tier: str, root_url: str | None) -> list[dict[str, Any]]:
    """Whose copies local tier directory ``tier`` holds: one dict per entry directly
    under it (``ckptstore.format.survey_tier``), ``this_root`` set on the jobs of
    ``root_url``."""
    return [
        {**_entry_fields(e), "this_root": e.root is not None and e.root == root_url}
        for e in survey_tier(open_local_tier(tier))
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


def tiers_text(row: dict[str, Any]) -> str:
    """``bucket, local 1: all, local 2: 2/3`` for a row with ``tiers`` (``not in the
    bucket, ...`` for a step saved to the local tier alone)."""
    parts = ["bucket" if row["durable"] else "not in the bucket"]
    for i, t in enumerate(row["tiers"], start=1):
        held = "all" if t["files"] == t["of"] else f"{t['files']}/{t['of']}"
        parts.append(f"local {i}: {held}")
    return ", ".join(parts)
