"""A job that configures no logging still says what checkpointing did: one line per
committed save and one per restore, on rank 0, quiet with logging's own switch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

JOB = """
import logging, sys, torch
import torch.distributed as dist
from ckptstore import CheckpointManager
{setup}
if "RANK" in __import__("os").environ:
    dist.init_process_group("gloo")
root, staging = sys.argv[1], sys.argv[2]
state = {{"w": torch.ones(1000, 250)}}
with CheckpointManager(root, local_tier_dir=staging) as mgr:
    mgr.restore(state)
    for step in (1, 2):
        mgr.save(step, state)
with CheckpointManager(root, local_tier_dir=staging) as mgr:
    mgr.restore(state)
if dist.is_initialized():
    dist.destroy_process_group()
"""


def run(tmp_path, setup: str = "", ranks: int = 0) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB.format(setup=setup)))
    launcher = [sys.executable]
    if ranks:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    staging = str(tmp_path / "nvme")
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run(
        [*launcher, str(script), str(tmp_path / "root"), staging],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ckptstore: ")]


@pytest.mark.processes
def test_saves_and_restores_are_reported_without_logging_configured(tmp_path) -> None:
    said = lines(run(tmp_path).stderr)
    assert len(said) == 5, said
    assert said[0].startswith("ckptstore: no committed checkpoint under ")
    assert "step 1 committed to " in said[1] and "training blocked" in said[1]
    assert said[2].startswith("ckptstore: saves run on the ")  # the default, "auto", says
    assert "backend (background='auto': " in said[2]  # which it took, with the first commit
    assert "step 2 committed to " in said[3]
    assert said[4].startswith("ckptstore: restored step 2 from the tier copy in ")
    assert " MB) in " in said[4]


@pytest.mark.processes
def test_one_switch_makes_it_quiet(tmp_path) -> None:
    proc = run(tmp_path, 'logging.getLogger("ckptstore").setLevel(logging.WARNING)')
    assert lines(proc.stderr) == []


@pytest.mark.processes
def test_configured_logging_gets_the_records(tmp_path) -> None:
    proc = run(tmp_path, "logging.basicConfig(stream=sys.stdout, format='%(name)s|%(message)s')")
    assert lines(proc.stderr) == []
    got = [line for line in proc.stdout.splitlines() if line.startswith("ckptstore.report|")]
    assert len(got) == 5 and "restored step 2" in got[-1], proc.stdout


@pytest.mark.distributed
def test_only_rank_0_reports(tmp_path) -> None:
    proc = run(tmp_path, ranks=2)
    said = lines(proc.stderr)
    assert sum("committed to" in line for line in said) == 2, said  # one line per save
    assert sum("restored step 2" in line for line in said) == 1, said
