"""kill -9 at named points of a 2-rank torchrun job, then resume: bitwise equal to a clean run.

Every job runs under torchrun's defaults (its shared rendezvous store included): the
environment is the test's own minus any opt-out a developer may have set.
"""

import os
import re
import subprocess
import sys

import pytest
import torch

from ckptstore.engine.catalog import list_steps
from ckptstore.stores.local import LocalStore

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "train_loop.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def job_env(crash: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTSTORE_CRASH")}
    env.update(GLOO_SOCKET_IFNAME="lo", PYTHONPATH=REPO, OMP_NUM_THREADS="1", **(crash or {}))
    return env


def loop_args(root: str, out: str, staging: str | None, extra: tuple[str, ...]) -> list[str]:
    tier = ["--local-tier", staging] if staging else []
    return [SCRIPT, "--root", root, "--out", out, *tier, *extra]


def torchrun(
    root: str,
    out: str,
    staging: str | None,
    crash: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
    max_restarts: int = 0,
) -> int:
    return torchrun_output(root, out, staging, crash, extra, max_restarts).returncode


def torchrun_output(
    root: str,
    out: str,
    staging: str | None,
    crash: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
    max_restarts: int = 0,
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", str(max_restarts), *loop_args(root, out, staging, extra)]
    return subprocess.run(cmd, env=job_env(crash), capture_output=True, text=True, timeout=240)


def final_state(out: str) -> list[dict]:
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]


def assert_same(a: list[dict], b: list[dict]) -> None:
    for ra, rb in zip(a, b):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
        for pid, st in ra["optim"]["state"].items():
            for k, v in st.items():
                assert torch.equal(v, rb["optim"]["state"][pid][k]), (pid, k)
        assert torch.equal(ra["rng"], rb["rng"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    d = tmp_path_factory.mktemp("ref")
    assert torchrun(str(d / "root"), str(d / "out"), None) == 0
    return final_state(str(d / "out"))


@pytest.mark.parametrize(
    "crash",
    [
        {"CKPTSTORE_CRASH_AT": "after_shards:3", "CKPTSTORE_CRASH_RANK": "1"},
        {"CKPTSTORE_CRASH_AT": "before_marker:3", "CKPTSTORE_CRASH_RANK": "0"},
        {"CKPTSTORE_CRASH_AT": "mid_upload:3", "CKPTSTORE_CRASH_RANK": "1"},
    ],
    ids=["rank1-after-shards", "coordinator-before-marker", "rank1-mid-upload"],
)
def test_kill_then_resume_is_bitwise_exact(tmp_path, reference, crash) -> None:
    root, out, staging = str(tmp_path / "root"), str(tmp_path / "out"), str(tmp_path / "nvme")
    assert torchrun(root, out, staging, crash) != 0  # the job died
    entries = list_steps(LocalStore(root))
    assert any(e.status != "committed" for e in entries)  # a torn save was left behind
    committed_before = [e.step for e in entries if e.status == "committed"]
    assert committed_before  # ... and an earlier one committed
    assert torchrun(root, out, staging) == 0
    assert_same(final_state(out), reference)
    after = list_steps(LocalStore(root))
    assert all(e.status == "committed" for e in after)  # torn leftovers were cleaned


@pytest.mark.parametrize("background", ["thread", "process"])
def test_sigterm_on_one_rank_takes_a_final_checkpoint_and_resumes_exactly(
    tmp_path, reference, background
):
    """In process mode the writer gets SIGTERM too (as from a scheduler) and ignores it."""
    root, out, staging = str(tmp_path / "root"), str(tmp_path / "out"), str(tmp_path / "nvme")
    mode = ("--background", background)
    assert torchrun(root, out, staging, extra=("--preempt-at", "7", *mode)) == 0
    assert not os.path.exists(f"{out}.0")  # stopped early...
    steps = [e.step for e in list_steps(LocalStore(root)) if e.status == "committed"]
    assert steps[-1] == 7  # ... with a final checkpoint at the preempted step
    assert torchrun(root, out, staging, extra=mode) == 0
    assert_same(final_state(out), reference)


def committed(root: str) -> list[int]:
    return [e.step for e in list_steps(LocalStore(root)) if e.status == "committed"]


@pytest.mark.parametrize("background", ["thread", "process"])
def test_first_restart_resumes_under_torchrun_defaults(tmp_path, reference, background):
    """kill -9 of rank 1 while a save uploads, ``--max-restarts 1``: the first restart (the
    only one allowed) joins, restores the newest committed step and ends bitwise exact."""
    root, out, staging = str(tmp_path / "root"), str(tmp_path / "out"), str(tmp_path / "nvme")
    extra = ("--kill-at", "7", "--kill-rank", "1", "--background", background)
    proc = torchrun_output(root, out, staging, extra=extra, max_restarts=1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from None (restart count 0)" in proc.stdout
    resumed = re.search(r"resumed from (\d+) \(restart count 1\)", proc.stdout)
    assert resumed, proc.stdout  # the first restart resumed, from a step saved before the kill
    assert int(resumed.group(1)) in (3, 6)  # 6 if its upload finished before the kill
    assert_same(final_state(out), reference)


def test_torchrun_hands_every_attempt_the_same_store(tmp_path):
    """The root cause, shown: with torchrun's defaults a restarted worker gets the same
    store (same MASTER_PORT) with the dead attempt's keys still in it, so anything keyed by
    a name that restarts at the same value (gloo's group addresses) reads stale values."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, signal, torch.distributed as dist\n"
        "store = dist.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']),"
        " is_master=False)\n"
        "attempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "if attempt == '0':\n"
        "    store.set('probe', os.environ['MASTER_PORT'])\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "print('stale', bytes(store.get('probe')).decode() == os.environ['MASTER_PORT'])\n"
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += ["1", "--max-restarts", "1", str(probe)]
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stale True" in proc.stdout
