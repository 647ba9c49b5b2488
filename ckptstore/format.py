"""The on-storage format of ckptstore checkpoints, as one stable public API.

What a root holds, and the names to read, check, copy, convert and clean it up with, for
``ckptstore-tool`` and for third-party tools alike. The names here keep their meaning across
minor versions (a rename keeps the old name for one minor version, with a
``DeprecationWarning``); the modules they come from (``ckptstore.engine.*``,
``ckptstore.dcp.*``) are internal and may move. Like ``ckptstore`` itself, every name is
imported on first use, and only the last group needs torch: reading a root, its manifests,
markers and catalog, verifying, copying and cleaning up never import it.

The layout (``step_name(100)`` is ``step_000000100``)::

    <root>/
        ckptstore.owner.json                 OWNER_NAME: the live job's lease (read_owner)
        step_000000100/                      one step (STEP_PREFIX + 9 digits; parse_step)
            COMMITTED                        MARKER_NAME: the commit point; names the manifest
            ckptstore.manifest.json          MANIFEST_NAME: every file, size and CRC32C
            .metadata                        METADATA_NAME: DCP's metadata (load_metadata)
            __<rank>_<i>.distcp              shards (under <hh>/ with key_layout="spread")
            ckptstore.manifest.<a>.json      one attempt's own copies (attempt_manifest_name,
            .metadata.<a>                      attempt_metadata_name; attempt_of)
            ckptstore.fence.<a>.json         fence_name(a): where a commit and a deletion of
                                               attempt <a> meet
    <local tier>/job-<32 hex>/               a job's directory of a local tier (JOB_STAMP)

A step exists only once ``COMMITTED`` does and matches its manifest: ``open_committed``
checks that and returns the manifest (``Manifest``: ``files`` name -> ``FileEntry`` with
size and CRC32C; ``ranges``: the item ranges) and the ``.metadata`` bytes it vouches for;
``checkpoint_status`` says what a step holds without raising. Every read of a file ckptstore
sizes is bounded (``get_capped`` with ``MAX_MANIFEST_SIZE`` / ``MAX_METADATA_SIZE`` /
``MAX_MARKER_SIZE``). Listing never decides completeness: ``scan_root`` lists a root's steps
with their status and what it skipped (links, files named like steps) and left alone.

Groups of names:

* names and layout: ``STEP_PREFIX``, ``step_name``, ``parse_step``, ``MARKER_NAME``,
  ``MANIFEST_NAME``, ``METADATA_NAME``, ``OWNER_NAME``, ``JOB_STAMP``, ``TMP_MARK``,
  ``fence_name``, ``attempt_manifest_name``, ``attempt_metadata_name``, ``attempt_of``,
  ``is_ckptstore_file``, ``FORMAT_VERSION``;
* manifest and marker: ``Manifest`` (``Manifest.from_bytes``), ``FileEntry``,
  ``RangeEntry``, ``Marker``, ``crc32c``, ``format_crc``, ``parse_crc``, the bounded read
  ``get_capped`` and its limits;
* a committed step: ``open_committed``, ``Committed``, ``checkpoint_status``,
  ``CheckpointStatus``, ``uncommit`` (remove the marker first, so a step is never half
  committed while it is replaced);
* the catalog of a root: ``scan_root`` (``RootListing``, ``StepEntry``, ``Skipped``),
  ``list_steps``, ``committed_steps``, ``newer_steps``;
* verify and copy: ``verify_checkpoint`` (``VerifyReport``, ``FileCheck``, ``BadRange``),
  ``copy_checkpoint`` (``CopyResult``), ``check_empty_destination``;
* deletion and the owner lease (what ``ckptstore-tool gc`` uses beside
  ``ckptstore.plan_prune``): ``step_in_flight``, ``held_fences`` / ``HeldFence`` /
  ``release_held``, ``read_owner``, ``plan_repair`` / ``apply_repair`` (``RepairPlan``);
* codecs: ``codec_names``, ``stored_codec`` (the codec a manifest names, and whether it can
  be decoded here);
* a local tier (what ``ckptstore-tool ls --local-tier`` reads): ``open_local_tier``,
  ``survey_tier`` (``TierEntry``), ``TierJob``, ``open_tier_job``, ``tier_copy_files``,
  ``LOCAL_ONLY`` (a manifest's ``extra["tier"]`` of a step saved to the local tier alone);
* ``.metadata`` and shards (these import torch): ``load_metadata`` (DCP's metadata classes
  only, never a plain unpickle), ``check_metadata`` (its claims bounded by the files' sizes),
  ``load_safe_object`` (an object item, weights-only), ``CkptReader`` (the verifying DCP
  reader; ``StockCheckpointWarning`` for a checkpoint without a manifest), ``transcode``
  (DCP to DCP, item by item, with another codec).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptstore.dcp.metadata import load_metadata
    from ckptstore.dcp.metadata_bounds import check_metadata
    from ckptstore.dcp.reader import CkptReader, StockCheckpointWarning
    from ckptstore.dcp.safe_objects import load_safe_object
    from ckptstore.dcp.transcode import transcode
    from ckptstore.engine.bounded import (
        MAX_MANIFEST_SIZE,
        MAX_MARKER_SIZE,
        MAX_METADATA_SIZE,
        get_capped,
    )
    from ckptstore.engine.catalog import (
        RootListing,
        Skipped,
        StepEntry,
        committed_steps,
        list_steps,
        newer_steps,
        scan_root,
    )
    from ckptstore.engine.checksum import crc32c, format_crc, parse_crc
    from ckptstore.engine.codec_registry import codec_names, stored_codec
    from ckptstore.engine.commit import uncommit
    from ckptstore.engine.committed import (
        METADATA_NAME,
        CheckpointStatus,
        Committed,
        attempt_manifest_name,
        attempt_metadata_name,
        checkpoint_status,
        open_committed,
    )
    from ckptstore.engine.copy import CopyResult, check_empty_destination, copy_checkpoint
    from ckptstore.engine.deletion import HeldFence, held_fences, release_held, step_in_flight
    from ckptstore.engine.fence import fence_name
    from ckptstore.engine.manifest import (
        FORMAT_VERSION,
        MANIFEST_NAME,
        MARKER_NAME,
        FileEntry,
        Manifest,
        Marker,
        RangeEntry,
    )
    from ckptstore.engine.names import (
        JOB_STAMP,
        OWNER_NAME,
        STEP_PREFIX,
        TMP_MARK,
        attempt_of,
        is_ckptstore_file,
        parse_step,
        step_name,
    )
    from ckptstore.engine.owner import RepairPlan, apply_repair, plan_repair, read_owner
    from ckptstore.engine.store import Store
    from ckptstore.engine.verify import BadRange, FileCheck, VerifyReport, verify_checkpoint
    from ckptstore.tier.jobs import TierEntry, TierJob
    from ckptstore.tier.jobs import open_job as open_tier_job
    from ckptstore.tier.jobs import survey as survey_tier
    from ckptstore.tier.rules import LOCAL_ONLY
    from ckptstore.tier.rules import local_files as tier_copy_files

#: module -> the public names it gives under their own name, imported on first use. Only
#: the ``ckptstore.dcp`` modules import torch.
_FROM: dict[str, tuple[str, ...]] = {
    # names and layout
    "ckptstore.engine.names": (
        "STEP_PREFIX",
        "TMP_MARK",
        "OWNER_NAME",
        "JOB_STAMP",
        "step_name",
        "parse_step",
        "attempt_of",
        "is_ckptstore_file",
    ),
    "ckptstore.engine.fence": ("fence_name",),
    # manifest and marker
    "ckptstore.engine.manifest": (
        "FORMAT_VERSION",
        "MANIFEST_NAME",
        "MARKER_NAME",
        "Manifest",
        "FileEntry",
        "RangeEntry",
        "Marker",
    ),
    "ckptstore.engine.checksum": ("crc32c", "format_crc", "parse_crc"),
    "ckptstore.engine.bounded": (
        "MAX_MARKER_SIZE",
        "MAX_MANIFEST_SIZE",
        "MAX_METADATA_SIZE",
        "get_capped",
    ),
    # a committed step
    "ckptstore.engine.committed": (
        "METADATA_NAME",
        "attempt_manifest_name",
        "attempt_metadata_name",
        "open_committed",
        "Committed",
        "checkpoint_status",
        "CheckpointStatus",
    ),
    "ckptstore.engine.commit": ("uncommit",),
    # the catalog
    "ckptstore.engine.catalog": (
        "scan_root",
        "RootListing",
        "StepEntry",
        "Skipped",
        "list_steps",
        "committed_steps",
        "newer_steps",
    ),
    # verify and copy
    "ckptstore.engine.verify": ("verify_checkpoint", "VerifyReport", "FileCheck", "BadRange"),
    "ckptstore.engine.copy": ("copy_checkpoint", "CopyResult", "check_empty_destination"),
    # deletion and the owner lease
    "ckptstore.engine.deletion": ("step_in_flight", "HeldFence", "held_fences", "release_held"),
    "ckptstore.engine.owner": ("read_owner", "plan_repair", "apply_repair", "RepairPlan"),
    # codecs
    "ckptstore.engine.codec_registry": ("codec_names", "stored_codec"),
    # a local tier
    "ckptstore.tier.jobs": ("TierEntry", "TierJob"),
    "ckptstore.tier.rules": ("LOCAL_ONLY",),
    # .metadata and shards: these import torch
    "ckptstore.dcp.metadata": ("load_metadata",),
    "ckptstore.dcp.metadata_bounds": ("check_metadata",),
    "ckptstore.dcp.safe_objects": ("load_safe_object",),
    "ckptstore.dcp.reader": ("CkptReader", "StockCheckpointWarning"),
    "ckptstore.dcp.transcode": ("transcode",),
}

#: public name -> (module, its name there): every name of ``_FROM``, and the names given
#: here under another name than their module's.
_LAZY: dict[str, tuple[str, str]] = {
    **{name: (module, name) for module, names in _FROM.items() for name in names},
    "survey_tier": ("ckptstore.tier.jobs", "survey"),
    "open_tier_job": ("ckptstore.tier.jobs", "open_job"),
    "tier_copy_files": ("ckptstore.tier.rules", "local_files"),
}


def open_local_tier(directory: str) -> Store:
    """A node's local tier directory (``local_tier_dir``) as a volume store, to read with
    ``survey_tier`` and ``open_tier_job``. Paths below it are resolved from the
    directory's descriptor, never through a link."""
    from ckptstore.stores.local import LocalStore

    return LocalStore(directory)


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'ckptstore.format' has no attribute {name!r}")
    module, attr = where
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "open_local_tier",
    "STEP_PREFIX",
    "TMP_MARK",
    "OWNER_NAME",
    "JOB_STAMP",
    "step_name",
    "parse_step",
    "attempt_of",
    "is_ckptstore_file",
    "fence_name",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "Manifest",
    "FileEntry",
    "RangeEntry",
    "Marker",
    "crc32c",
    "format_crc",
    "parse_crc",
    "MAX_MARKER_SIZE",
    "MAX_MANIFEST_SIZE",
    "MAX_METADATA_SIZE",
    "get_capped",
    "METADATA_NAME",
    "attempt_manifest_name",
    "attempt_metadata_name",
    "open_committed",
    "Committed",
    "checkpoint_status",
    "CheckpointStatus",
    "uncommit",
    "scan_root",
    "RootListing",
    "StepEntry",
    "Skipped",
    "list_steps",
    "committed_steps",
    "newer_steps",
    "verify_checkpoint",
    "VerifyReport",
    "FileCheck",
    "BadRange",
    "copy_checkpoint",
    "CopyResult",
    "check_empty_destination",
    "step_in_flight",
    "HeldFence",
    "held_fences",
    "release_held",
    "read_owner",
    "plan_repair",
    "apply_repair",
    "RepairPlan",
    "codec_names",
    "stored_codec",
    "survey_tier",
    "TierEntry",
    "TierJob",
    "open_tier_job",
    "tier_copy_files",
    "LOCAL_ONLY",
    "load_metadata",
    "check_metadata",
    "load_safe_object",
    "CkptReader",
    "StockCheckpointWarning",
    "transcode",
]
