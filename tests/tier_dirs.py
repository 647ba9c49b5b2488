"""Where a job's copies lie in a node-local tier (``tier.jobs``), for tests: each
job's step directories are in a directory of its own, ``<tier>/job-<hex>/``."""

from __future__ import annotations

import json
import os

from ckptstore.engine.names import JOB_STAMP, step_name
from ckptstore.tier.jobs import TierJob, is_job_name


def job_dirs(tier: str) -> list[str]:
    """The job directories of ``tier``, sorted (none if ``tier`` is missing)."""
    names = sorted(os.listdir(tier)) if os.path.isdir(tier) else []
    return [os.path.join(tier, n) for n in names if is_job_name(n)]


def job_dir(tier: str, root: str | None = None, run: str | None = None) -> str:
    """The directory of job (``root``, ``run``) in ``tier``; without them, the tier's only
    job directory."""
    if root is not None and run is not None:
        return os.path.join(tier, TierJob(root, run).key)
    found = job_dirs(tier)
    assert len(found) == 1, f"{tier} holds {len(found)} job directories, not one"
    return found[0]


def step_dir(tier: str, step: int) -> str:
    """Step ``step``'s directory in ``tier``'s only job directory."""
    return os.path.join(job_dir(tier), step_name(step))


def steps_in(tier: str) -> list[str]:
    """The step directories in ``tier``'s only job directory (none without one), sorted."""
    found = job_dirs(tier)
    if not found:
        return []
    (only,) = found
    return sorted(n for n in os.listdir(only) if n.startswith("step_"))


def make_job_dir(tier: str, root: str, run: str) -> str:
    """Job (``root``, ``run``)'s directory of ``tier``, made with its stamp, as that job
    would have left it: a test then plants things in it before the job runs."""
    path = job_dir(tier, root, run)
    os.makedirs(path)
    with open(os.path.join(path, JOB_STAMP), "wb") as f:
        f.write(TierJob(root, run).stamp())
    return path


#: What ``plant_stamp`` puts where a job directory's stamp goes.
PLANTED = ["symlink", "fifo", "oversized", "garbage", "directory", "another job's", "wrong fields"]


def plant_stamp(path: str, what: str, other: TierJob) -> None:
    """Put ``what`` (one of ``PLANTED``) at ``path``, a job directory's stamp: a link to
    /etc/passwd, a FIFO, a sparse 1 GiB file, not JSON, a directory, ``other``'s stamp, or
    a stamp whose root is not text."""
    if what == "symlink":
        os.symlink("/etc/passwd", path)
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "oversized":
        with open(path, "wb") as f:
            f.truncate(1 << 30)  # sparse: costs nothing, read as nothing
    elif what == "garbage":
        with open(path, "wb") as f:
            f.write(b"[" * 5000)
    elif what == "directory":
        os.mkdir(path)
    elif what == "another job's":
        with open(path, "wb") as f:
            f.write(other.stamp())
    else:
        assert what == "wrong fields", what
        with open(path, "w") as f:
            json.dump({"ckptstore_tier_job": 1, "root": ["/x"], "run": "r"}, f)
