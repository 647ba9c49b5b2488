"""Hugging Face ``Trainer`` + ``CkptStoreCallback`` on several processes (DDP on CPU gloo).

Real runs of ``hf_job.py`` under ``torchrun``: every rank uploads a share of each
checkpoint folder and the step commits once; a rank killed -9 mid-save leaves the
previous step the newest; on a machine with no local copy ``resume_from_checkpoint=True``
resumes exactly on 2 processes. Under ``accelerate launch`` a 2-process step resumes on 3
(DDP's optimizer and scheduler files are every rank's).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from ckptstore.engine.catalog import step_name  # noqa: E402
from ckptstore.stores import open_store  # noqa: E402
from tests.plugins.util import assert_equal_tree, committed, run_job, statuses  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))  # the job scripts' folder


def hf(tmp: str, root: str, steps: int, nproc: int, *extra: str, launcher: str = "torchrun"):
    argv = [
        os.path.join(HERE, "hf_job.py"),
        "--out",
        f"{tmp}/out",
        "--root",
        root,
        "--max-steps",
        str(steps),
    ]
    argv += ["--record", f"{tmp}/record.pt", *extra]
    return run_job(argv, timeout=150, **{launcher: nproc})


def record(tmp: str) -> dict:
    return torch.load(f"{tmp}/record.pt", weights_only=False)


def manifest(root: str, step: int) -> dict:
    return json.loads(open_store(root).child(step_name(step)).get("ckptstore.manifest.json"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """An uninterrupted 8-step run on 2 processes: (its directory, its record)."""
    tmp = str(tmp_path_factory.mktemp("hf-ref"))
    proc = hf(tmp, f"{tmp}/root", 8, 2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp, record(tmp)


def test_every_rank_uploads_a_share_and_the_step_commits_once(reference) -> None:
    tmp, _ = reference
    root = f"{tmp}/root"
    assert committed(root) == [4, 6, 8]  # KeepLast(3)
    doc = manifest(root, 8)
    assert doc["world_size"] == 2
    owners: dict[str, str] = {}
    for r in doc["ranges"]:
        owners[r["key"].split("@")[0]] = r["file"].split(".")[0]
    files = {k.removeprefix("folder/files/"): v for k, v in owners.items() if k != "folder/index"}
    # The whole folder, both ranks' RNG states included, each file uploaded by one rank.
    assert set(files) == set(os.listdir(f"{tmp}/out/checkpoint-8"))
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt"} <= set(files)
    assert set(files.values()) == {"__0_0", "__1_0"}


def test_rank_killed_mid_save_then_resume_on_a_new_machine_is_exact(
    tmp_path, root_url, reference
) -> None:
    _, ref = reference
    tmp = str(tmp_path)
    proc = hf(tmp, root_url, 8, 2, "--crash-at", "after_shards:3", "--crash-rank", "1")
    assert proc.returncode != 0, proc.stderr[-4000:]
    st = statuses(root_url)
    assert st[4] == "committed" and st.get(6) != "committed", st
    shutil.rmtree(f"{tmp}/out")  # a new machine: only the committed steps are left
    assert not os.path.exists(f"{tmp}/record.pt")

    proc = hf(tmp, root_url, 8, 2, "--resume")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rec = record(tmp)
    assert rec["start_step"] == 4
    assert_equal_tree(rec["start"], ref["by_step"][4])  # model and AdamW moments
    assert_equal_tree(rec["by_step"][8], ref["by_step"][8])  # same data order after resume
    assert committed(root_url) == [4, 6, 8]  # the torn 6 was redone
    assert manifest(root_url, 8)["world_size"] == 2


def test_two_process_checkpoint_resumes_on_three_under_accelerate_launch(
    tmp_path, reference
) -> None:
    ref_dir, ref = reference
    tmp = str(tmp_path)
    shutil.copytree(f"{ref_dir}/root", f"{tmp}/root")  # the committed steps only
    proc = hf(tmp, f"{tmp}/root", 10, 3, "--resume", launcher="accelerate")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rec = record(tmp)
    assert rec["start_step"] == 8
    assert_equal_tree(rec["start"], ref["by_step"][8])  # every rank loaded rank 0's state
    assert sorted(rec["by_step"]) == [9, 10]
    assert 10 in committed(f"{tmp}/root") and manifest(f"{tmp}/root", 10)["world_size"] == 3
    # Rank 0 wrote the committed folder back for all three; it has no RNG state for the
    # third rank, which the Trainer allows (it logs a warning and goes on).
    restored = set(os.listdir(f"{tmp}/out/checkpoint-8"))
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= restored
    assert "rng_state_2.pth" not in restored
