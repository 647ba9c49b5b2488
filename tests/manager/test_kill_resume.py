"""kill -9 at named points of a 2-rank torchrun job, then resume: bitwise equal to a clean run."""

import os
import subprocess
import sys

import pytest
import torch

from ckptstore.catalog import list_steps
from ckptstore.stores.local import LocalStore

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "train_loop.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def torchrun(
    root: str,
    out: str,
    staging: str | None,
    crash: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTSTORE_CRASH")}
    env.update(GLOO_SOCKET_IFNAME="lo", PYTHONPATH=REPO, OMP_NUM_THREADS="1", **(crash or {}))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "0",
        SCRIPT,
        "--root",
        root,
        "--out",
        out,
    ]
    if staging:
        cmd += ["--staging", staging]
    cmd += list(extra)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    return proc.returncode


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
