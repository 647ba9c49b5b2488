"""Names ckptstore gives things under a root, parsed in one place.

A root holds one directory (prefix) per step, named exactly ``step_<9 digits>``; inside a
step only the names below are ckptstore's (or stock DCP's). Everything else under a root
(a user's ``notes.txt``, a ``step_5`` directory, another tool's files) is not ours: it is
never deleted and never taken for part of a checkpoint.

Names of a step directory::

    COMMITTED                                     the commit marker
    ckptstore.manifest.json                       canonical manifest
    ckptstore.manifest.<attempt>.json             an attempt's own manifest
    .metadata, .metadata.<attempt>                DCP metadata (canonical / an attempt's;
                                                  stock DCP's temp .metadata.tmp)
    [<hh>/]__<rank>_<i>[.<attempt>].distcp        shard files (stock DCP's without attempt;
                                                  ``<hh>/`` with ``key_layout="spread"``)
    ckptstore.lease.<attempt>.json                a save in flight's lease (engine.lease)
    ckptstore.fence.<attempt>.json                where the attempt's commit and a deletion
                                                  meet (engine.fence)
    ckptstore.run.json                            in a local tier of the layout before
                                                  job directories: the run whose step the
                                                  directory holds (tier.jobs reports
                                                  it; the commit keeps it)
    <any of the above>.ckptstore-tmp-<hex>        a temp object of an unfinished write: a
                                                  volume's temp file, or an emulated
                                                  multipart upload's begin marker (32 hex)
                                                  and parts (32 + 8 hex; engine.emulated)

Directly under a root, ``ckptstore.owner.json`` is the root owner's lease
(``engine.owner``): ckptstore's, never listed as someone else's file.

A local tier holds one directory per job, ``job-<32 hex>/`` (``tier.jobs``),
with the job's stamp ``ckptstore.job.json`` and the job's step directories in it.

Pure functions; no I/O.
"""

from __future__ import annotations

import re

#: The values of ``key_layout``: shard files named flat, or spread over 256 prefixes.
KEY_LAYOUTS = ("flat", "spread")

__all__ = [
    "KEY_LAYOUTS",
    "STEP_PREFIX",
    "TMP_MARK",
    "OWNER_NAME",
    "JOB_STAMP",
    "RUN_STAMP",
    "step_name",
    "parse_step",
    "is_ckptstore_file",
    "attempt_of",
]

STEP_PREFIX = "step_"
#: Every temp object's name contains this (volumes write temp -> fsync -> rename; emulated
#: multipart uploads keep their begin marker and parts beside the target).
TMP_MARK = ".ckptstore-tmp-"

#: The root owner's lease, directly under a root (``engine.owner``).
OWNER_NAME = "ckptstore.owner.json"

#: In a local tier's job directory: the root and run of the job whose copies it holds
#: (``tier.jobs``).
JOB_STAMP = "ckptstore.job.json"

#: In a step directory directly under a local tier, the layout before job
#: directories: the run whose step it held (``tier.jobs`` reports it).
RUN_STAMP = "ckptstore.run.json"

_STEP = re.compile(r"^step_(\d{9})$")
_ATTEMPT = r"[0-9a-f]{1,64}"
_OURS = re.compile(
    r"^(?:"
    r"COMMITTED"
    rf"|ckptstore\.manifest(?:\.{_ATTEMPT})?\.json"
    rf"|ckptstore\.lease\.{_ATTEMPT}\.json"
    rf"|ckptstore\.fence\.{_ATTEMPT}\.json"
    r"|ckptstore\.run\.json"
    rf"|\.metadata(?:\.{_ATTEMPT}|\.tmp)?"
    rf"|(?:[0-9a-f]{{2}}/)?__\d+_\d+(?:\.{_ATTEMPT})?\.distcp"
    r")"
    rf"(?:{re.escape(TMP_MARK)}[0-9a-f]+)?$"
)
#: The files of one save attempt (its fence aside), temp objects of them included.
_OF_ATTEMPT = re.compile(
    r"^(?:"
    rf"ckptstore\.(?:manifest|lease)\.(?P<a>{_ATTEMPT})\.json"
    rf"|\.metadata\.(?P<b>{_ATTEMPT})"
    rf"|(?:[0-9a-f]{{2}}/)?__\d+_\d+\.(?P<c>{_ATTEMPT})\.distcp"
    r")"
    rf"(?:{re.escape(TMP_MARK)}[0-9a-f]+)?$"
)


def step_name(step: int) -> str:
    """The directory name of ``step``: ``step_000000100``."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= 999_999_999:
        raise ValueError(f"step must be a whole number in [0, 999999999], got {step!r}")
    return f"{STEP_PREFIX}{step:09d}"


def parse_step(name: str) -> int | None:
    """The step of a canonical step directory name (``step_000000100`` -> 100), else None.

    Only the exact form :func:`step_name` makes counts: ``step_5`` or ``step_0000000005``
    are someone else's directories, never a checkpoint.
    """
    m = _STEP.match(name[:-1] if name.endswith("/") else name)
    return int(m.group(1)) if m else None


def is_ckptstore_file(name: str) -> bool:
    """True if ``name`` (relative to a step directory, '/'-separated) is one ckptstore or
    stock DCP writes there; see the module docstring."""
    return _OURS.match(name) is not None


def attempt_of(name: str) -> str | None:
    """The save attempt whose file ``name`` (relative to a step directory) is: its own
    manifest, ``.metadata``, lease or shard file, or a temp object of one; None for the
    rest (the marker, canonical copies, stock DCP files, fences, a local tier's stamp)."""
    m = _OF_ATTEMPT.match(name)
    return None if m is None else (m.group("a") or m.group("b") or m.group("c"))
