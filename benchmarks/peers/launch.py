"""Start a data.vs_peers run's ranks as torchrun would, and clean up after them.

``run_ranks`` starts ``world`` processes of ``python -m benchmarks.peers.rank`` with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), the store's
credentials and endpoint for every peer's client, and waits; a rank that fails gets the
others killed 10 s later (they would wait in a collective for ever). Mosaic's shared memory
that killed ranks leave in /dev/shm is removed after each run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import REPO_ROOT, rank_env
from harness.dist import free_port

__all__ = ["clean_peers_shm", "run_ranks"]


def run_ranks(spec: dict[str, Any], world: int, work: str, link: str, timeout: float) -> list[Any]:
    """``world`` rank processes under torchrun's environment; their results (None: killed)."""
    tag = f"{spec['contender']}-{spec['kind']}-{spec['phase']}-{time.monotonic_ns()}"
    spec_path = os.path.join(work, f"{tag}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port = free_port()
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    procs, outs = [], []
    for r in range(world):
        env = rank_env(
            r,
            world,
            port,
            AWS_ACCESS_KEY_ID=spec["s3"]["key"],
            AWS_SECRET_ACCESS_KEY=spec["s3"]["secret"],
            AWS_ENDPOINT_URL=link,
            S3_ENDPOINT_URL=link,  # Mosaic Streaming's variable
            AWS_ALLOW_HTTP="true",  # litdata's object_store client: the link is plain http
            AWS_REQUEST_CHECKSUM_CALCULATION="when_required",
            AWS_RESPONSE_CHECKSUM_VALIDATION="when_required",
        )
        out = os.path.join(work, f"{tag}.rank{r}.json")
        outs.append(out)
        log = open(os.path.join(work, f"{tag}.rank{r}.log"), "w")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.peers.rank", spec_path, out],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout
    failed_at = None
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
        done = [p for p in procs if p.poll() is not None]
        if failed_at is None and any(p.returncode not in (0, -9) for p in done):
            failed_at = time.monotonic()
        if failed_at is None and any(_has_error(o) for o in outs):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > 10:
            break  # one rank failed; the others wait in a collective for ever
    for p in procs:  # the ranks' DataLoader workers and helpers, if any were left
        try:
            os.killpg(p.pid, 9)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()
    _remove_new_shm(shm_before)
    results = []
    for r, out in enumerate(outs):
        if os.path.exists(out):
            with open(out) as f:
                results.append(json.load(f))
        else:
            with open(os.path.join(work, f"{tag}.rank{r}.log")) as f:
                tail = f.read()[-1200:]
            code = procs[r].returncode
            results.append({"rank": r, "killed": True, "log_tail": f"exit {code}; {tail}"})
    return results


def _remove_new_shm(before: set[str]) -> None:
    """Mosaic's shared memory (``/dev/shm/NNNNNN_*``) that this run's ranks left behind.

    A killed rank cannot unlink it, and a stale prefix makes the next job's local ranks
    disagree on where to coordinate (they then download the same shard file at once).
    """
    if not os.path.isdir("/dev/shm"):
        return
    for name in set(os.listdir("/dev/shm")) - before:
        if re.fullmatch(r"\d{6}_\w+", name):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def _has_error(path: str) -> bool:
    try:
        with open(path) as f:
            return "error" in json.load(f)
    except (OSError, ValueError):
        return False


def clean_peers_shm() -> None:
    try:
        from benchmarks.peers.contenders import import_streaming

        import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    except Exception:  # noqa: BLE001 - best effort between runs
        pass
