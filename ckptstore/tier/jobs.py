"""Whose copies a local tier holds: one directory per job, and the stamp that says so.

Several jobs on a node may share one ``local_tier_dir`` (one NVMe per node). A tier
copy is used only by the job that made it (DESIGN.md, trust rule 9), and a job is a root
and a run (``TierJob``). So each job keeps its copies in a directory of its own::

    <local_tier_dir>/job-<32 hex>/              the job's directory: the hex is a hash of
        ckptstore.job.json                      its root URL and run; the stamp records
        step_000000100/ ...                     both (``TierJob.stamp``), written before
                                                anything else in the directory

Two jobs never share a step directory, and a job reads, writes, trims and evicts only in
its own directory, and only once its stamp has been read and found to be its own
(``open_job``, at every use). A stamp that is missing from a directory holding anything,
not a regular file (a symlink, FIFO, directory), larger than ``MAX_STAMP_BYTES``, not a
stamp, or another job's is a ``TierStampError`` naming the directory: nothing in it is
used, written or deleted. Other jobs' directories are never opened except to report them.

The layout before job directories kept step directories directly under the tier
(``local_tier_dir/step_*``, stamped with the run alone, ``RUN_STAMP``): nothing there
records the root, so no job can prove such a copy its own. They are never used or
deleted; ``survey`` reports them (``ckptstore-tool ls --local-tier``), with everything else
in the tier: each job directory's root, run, steps and bytes. ``check_local_tier_dir``
refuses a tier directory that overlaps the root (pure ``os.path`` arithmetic).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

from ckptstore.engine.bounded import get_capped
from ckptstore.engine.catalog import scan_root
from ckptstore.engine.lease import check_run_id
from ckptstore.engine.names import JOB_STAMP, RUN_STAMP, TMP_MARK, parse_step
from ckptstore.engine.store import Store
from ckptstore.errors import (
    CkptStoreError,
    CommitConflictError,
    ConfigError,
    CorruptCheckpointError,
    StoreNotFoundError,
    TierStampError,
    UnsafePathError,
)
from ckptstore.stores.local import LocalStore

__all__ = [
    "MAX_ROOT_CHARS",
    "MAX_STAMP_BYTES",
    "TierEntry",
    "TierJob",
    "TierSpec",
    "check_local_tier_dir",
    "is_job_name",
    "open_job",
    "parse_stamp",
    "stored_bytes",
    "survey",
]

#: A job's root URL, as its stamp records it, is at most this long.
MAX_ROOT_CHARS = 4096
#: A stamp is read as at most this many bytes (the longest a valid one can be, with room).
MAX_STAMP_BYTES = 32 << 10
#: The stamp's format (``"ckptstore_tier_job"``).
_VERSION = 1
_JOB = re.compile(r"^job-[0-9a-f]{32}$")


def is_job_name(name: str) -> bool:
    """True for the name of a job directory of a tier (``job-<32 hex>``)."""
    return _JOB.match(name) is not None


@dataclass(frozen=True)
class TierJob:
    """The job a tier copy belongs to: the root URL its steps are saved to (as its
    store names it) and its run identity (``engine.owner.run_identity``). ``ConfigError``
    for a root that is empty, longer than ``MAX_ROOT_CHARS`` or holds a character that is
    not printable, or a run that is not a run identity (``engine.lease.check_run_id``):
    so a stamp's text is safe in a message."""

    root: str
    run: str

    def __post_init__(self) -> None:
        if not _good_root(self.root):
            raise ConfigError(
                f"a local tier records its job's root URL, 1-{MAX_ROOT_CHARS} printable "
                f"characters; got {self.root[:100]!r} ({len(self.root)} characters)"
            )
        try:
            check_run_id(self.run)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def key(self) -> str:
        """The name of the job's directory in a tier: ``job-`` and 32 hex digits of the
        SHA-256 of its root and run (two jobs that differ in either never share it)."""
        digest = hashlib.sha256(json.dumps([self.root, self.run]).encode()).hexdigest()
        return f"job-{digest[:32]}"

    def stamp(self) -> bytes:
        """The stamp of the job's directory: its root and run, as JSON."""
        doc = {"ckptstore_tier_job": _VERSION, "root": self.root, "run": self.run}
        return json.dumps(doc, sort_keys=True).encode()

    def describe(self) -> str:
        """``run R of root U``, for messages (both printable, as ``TierJob`` checks)."""
        return f"run {self.run} of root {self.root}"


@dataclass(frozen=True)
class TierSpec:
    """Where one job's copies lie on a node: the tier's directory (``local_tier_dir``) and
    the job. Small, frozen and picklable: what ``LocalTier.spec`` hands the save step, in
    the save thread or the writer process (``tier.tier_writer.TierWriter``)."""

    path: str
    job: TierJob

    def store(self) -> Store:
        """The tier's directory, as a store (every job's directories are below it)."""
        return LocalStore(self.path)

    def open(self, *, create: bool = False) -> Store | None:
        """The job's directory, its stamp checked (``open_job``)."""
        return open_job(self.store(), self.job, create=create)


def _good_root(root: object) -> bool:
    return isinstance(root, str) and 0 < len(root) <= MAX_ROOT_CHARS and root.isprintable()


def parse_stamp(data: bytes, where: str) -> TierJob:
    """The job a stamp read from ``where`` names; ``TierStampError`` saying why it is not
    a stamp (too large, not JSON, another format, a field that is not a root or a run)."""
    if len(data) > MAX_STAMP_BYTES:
        raise TierStampError(f"{where}: {len(data)} bytes, more than a stamp can be")
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise TierStampError(f"{where}: not a stamp (not JSON)") from None
    version = doc.get("ckptstore_tier_job") if isinstance(doc, dict) else None
    if isinstance(version, bool) or version != _VERSION:
        raise TierStampError(f"{where}: not a version-{_VERSION} ckptstore tier stamp")
    root, run = doc.get("root"), doc.get("run")
    if not isinstance(root, str) or not isinstance(run, str):
        raise TierStampError(f"{where}: the stamp's root or run is not text")
    try:
        return TierJob(root, run)
    except ConfigError as exc:
        raise TierStampError(f"{where}: {exc}") from None


def _read_stamp(job_dir: Store) -> TierJob | None:
    """The job ``job_dir``'s stamp names; None when there is no stamp (or no directory).
    ``TierStampError`` when it is not a regular file (never read then), larger than
    ``MAX_STAMP_BYTES`` (not read beyond it) or not a stamp."""
    where = job_dir.describe(JOB_STAMP)
    try:
        data = get_capped(job_dir, JOB_STAMP, MAX_STAMP_BYTES, advice="")
    except StoreNotFoundError:
        return None
    except CorruptCheckpointError as exc:  # UnsafePathError: a link, a FIFO; oversized
        raise TierStampError(str(exc)) from None
    return parse_stamp(data, where)


def _refusal(tier: Store, name: str, why: str) -> TierStampError:
    """The error for job directory ``name`` of ``tier``, not this job's because of ``why``."""
    return TierStampError(
        f"{why.rstrip('.')}: {tier.describe(name)} cannot be shown to be this job's, so "
        "nothing in it is used, written or deleted. ckptstore never leaves a job directory "
        "so: remove it if no job needs it (`ckptstore-tool ls --local-tier "
        f"{tier.url}` shows whose copies the tier holds), or give this job another "
        "local_tier_dir"
    )


#: What a listing's kinds are, in words.
_KINDS = {"file": "regular file", "link": "symlink", "other": "FIFO, socket or device"}


def open_job(tier: Store, job: TierJob, *, create: bool = False) -> Store | None:
    """``job``'s directory of ``tier`` (a local tier's store), its stamp read and found
    to be ``job``'s; None when there is none (``create``: made then, its stamp first).

    ``TierStampError`` when the directory is there but not provably ``job``'s: its stamp
    is another job's, not a regular file, oversized or not a stamp, or missing while the
    directory holds anything (ckptstore writes the stamp before anything else); or the
    name is not a directory. A directory that is a symlink is never entered."""
    name = job.key
    job_dir = tier.child(name)
    try:
        found = _read_stamp(job_dir)
        if found is None:
            listed = job_dir.listdir()
            if JOB_STAMP not in listed:
                held = [n for n in listed if not n.startswith(JOB_STAMP + TMP_MARK)]
                if held:
                    raise TierStampError(
                        f"{job_dir.describe(JOB_STAMP)} is missing, and the directory holds "
                        f"{len(held)} entries ({', '.join(held[:3])})"
                    )
                if not create:
                    return None
                try:
                    job_dir.put_if_absent(JOB_STAMP, job.stamp())
                except CommitConflictError:
                    pass  # another stamp won the race: read below
            # else another rank stamped it since the read (and may have written after
            # it): the stamp decides, read again
            found = _read_stamp(job_dir)
    except (TierStampError, UnsafePathError) as exc:  # a link where the directory was
        raise _refusal(tier, name, str(exc)) from None
    except CkptStoreError:
        kind = next((e.kind for e in tier.scan() if e.name == name), "dir")
        if kind != "dir":  # the act failed on it (ENOTDIR): say what it is
            why = f"{tier.describe(name)} is a {_KINDS.get(kind, kind)}, not a directory"
            raise _refusal(tier, name, why) from None
        raise
    if found != job:
        what = "no stamp" if found is None else f"the stamp of {found.describe()}"
        raise _refusal(tier, name, f"{job_dir.describe(JOB_STAMP)} holds {what}")
    return job_dir


def stored_bytes(store: Store, prefix: str = "") -> int:
    """The bytes of the regular files below ``prefix`` of ``store``, as the store lists and
    sizes them (on a volume: resolved from its root's descriptor; a link is neither
    followed nor counted). A file gone meanwhile counts nothing."""
    total = 0
    for path in store.find(prefix):
        try:
            total += store.size(path)
        except CkptStoreError:  # deleted, or swapped for a link, since the listing
            continue
    return total


@dataclass(frozen=True)
class TierEntry:
    """One entry directly under a local tier, as ``survey`` found it.

    ``kind``: ``"job"`` (a job directory: ``root`` and ``run`` from its stamp, or
    ``problem`` saying why the stamp is refused), ``"legacy"`` (a step directory of the
    layout before job directories: ``run`` from its run stamp, if readable; the root was
    never recorded) or ``"other"`` (not ckptstore's; ``problem`` says what it is).
    ``steps``: the step directories it holds; ``bytes``: its regular files' bytes."""

    name: str
    kind: str
    root: str | None = None
    run: str | None = None
    steps: tuple[int, ...] = ()
    bytes: int = 0
    problem: str = ""


def survey(tier: Store) -> list[TierEntry]:
    """Every entry directly under ``tier`` (a local tier's store), by name: whose
    copies it holds (stamps read with the same caps and refusals as ``open_job``; links
    never followed). Reads, never writes."""
    out = []
    for e in tier.scan():
        try:
            out.append(_entry(tier, e.name, e.kind))
        except CkptStoreError as exc:  # changed since the listing (a link swapped in)
            out.append(TierEntry(e.name, "other", problem=str(exc)))
    return out


def _entry(tier: Store, name: str, kind: str) -> TierEntry:
    step = parse_step(name)
    if kind == "dir" and is_job_name(name):
        return _job_entry(tier, name)
    if kind == "dir" and step is not None:
        run = _legacy_run(tier.child(name))
        return TierEntry(name, "legacy", run=run, steps=(step,), bytes=stored_bytes(tier, name))
    size = stored_bytes(tier, name) if kind in ("dir", "file") else 0
    what = "directory" if kind == "dir" else kind
    return TierEntry(name, "other", bytes=size, problem=f"not ckptstore's ({what})")


def _job_entry(tier: Store, name: str) -> TierEntry:
    job_dir = tier.child(name)
    root = run = None
    problem = ""
    try:
        found = _read_stamp(job_dir)
    except TierStampError as exc:
        problem = str(exc)
    else:
        if found is None:
            problem = f"{job_dir.describe(JOB_STAMP)} is missing"
        elif found.key != name:
            problem = f"its stamp names {found.describe()}, whose directory is {found.key}"
        else:
            root, run = found.root, found.run
    steps = tuple(s.step for s in scan_root(job_dir, with_status=False).steps)
    return TierEntry(name, "job", root, run, steps, stored_bytes(tier, name), problem)


def _legacy_run(step_dir: Store) -> str | None:
    """The run an older ckptstore stamped step directory ``step_dir`` with; None if its
    stamp is missing or not one."""
    try:
        doc = json.loads(get_capped(step_dir, RUN_STAMP, 4096, advice=""))
        run = check_run_id(doc.get("run") if isinstance(doc, dict) else None)
    except (CkptStoreError, ValueError, RecursionError):
        return None
    return run


def _local_path(url: str) -> str | None:
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("file", "local"):
        url = rest
    elif sep:
        return None  # an object store: it cannot overlap a local directory
    return os.path.realpath(os.path.abspath(os.path.expanduser(url)))


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def check_local_tier_dir(root_url: str, local_tier_dir: str | None) -> None:
    """ConfigError if the local ``local_tier_dir`` is, is inside, or holds the root ``root_url``.

    The local tier trims its own old copies; sharing a directory with the root would let
    it delete committed checkpoints (and retention would count the tier copies).
    """
    if not local_tier_dir:
        return
    root, tier = _local_path(root_url), _local_path(local_tier_dir)
    if root is None or tier is None:
        return
    if root == tier:
        why = "is the checkpoint root itself"
    elif _inside(tier, root):
        why = f"is inside the checkpoint root {root_url}"
    elif _inside(root, tier):
        why = f"holds the checkpoint root {root_url}"
    else:
        return
    raise ConfigError(
        f"local_tier_dir {local_tier_dir!r} {why}; the local tier must be a directory of its "
        "own (e.g. node-local NVMe such as /local_nvme/ckpt), outside the root and not "
        "above it."
    )
