"""One job per checkpoint root: a second live job is refused, naming the first; never
mixed in silently (trust rule 6; FAULTS row 29).

* a live manager of another run (a real process) owns the root: a save of ours raises
  ``RootInUseError`` naming its run, host, pid and heartbeat age, and writes nothing;
  once that process is killed, its lease protects nothing and our save goes ahead;
* a lease of the same run (a worker torchrun restarted, ``run_id``) is taken over; a
  stale lease of another run (no heartbeat for ``STALE_AFTER_S``) too; a fresh one is not;
* a step another run committed is replaced when saved again, never skipped as "already
  committed"; restoring one says which run wrote it (and a restore of our own does not).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest
import torch

from ckptstore.engine.committed import open_committed
from ckptstore.engine.lease import STALE_AFTER_S
from ckptstore.engine.names import OWNER_NAME
from ckptstore.engine.owner import read_owner, run_identity
from ckptstore.errors import ConfigError, RootInUseError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.records import SaveStatus
from tests.cli.conftest import Backend, script_env, step

_HOLDER = r"""
import json, sys, time, torch
from ckptstore.manager import CheckpointManager
mgr = CheckpointManager(sys.argv[1], storage_options=json.loads(sys.argv[2]) or None)
mgr.save(1, {"w": torch.ones(4)})
mgr.wait()
print("ready", mgr.run_id, flush=True)
time.sleep(600)
"""


def _env(**extra: str) -> dict[str, str]:
    env = script_env(**extra)
    for var in ("CKPTSTORE_RUN_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        if var not in extra:
            env.pop(var, None)
    env.pop("SLURM_JOB_ID", None)
    return env


def _manager(backend: Backend, root_url: str, **kw) -> CheckpointManager:
    kw.setdefault("background", "thread")  # what is tested is the owner file, not the writer
    return CheckpointManager(root_url, storage_options=backend.options or None, **kw)


def _lease(run: str, age_s: float = 0.0) -> bytes:
    """An owner lease of ``run`` held on another machine (its pid cannot be checked)."""
    return json.dumps(
        {
            "ckptstore_lease": 1,
            "run": run,
            "host": "node-17",
            "pid": 4242,
            "node": "another-boot:1",
            "token": "abc",
            "time": time.time() - age_s,
            "attempt": "",
        }
    ).encode()


@pytest.mark.processes  # the other job is a real process
def test_a_second_live_job_is_refused_naming_the_first(backend: Backend, root_url: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, root_url, json.dumps(backend.options)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().split()
        assert line[:1] == ["ready"], holder.stderr.read() if holder.stderr else ""
        other_run = line[1]
        mgr = _manager(backend, root_url)
        assert mgr.run_id != other_run
        with pytest.raises(RootInUseError) as info:
            mgr.save(2, {"w": torch.zeros(4)})
        text = str(info.value)
        for part in (repr(other_run), f"pid {holder.pid}", "heartbeat", "run_id"):
            assert part in text, text
        assert mgr.steps() == [1]  # nothing of ours was written
        assert not backend.open(root_url).find("step_000000002")
        holder.kill()  # the other job dies: its lease protects nothing any more
        holder.wait(30)
        assert mgr.save(2, {"w": torch.zeros(4)})
        mgr.wait()
        assert mgr.records[-1].status == SaveStatus.COMMITTED
        owner = read_owner(backend.open(root_url))
        assert owner is not None and owner.run == mgr.run_id and owner.pid == os.getpid()
        mgr.close()
        assert not backend.open(root_url).exists(OWNER_NAME)  # freed at close
    finally:
        holder.kill()
        holder.wait(30)


def test_same_run_takes_over_and_stale_leases_are_taken(
    backend: Backend, root_url: str, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    from ckptstore.engine import owner

    monkeypatch.setattr(owner, "PROBE_S", 1.0)  # the watch of a lease nobody rewrites
    root = backend.open(root_url)
    root.put(OWNER_NAME, _lease("job-1"))  # fresh, on another machine, but nobody beats
    with caplog.at_level(logging.WARNING, "ckptstore.engine.owner"):
        with _manager(backend, root_url, run_id="job-2") as mgr:  # a job that died moments
            assert mgr.save(1, {"w": torch.ones(4)})  # ago (preempted, rescheduled): taken
            mgr.wait()
    assert "taking over" in caplog.text and "'job-1'" in caplog.text
    with _manager(backend, root_url, run_id="job-1") as mgr:  # the same run, restarted
        assert mgr.save(1, {"w": torch.ones(4)})
        mgr.wait()
        assert read_owner(root).run == "job-1"  # type: ignore[union-attr]
    root.put(OWNER_NAME, _lease("job-1", age_s=STALE_AFTER_S + 10))  # a dead job's
    with _manager(backend, root_url, run_id="job-2") as mgr:
        assert mgr.save(2, {"w": torch.ones(4)})
        mgr.wait()
        assert mgr.records[-1].status == SaveStatus.COMMITTED
    assert not root.exists(OWNER_NAME)


def test_a_step_of_another_run_is_replaced_not_skipped(
    backend: Backend, root_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with _manager(backend, root_url, run_id="run-a") as a:
        a.save(5, {"w": torch.full((4,), 1.0)})
    with _manager(backend, root_url, run_id="run-b") as b:
        assert b.save(5, {"w": torch.full((4,), 2.0)})  # never "already committed"
        b.wait()
        assert b.records[-1].status == SaveStatus.COMMITTED
    manifest = open_committed(backend.open(step(root_url, 5))).manifest
    assert manifest.extra["run"] == "run-b"
    with _manager(backend, root_url, run_id="run-b") as b:
        assert not b.save(5, {"w": torch.full((4,), 3.0)})  # its own: skipped, as before
    out = {"w": torch.zeros(4)}
    with caplog.at_level(logging.WARNING, logger="ckptstore.manager.manager"):
        with _manager(backend, root_url, run_id="run-c") as c:
            assert c.restore(out) == 5
    assert torch.equal(out["w"], torch.full((4,), 2.0))
    assert "written by run 'run-b'; this is run 'run-c'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ckptstore.manager.manager"):
        with _manager(backend, root_url, run_id="run-b") as b:
            assert b.restore(out) == 5
    assert "written by" not in caplog.text  # no false warning for our own run


def test_run_identity_is_stable_across_torchrun_restarts(monkeypatch) -> None:
    for var in ("CKPTSTORE_RUN_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert run_identity().startswith("proc:") and run_identity().endswith(f":{os.getpid()}")
    assert run_identity("mine") == "mine"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --rdzv-id
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert run_identity().endswith(f":{os.getppid()}")  # the agent, which outlives workers
    assert run_identity().startswith("torchrun:")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "rdzv-77")
    assert run_identity() == "torchelastic:rdzv-77"
    monkeypatch.setenv("CKPTSTORE_RUN_ID", "exp-3")
    assert run_identity() == "exp-3"
    with pytest.raises(ConfigError):
        run_identity("two words")
    with pytest.raises(ConfigError):
        CheckpointManager("/nonexistent-unused", run_id="bad\x1b[31m")
