"""Where a job's copies lie in a node-local tier (``engine.tier_jobs``), for tests: each
job's step directories are in a directory of its own, ``<tier>/job-<hex>/``."""

from __future__ import annotations

import os

from ckptstore.engine.names import JOB_STAMP, step_name
from ckptstore.engine.tier_jobs import TierJob, is_job_name


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
