"""Lightning ``CkptStoreIO`` with ``strategy="ddp"`` on 2 CPU gloo processes.

Real runs of ``lightning_job.py`` under Lightning's own launcher (the script starts its
second rank itself) and under ``torchrun``: every rank writes its share of each step, the
step commits once, a rank killed -9 mid-save leaves the previous step the newest, and
``ckpt_path="last"`` resumes exactly (weights, Adam moments, scheduled lr, loop position).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("lightning")

from ckptstore.engine.catalog import step_name  # noqa: E402
from ckptstore.stores import open_store  # noqa: E402
from tests.plugins.util import assert_equal_tree, committed, run_job, statuses  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))  # the job scripts' folder


def lightning(tmp: str, root: str, steps: int, *extra: str, torchrun: int | None = None):
    argv = [os.path.join(HERE, "lightning_job.py"), "--dir", f"{tmp}/ckpts", "--root", root]
    argv += ["--max-steps", str(steps), "--devices", "2", "--strategy", "ddp"]
    argv += ["--record", f"{tmp}/record.pt", *extra]
    return run_job(argv, torchrun=torchrun, timeout=150)


def manifest(root: str, step: int) -> dict:
    return json.loads(open_store(root).child(step_name(step)).get("ckptstore.manifest.json"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """An uninterrupted 8-step DDP run under Lightning's launcher: (its root, its record)."""
    tmp = str(tmp_path_factory.mktemp("ddp-ref"))
    proc = lightning(tmp, f"{tmp}/root", 8)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return f"{tmp}/root", torch.load(f"{tmp}/record.pt", weights_only=False)


def test_every_rank_writes_its_share_and_the_step_commits_once(reference) -> None:
    root, ref = reference
    assert committed(root) == [8]  # ModelCheckpoint's top-1 (the latest) named only 8
    with open(ref["best_model_path"]) as f:  # rank 0 wrote the names
        assert json.load(f)["step"] == 8
    doc = manifest(root, 8)
    assert doc["world_size"] == 2
    by_file: dict[str, set[str]] = {}
    for r in doc["ranges"]:
        by_file.setdefault(r["file"], set()).add(r["key"].split("@")[0])
    files = sorted(by_file)
    assert [f.split(".")[0] for f in files] == ["__0_0", "__1_0"]
    # DCP spread the replicated model/optimizer tensors over both ranks; the rest of the
    # Lightning dict (loops, callbacks, hyper-parameters) is rank 0's alone.
    for f in files:
        assert any(k.startswith(("t/state_dict/", "t/optimizer_states/")) for k in by_file[f])
    assert "objects" in by_file[files[0]] and "objects" not in by_file[files[1]]
    ckpt = open_store(root).child(step_name(8))
    assert [n for n in ckpt.listdir() if n.startswith("COMMITTED")] == ["COMMITTED"]


def test_rank_killed_mid_save_then_torchrun_resume_is_exact(tmp_path, root_url, reference):
    _, ref = reference
    tmp = str(tmp_path)
    # Run 1: rank 1 is killed -9 right after its shards of the third save (step 6) are
    # durable; rank 0 cannot commit step 6 and the job fails. Step 4 stays the newest.
    proc = lightning(tmp, root_url, 8, "--crash-at", "after_shards:3", "--crash-rank", "1")
    assert proc.returncode != 0, proc.stderr[-4000:]
    st = statuses(root_url)
    assert st[4] == "committed" and st.get(6) != "committed", st
    with open(f"{tmp}/ckpts/last.ckpt") as f:
        assert json.load(f)["follow"] == "newest"
    assert not os.path.exists(f"{tmp}/record.pt")  # the failed run recorded nothing

    # Run 2 under torchrun, from "last": exactly where the reference was at step 4.
    proc = lightning(tmp, root_url, 8, "--ckpt-path", "last", torchrun=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rec = torch.load(f"{tmp}/record.pt", weights_only=False)
    assert rec["start_step"] == 4
    assert_equal_tree(rec["start"], ref["by_step"][4])  # weights, Adam moments, lr
    assert sorted(rec["by_step"]) == [5, 6, 7, 8]  # the loop went on at step 5
    assert_equal_tree(rec["by_step"][8], ref["by_step"][8])
    assert committed(root_url) == [8]  # the torn 6 was redone, then top-1 kept only 8
    names = sorted(n for n in os.listdir(f"{tmp}/ckpts") if n.endswith(".ckpt"))
    assert len(names) == 2 and names[1] == "last.ckpt", names
    with open(f"{tmp}/ckpts/{names[0]}") as f:
        assert json.load(f)["step"] == 8
    assert manifest(root_url, 8)["world_size"] == 2


def test_monitored_top_k_under_ddp_keeps_exactly_the_k_best_steps(tmp_path) -> None:
    """``ModelCheckpoint(monitor="train_loss", save_top_k=2)`` on 2 ranks: the steps left
    committed are the two ModelCheckpoint ranks best plus the newest, which ``save_last``'s
    ``last.ckpt`` follows (the others were removed through the IO)."""
    tmp = str(tmp_path)
    proc = lightning(tmp, f"{tmp}/root", 8, "--top-k", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rec = torch.load(f"{tmp}/record.pt", weights_only=False)
    best = rec["best_k_models"]
    assert len(best) == 2, best
    steps = set()
    for path in best:
        with open(path) as f:  # each kept name is a pointer rank 0 wrote
            steps.add(json.load(f)["step"])
    with open(f"{tmp}/ckpts/last.ckpt") as f:
        assert json.load(f)["follow"] == "newest"
    assert committed(f"{tmp}/root") == sorted(steps | {8}), (best, statuses(f"{tmp}/root"))
