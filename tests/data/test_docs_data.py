"""docs/data.md's complete example runs as written: S3 Parquet, torchrun on 2, resume on 3.

The doc's ```python blocks (each opens with ``# <file name>``) are written to a temporary
directory unchanged; its ```bash block is run line by line there, ``python`` being this
interpreter and ``torchrun`` this torch's launcher, against a real SeaweedFS with the
credentials in the environment the doc says it reads. Then what the doc claims is checked:
384 samples over both runs, each exactly once, in the dataset's global order.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from ckptstore.engine.catalog import list_steps
from ckptstore.stores import open_store

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "data.md")


def blocks(lang: str) -> list[str]:
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


def test_doc_blocks_are_the_ones_this_test_runs() -> None:
    names = [code.splitlines()[0] for code in blocks("python")]
    assert names == ["# make_tokens.py", "# train.py"]
    (bash,) = blocks("bash")
    assert bash.splitlines() == [
        "python make_tokens.py",
        "torchrun --nproc-per-node 2 train.py --steps 12",
        "torchrun --nproc-per-node 3 train.py --steps 20",
    ]


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.distributed
def test_complete_example_resumes_on_another_world_size(tmp_path, seaweedfs) -> None:
    seaweedfs.create_bucket("my-bucket")
    for code in blocks("python"):
        (tmp_path / code.splitlines()[0][2:]).write_text(code)
    opts = seaweedfs.storage_options
    env = dict(
        os.environ,
        PYTHONPATH=REPO,
        AWS_ACCESS_KEY_ID=opts["key"],
        AWS_SECRET_ACCESS_KEY=opts["secret"],
        AWS_ENDPOINT_URL=opts["endpoint_url"],
        CKPTSTORE_CACHE_DIR=str(tmp_path / "cache"),
        OMP_NUM_THREADS="1",
    )
    launch = {
        "python": [sys.executable],
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    }
    for line in blocks("bash")[0].splitlines():
        argv = shlex.split(line)
        proc = subprocess.run(
            launch[argv[0]] + argv[1:],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"

    per_step: dict[int, list[list[int]]] = {}
    for name in os.listdir(tmp_path / "seen"):
        with open(tmp_path / "seen" / name) as f:
            for rec in map(json.loads, f):
                per_step.setdefault(rec["step"], []).append(rec["ids"])
    assert sorted(per_step) == list(range(1, 21))
    assert all(len(per_step[s]) == (2 if s <= 12 else 3) for s in per_step)  # ranks per step
    ids = [i for s in sorted(per_step) for batch in per_step[s] for i in batch]
    assert len(ids) == 384 and len(set(ids)) == 384  # each sample exactly once

    from ckptstore.data import ShardedDataset

    s3 = {k: opts[k] for k in ("key", "secret", "endpoint_url")}
    ds = ShardedDataset(
        "s3://my-bucket/tokens/", storage_options=s3, cache_dir=str(tmp_path / "cache"), seed=17
    )
    assert set(ids) == set(ds.order.sample_ids(range(384)).tolist())  # the global order
    ds.close()
    steps = list_steps(open_store("s3://my-bucket/runs/tokens", s3))
    assert [e.step for e in steps if e.status == "committed"] == [12, 18]  # KeepLast(2)
