"""``FolderCheckpoints.save`` on 2 gloo ranks: the folder may change once ``save`` returns.

A framework goes on with its folder when the hook returns: Accelerate rewrites its custom
states (``custom_checkpoint_<i>.pkl``) right after ``CkptStoreAccelerate``'s hook, on the
main process only. ``save`` maps each file a rank uploads (no copy until staging), and a
mapped file truncated under a rank still copying it kills that rank with SIGBUS, which no
handler turns into an error: so no rank may return before every rank has copied its share.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from ckptstore_hf._folder import FolderCheckpoints  # noqa: E402
from harness.dist import run_distributed  # noqa: E402

pytestmark = pytest.mark.distributed

BIG = 96 << 20  # rank 1's file: its staging copy is still running when rank 0 returns


def _pattern(n: int, seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).numpy().tobytes()


def _save_then_rewrite(rank: int, world_size: int, tmp: str) -> bool:
    # Node-local disks: each rank's folder holds its own file, which only that rank uploads.
    folders = [os.path.join(tmp, f"node{r}", "step_1") for r in range(world_size)]
    files = [("small.bin", b"rank 0's own"), ("big.bin", _pattern(BIG, 1))]
    os.makedirs(folders[rank])
    with open(os.path.join(folders[rank], files[rank][0]), "wb") as f:
        f.write(files[rank][1])
    fc = FolderCheckpoints(os.path.join(tmp, "root"))
    fc.save(1, folders[rank])
    if rank == 0:  # the framework goes on with the folder (Accelerate: a file rewritten)
        path = os.path.join(folders[1], "big.bin")
        os.truncate(path, 0)
        with open(path, "r+b") as f:
            f.write(files[1][1])
    fc.wait()
    back = os.path.join(tmp, f"back{rank}")
    fc.ensure_local(1, back)
    fc.close()
    return all(_read(os.path.join(back, name)) == data for name, data in files)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_rank_returns_from_save_only_once_every_rank_copied_its_share(tmp_path) -> None:
    assert run_distributed(_save_then_rewrite, 2, str(tmp_path)) == [True, True]
